"""Runs the attention forward once per case for a profiler (ncu) to capture.

python3 tools/profiling/profile_fwd.py --lib build/libfdma.so [--seqlen 8192] [--headdim 128] [--keys 2176]
Cases: dense, per-key bias [B,H,1,Sk]; B1 H16 bf16, non-causal; each launched twice (warm-up,
then the one to read). --keys: Sk keys when not S (short rows, as the dynamic-mask forward's
query tiles walk about w + 128 listed keys).
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))  # bench_attention.py
from flash_dma import _abi  # noqa: E402
from bench_attention import view  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--keys", type=int, default=0)
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    B, H, D, S = 1, 16, args.headdim, args.seqlen
    Sk = args.keys or S
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.randn(B, H, 1, Sk, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    for b in (None, bias):
        p = _abi.AttentionParams()
        p.q, p.k, p.v, p.out, p.bias = view(q), view(k), view(v), view(out), view(b)
        for _ in range(2):
            assert lib.fdma_attention_fwd(ctypes.byref(p)) == 0, lib.fdma_last_error()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
