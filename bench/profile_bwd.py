"""One dense attention forward + backward through the Python package, twice (warm-up, then the
one to read), for a profiler:
`FDMA_LIBRARY=build/libfdma.so ncu --kernel-name regex:attention_bwd --launch-skip 2 --launch-count 2
 --metrics gpu__time_duration.sum,smsp__inst_executed.sum python3 bench/profile_bwd.py --seqlen 8192`
bf16, B1 H16 D128."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import flash_dma  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", type=int, default=0)
    args = ap.parse_args()
    q, k, v = (torch.randn(1, args.seqlen, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for _ in range(2):
        flash_dma.attention(q, k, v, is_causal=bool(args.causal)).backward(torch.ones_like(q))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
