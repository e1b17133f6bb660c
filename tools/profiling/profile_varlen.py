"""One packed-batch dynamic_mask_attention forward + backward (H16 Hk4 D128 w2048, bf16,
causal) through the Python API, for a profiler:
`ncu --kernel-name regex:attention --launch-skip 3 --launch-count 3 python3 tools/profiling/profile_varlen.py --seqs 1000 --len 128`
(one warm-up step first, so the profiled launches are a second step's)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import flash_dma  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=1000)
    ap.add_argument("--len", type=int, default=128)
    args = ap.parse_args()
    lens = [args.len] * args.seqs
    total = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(total, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    s = torch.randn(4, total, device="cuda", generator=g).requires_grad_()
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    for _ in range(2):
        out = flash_dma.dynamic_mask_attention_varlen(q, k, v, s, cu, cu, args.len, args.len, 2048)
        torch.autograd.grad(out, (q, k, v, s), torch.ones_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
