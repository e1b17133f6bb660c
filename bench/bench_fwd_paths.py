"""Forward and forward+backward times of the attention kernels through the Python API, for A/B
runs of the kernel paths (FDMA_DISABLE_WGMMA=1 forces the sm80 mma.sync kernels on Hopper),
with SDPA flash beside them.

Usage: [FDMA_DISABLE_WGMMA=1] python3 bench/bench_fwd_paths.py [--seqlens 16384] [--dma-seqlens 16384,32768]
bf16, B1 H16 D128 (Hk16 for attention; Hk4, w2048 for the dynamic mask). Medians of CUDA-event
timings after warm-up. TF/s: 4*B*H*Sq*Sk*D / t forward, 3.5x that forward+backward, halved for
causal; for the dynamic mask, kept pairs only (Sk -> w).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms  # noqa: E402
import flash_dma  # noqa: E402


def timed(rows, problem, system, fn, flops, inputs):
    """Forward time, then forward+backward time (gradients of `inputs`)."""
    with torch.no_grad():
        fwd = median_ms(fn)
    out = fn()
    grad = torch.randn_like(out)

    def fwd_bwd():
        for x in inputs:
            x.grad = None
        fn().backward(grad)

    rows.append((problem, system, fwd, median_ms(fwd_bwd, warmup=2, iters=7), flops))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384")
    ap.add_argument("--dma-seqlens", default="16384,32768")
    ap.add_argument("--headdim", type=int, default=128)
    args = ap.parse_args()
    path = "sm80 (mma.sync)" if os.environ.get("FDMA_DISABLE_WGMMA") == "1" else "default"
    dev, B, H, D = torch.device("cuda"), 1, 16, args.headdim
    rows = []
    for S in [int(s) for s in args.seqlens.split(",") if s]:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        key_bias = torch.randn(B, H, 1, S, device=dev, dtype=torch.bfloat16, requires_grad=True)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        for causal in (False, True):
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            problem = f"attention S{S} causal={int(causal)}"

            def sdpa_flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            with torch.no_grad():
                err = (flash_dma.attention(q, k, v, is_causal=causal).float() -
                       sdpa_flash().transpose(1, 2).float()).abs().max().item()
            timed(rows, problem, "SDPA flash", sdpa_flash, flops, (qt, kt, vt))
            timed(rows, problem, f"flash-dma dense (|diff| {err:.2g})",
                  lambda: flash_dma.attention(q, k, v, is_causal=causal), flops, (q, k, v))
            timed(rows, problem, "flash-dma per-key bias",
                  lambda: flash_dma.attention(q, k, v, attn_bias=key_bias, is_causal=causal), flops,
                  (q, k, v, key_bias))
    Hk, w = 4, 2048
    for S in [int(s) for s in args.dma_seqlens.split(",") if s]:
        torch.manual_seed(0)
        q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        scores = torch.randn(B, Hk, S, device=dev, dtype=torch.float32, requires_grad=True)
        for causal in (True, False):
            timed(rows, f"dynamic mask S{S} w{w} causal={int(causal)}", "flash-dma",
                  lambda: flash_dma.dynamic_mask_attention(q, k, v, scores, w, is_causal=causal),
                  4 * B * H * S * w * D, (q, k, v, scores))
    print(f"\n{torch.cuda.get_device_name()}, bf16, D{D}, path: {path}")
    print("| problem | system | fwd ms | fwd TF/s | fwd+bwd ms | fwd+bwd TF/s |")
    print("|---|---|---|---|---|---|")
    for problem, system, fwd, both, flops in rows:
        print(f"| {problem} | {system} | {fwd:.3f} | {flops / fwd / 1e9:.0f} | {both:.2f} | "
              f"{3.5 * flops / both / 1e9:.0f} |")


if __name__ == "__main__":
    main()
