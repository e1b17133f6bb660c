"""One causal dynamic_mask_attention forward + backward (B1 H16 Hk4 D128 w2048 unless told,
bf16), for a profiler: `ncu --print-summary per-kernel python3 tools/profiling/profile_dma.py
--seqlen 16384`; the seed config: `--heads 2 --kv-heads 1 --headdim 64 --window 1024 --seqlen 32768`."""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))  # dma_problem.py
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from bench_attention import view  # noqa: E402
from dma_problem import attach_workspace, dma_problem  # noqa: E402
from flash_dma import _abi  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--forward-only", action="store_true")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev, S, B, Hk = torch.device("cuda"), args.seqlen, 1, args.kv_heads
    prob = dma_problem(S, causal=args.causal, B=B, H=args.heads, Hk=Hk, D=args.headdim, w=args.window)
    p = prob.params
    keep = torch.empty(2, B, Hk, S, device=dev, dtype=torch.int32)  # the forward's selection, for the backward
    p.keep_begin, p.keep_end = view(keep[0]), view(keep[1])
    ws = attach_workspace([(lib, p)])
    assert lib.fdma_dma_fwd(ctypes.byref(p)) == 0, lib.fdma_last_error()
    if not args.forward_only:
        assert lib.fdma_dma_bwd(ctypes.byref(p)) == 0, lib.fdma_last_error()
    torch.cuda.synchronize()
    del ws


if __name__ == "__main__":
    main()
