"""The per-query top-w 4-D mask case (the original flash-dmattn way), through the Python package, in one run:
`flash_dma.attention` fed the selection as a dense [B, Hk, S, S] mask plus the scores as a
per-key bias, `flash_dma.dynamic_mask_attention` (same selection, no S x S anything), SDPA
efficient with the same mask folded into a dense bias, and FlexAttention with a mask_mod
reading the mask and a score_mod adding the scores.

Usage: FDMA_LIBRARY=build/libfdma.so python3 bench/bench_topw_mask.py [--seqlen 16384]
bf16, B1 H16 Hk4 D128 w2048, causal. ms forward / forward+backward (gradients to q, k, v and
the scores/bias). Medians of CUDA events.
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


def timed(name, make, dout, t):
    """make() -> (output, inputs needing grads); times forward and forward+backward."""
    try:
        with torch.no_grad():
            t[name + " fwd"] = median_ms(lambda: make(), warmup=2, iters=7)

        def fb():
            out = make()
            out.backward(dout)
        t[name + " fwd+bwd"] = median_ms(fb, warmup=2, iters=7)
    except (RuntimeError, torch.OutOfMemoryError, ValueError) as e:
        print(f"  {name}: {str(e).splitlines()[0][:140]}", flush=True)
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--ours-only", action="store_true", help="skip SDPA and FlexAttention")
    args = ap.parse_args()
    dev, S, B, H, Hk, D, w = torch.device("cuda"), args.seqlen, 1, 16, 4, 128, 2048
    G = H // Hk
    torch.manual_seed(0)
    q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    scores = torch.randn(B, Hk, S, device=dev, dtype=torch.float32, requires_grad=True)
    dout = torch.randn_like(q)
    kept = flash_dma.select_keys(scores.detach(), w, is_causal=True).kept(S)  # [B, Hk, S, S] bool
    bias = scores.detach().to(torch.bfloat16).unsqueeze(2).requires_grad_()  # [B, Hk, 1, S]
    t = {}
    timed("flash-dma attention + 4-D mask",
          lambda: flash_dma.attention(q, k, v, attn_mask=kept, attn_bias=bias, is_causal=True), dout, t)
    timed("flash-dma dynamic_mask_attention", lambda: flash_dma.dynamic_mask_attention(q, k, v, scores, w), dout, t)

    qt = q.detach().transpose(1, 2).requires_grad_()
    kt, vt = (x.detach().transpose(1, 2).repeat_interleave(G, 1).requires_grad_() for x in (k, v))
    dot = dout.transpose(1, 2)
    if args.ours_only:
        report(B, H, Hk, S, D, w, t)
        return
    try:
        dense = torch.where(kept, scores.detach().unsqueeze(2), float("-inf")).to(torch.bfloat16)
        dense = dense.repeat_interleave(G, 1).requires_grad_()  # [B, H, S, S]

        def sdpa():
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense)
        timed("SDPA efficient + dense bias", sdpa, dot, t)
        del dense
    except torch.OutOfMemoryError:
        print("  SDPA + dense bias: out of memory")
    torch.cuda.empty_cache()
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        s_det = scores.detach()

        def mask_mod(b, h, q_idx, kv_idx):
            return kept[b, h // G, q_idx, kv_idx]

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + s_det[b, h // G, kv_idx]

        block_mask = create_block_mask(mask_mod, B, H, S, S, device=dev, _compile=True)
        flex = torch.compile(flex_attention)
        kf, vf = (x.detach().transpose(1, 2).requires_grad_() for x in (k, v))
        timed("FlexAttention", lambda: flex(qt, kf, vf, score_mod=score_mod, block_mask=block_mask, enable_gqa=True),
              dot, t)
    except Exception as e:  # noqa: BLE001
        print("  FlexAttention failed:", str(e).splitlines()[0][:140])
    report(B, H, Hk, S, D, w, t)


def report(B, H, Hk, S, D, w, t):
    print(f"\n{torch.cuda.get_device_name()}, bf16, B{B} H{H} Hk{Hk} S{S} D{D} w{w}, causal top-w; ms")
    print("| system | forward | forward+backward |\n|---|---|---|")
    for name in ("flash-dma attention + 4-D mask", "flash-dma dynamic_mask_attention", "SDPA efficient + dense bias",
                 "FlexAttention"):
        a, b = t.get(name + " fwd"), t.get(name + " fwd+bwd")
        print(f"| {name} | {a:.2f} | {b:.2f} |" if a and b else f"| {name} | {a or '-'} | {b or '-'} |")


if __name__ == "__main__":
    main()
