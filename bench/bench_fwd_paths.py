"""Forward times of the attention kernels through the Python API, for A/B runs of the kernel
paths (FDMA_DISABLE_WGMMA=1 forces the sm80 mma.sync path on Hopper) and SDPA flash beside them.

Usage: [FDMA_DISABLE_WGMMA=1] python3 bench/bench_fwd_paths.py [--seqlens 16384] [--dma-seqlens 16384,32768]
bf16, B1 H16 D128 (Hk16 for attention, Hk4 w2048 for dynamic mask). Medians of CUDA-event
timings after warm-up; TF/s = 4*B*H*Sq*Sk*D / t, halved for causal (attention rows).
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384")
    ap.add_argument("--dma-seqlens", default="16384,32768")
    ap.add_argument("--headdim", type=int, default=128)
    args = ap.parse_args()
    path = "sm80 (mma.sync)" if os.environ.get("FDMA_DISABLE_WGMMA") == "1" else "default"
    dev, B, H, D = torch.device("cuda"), 1, 16, args.headdim
    rows = []
    with torch.no_grad():
        for S in [int(s) for s in args.seqlens.split(",")]:
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
            key_bias = torch.randn(B, H, 1, S, device=dev, dtype=torch.bfloat16)
            blocks = torch.rand(B, 1, S // 128, S // 128, device=dev) < 1 / 8
            block_mask = blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)
            for causal in (False, True):
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                cases = {
                    "dense": lambda: flash_dma.attention(q, k, v, is_causal=causal),
                    "per-key bias": lambda: flash_dma.attention(q, k, v, attn_bias=key_bias, is_causal=causal),
                    "block mask 1/8": lambda: flash_dma.attention(q, k, v, attn_mask=block_mask, is_causal=causal),
                }
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def sdpa_flash():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                ref = sdpa_flash().transpose(1, 2).float()
                err = (cases["dense"]().float() - ref).abs().max().item()
                rows.append((f"attention S{S} causal={int(causal)}", "SDPA flash", median_ms(sdpa_flash), flops))
                for name, fn in cases.items():
                    rows.append((f"attention S{S} causal={int(causal)}", f"{name} (|diff| {err:.2g})" if name == "dense"
                                 else name, median_ms(fn), flops))
                del ref
        Hk, w = 4, 2048
        for S in [int(s) for s in args.dma_seqlens.split(",") if s]:
            torch.manual_seed(0)
            q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
            scores = torch.randn(B, Hk, S, device=dev, dtype=torch.float32)
            for causal in (True, False):
                useful = 4 * B * H * S * w * D
                fn = lambda: flash_dma.dynamic_mask_attention(q, k, v, scores, w, is_causal=causal)
                rows.append((f"dynamic mask S{S} w{w} causal={int(causal)}", "flash-dma", median_ms(fn), useful))
    print(f"\n{torch.cuda.get_device_name()}, bf16, D{D}, path: {path}")
    print("| problem | system | ms | TF/s (useful for dynamic mask) |")
    print("|---|---|---|---|")
    for problem, system, ms, flops in rows:
        print(f"| {problem} | {system} | {ms:.3f} | {flops / ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
