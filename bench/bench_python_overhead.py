"""Host overhead of one flash_dma call from Python, against SDPA on the same tiny problem
(where the GPU work is negligible, so the time per call is the host path).

Usage: FDMA_LIBRARY=build/libfdma.so python3 bench/bench_python_overhead.py
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import flash_dma  # noqa: E402
from flash_dma import _ops  # noqa: E402


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    dev = torch.device("cuda")
    q = torch.randn(1, 128, 4, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 128, 2, 64, device=dev, dtype=torch.bfloat16)
    scores = torch.randn(1, 2, 128, device=dev)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1)
    rows = [
        ("flash_dma.attention (fwd)", lambda: flash_dma.attention(q, k, k, is_causal=True)),
        ("flash_dma.dynamic_mask_attention (fwd)", lambda: flash_dma.dynamic_mask_attention(q, k, k, scores, 32)),
        ("torch.ops.flash_dma.attention_fwd (op only)",
         lambda: torch.ops.flash_dma.attention_fwd(q, k, k, None, None, True, 0.0, 0.0, False)),
        ("the op's implementation alone (no dispatch)",
         lambda: _ops.attention_fwd._init_fn(q, k, k, None, None, True, 0.0, 0.0, False)),
        ("SDPA (fwd)", lambda: F.scaled_dot_product_attention(qt, kt, kt, is_causal=True)),
    ]
    with torch.no_grad():
        print("| call | us per call (two runs) |\n|---|---|")
        for name, fn in rows:
            print(f"| {name} | {per_call_us(fn):.1f} / {per_call_us(fn):.1f} |")


if __name__ == "__main__":
    main()
