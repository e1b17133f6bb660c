"""One attention forward + backward through the Python package, twice (warm-up, then the one
to read), for a profiler:
`FDMA_LIBRARY=build/libfdma.so ncu --kernel-name regex:attention_bwd --launch-skip 2 --launch-count 2
 --metrics gpu__time_duration.sum,smsp__inst_executed.sum python3 tools/profiling/profile_bwd.py --seqlen 8192`
bf16, D128 (--headdim 64 or 256 for the others). Cases: dense (B1 H16); per-key (a [B, H, 1, S] bias with its gradient); topw (the
top-w 4-D mask case of bench_topw_mask.py: B1 H16 Hk4 w2048 causal, the selection as a
[B, Hk, S, S] mask and the scores as a [B, Hk, 1, S] bias)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import flash_dma  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--case", default="dense", choices=("dense", "per-key", "topw"))
    args = ap.parse_args()
    S, H, Hk = args.seqlen, 16, 4 if args.case == "topw" else 16
    D = args.headdim
    q = torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, S, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    kw = {"is_causal": bool(args.causal)}
    if args.case == "per-key":
        kw["attn_bias"] = torch.randn(1, H, 1, S, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    elif args.case == "topw":
        scores = torch.randn(1, Hk, S, device="cuda")
        kw = {"is_causal": True, "attn_mask": flash_dma.select_keys(scores, 2048, is_causal=True).kept(S),
              "attn_bias": scores.to(torch.bfloat16).unsqueeze(2).requires_grad_()}
    for _ in range(2):
        flash_dma.attention(q, k, v, **kw).backward(torch.ones_like(q))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
