"""Attention forward on the GPU: Flash-DMA against SDPA's backends in one run.

Usage (on a GPU machine with torch): python3 bench/bench_attention.py [--lib build/libfdma.so]
Medians of CUDA-event timings after warm-up. TF/s = 4*B*H*Sq*Sk*D / t, halved for causal.
Prints a markdown table last.
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flash_dma import _abi  # noqa: E402

DTYPE_CODE = {torch.bfloat16: _abi.BFLOAT16, torch.float16: _abi.FLOAT16, torch.float32: _abi.FLOAT32,
              torch.bool: _abi.BOOL, torch.int32: _abi.INT32}


def view(t):
    v = _abi.Tensor()
    if t is None:
        return v
    v.data = t.data_ptr()
    v.dtype = DTYPE_CODE[t.dtype]
    v.ndim = t.dim()
    for d in range(t.dim()):
        v.shape[d] = t.shape[d]
        v.stride[d] = t.stride(d)
    return v


def median_ms(fn, warmup=3, iters=15):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


_flex = None


def flex_time(qt, kt, vt, causal, bias, bool_mask, S, dout=None):
    """FlexAttention (compiled) for the same case: bias through score_mod, the mask through a
    block mask built from mask_mod (build time not counted). With `dout`, forward+backward
    (gradients of whichever inputs require them). None where it fails."""
    global _flex
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if _flex is None:
            _flex = torch.compile(flex_attention)

        def mask_mod(b, h, q_idx, kv_idx):
            keep = bool_mask[b, 0, q_idx, kv_idx] if bool_mask is not None else (q_idx >= 0)
            return keep & (kv_idx <= q_idx) if causal else keep

        block_mask = None
        if causal or bool_mask is not None:
            block_mask = create_block_mask(mask_mod, 1, 1, S, S, device=qt.device, _compile=True)
        score_mod = None
        if bias is not None:
            if bias.shape[2] == 1:
                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + bias[b, h, 0, kv_idx]
            else:
                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + bias[b, h, q_idx, kv_idx]
        if dout is None:
            return median_ms(lambda: _flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask))
        return median_ms(lambda: _flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask).backward(dout))
    except Exception as e:  # noqa: BLE001
        print("  FlexAttention failed:", str(e).splitlines()[0][:120], flush=True)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="4096,8192,16384")
    ap.add_argument("--flex", type=int, default=1, help="also time FlexAttention (compiles per case)")
    ap.add_argument("--cases", default="", help="comma-separated case name prefixes (default: all)")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev = torch.device("cuda")
    B, H, Hk, D = 1, 16, 16, 128
    wanted = [c for c in args.cases.split(",") if c]
    rows = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        for causal in (False, True):
            for case in ("dense", "per-key bias [B,H,1,Sk]", "full bias [B,H,Sq,Sk]", "all-true mask [B,1,Sq,Sk]",
                         "block mask 1/8 [B,1,Sq,Sk]"):
                if case.startswith("full") and S > 8192:
                    continue
                if wanted and not any(case.startswith(c) for c in wanted):
                    continue
                torch.manual_seed(0)
                q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16)
                v = torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16)
                bias = None
                if case.startswith("per-key"):
                    bias = torch.randn(B, H, 1, S, device=dev, dtype=torch.bfloat16)
                elif case.startswith("full"):
                    bias = torch.randn(B, H, S, S, device=dev, dtype=torch.bfloat16)
                bool_mask = None
                if case.startswith("all-true"):
                    bool_mask = torch.ones(B, 1, S, S, device=dev, dtype=torch.bool)
                elif case.startswith("block"):
                    blocks = torch.rand(B, 1, S // 128, S // 128, device=dev) < 1 / 8
                    bool_mask = blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)
                out = torch.empty_like(q)
                lse = torch.empty(B, H, S, device=dev, dtype=torch.float32)
                p = _abi.AttentionParams()
                p.q, p.k, p.v, p.out, p.lse = view(q), view(k), view(v), view(out), view(lse)
                p.bias = view(bias)
                p.mask = view(bool_mask)
                p.causal = int(causal)
                p.stream = torch.cuda.current_stream().cuda_stream
                ws_bytes = ctypes.c_size_t(0)
                if lib.fdma_attention_workspace_size(ctypes.byref(p), _abi.PASS_FORWARD, ctypes.byref(ws_bytes)) != 0:
                    raise RuntimeError(lib.fdma_last_error().decode())
                ws = torch.empty(max(1, ws_bytes.value), device=dev, dtype=torch.uint8)
                p.workspace, p.workspace_bytes = ws.data_ptr(), ws_bytes.value

                def ours():
                    st = lib.fdma_attention_fwd(ctypes.byref(p))
                    if st != 0:
                        raise RuntimeError(lib.fdma_last_error().decode())

                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                mask = None
                if bool_mask is not None:
                    mask = bool_mask
                    if causal:
                        mask = mask & torch.ones(S, S, device=dev, dtype=torch.bool).tril()
                if bias is not None:
                    mask = bias
                    if causal:
                        tri = torch.ones(S, S, device=dev, dtype=torch.bool).tril()
                        mask = bias.masked_fill(~tri, float("-inf"))

                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            if mask is None:
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
                    return run

                ours()
                ref = sdpa(SDPBackend.EFFICIENT_ATTENTION if mask is not None else SDPBackend.FLASH_ATTENTION)()
                diff = out.transpose(1, 2).float() - ref.float()
                if bool_mask is not None:  # SDPA gives NaN for rows with nothing kept; we give 0
                    diff = diff[~ref.float().isnan()]
                err = diff.abs().max().item()
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                t = {"flash-dma": median_ms(ours)}
                candidates = ([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION] if mask is None
                              else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION])
                for be in candidates:
                    try:
                        t[be.name.lower()] = median_ms(sdpa(be))
                    except RuntimeError as e:
                        t[be.name.lower()] = None
                        print(f"  {be.name} unavailable: {str(e).splitlines()[0][:100]}")
                t["flex"] = flex_time(qt, kt, vt, causal, bias, bool_mask, S) if args.flex else None
                rows.append((S, causal, case, t, flops, err))
                print(S, causal, case, {k: (round(x, 3) if x else None) for k, x in t.items()}, f"max|diff| {err:.3g}",
                      flush=True)
    print(f"\n{torch.cuda.get_device_name()}, bf16, B{B} H{H} Hk{Hk} D{D}; ms (TF/s)")
    print("| S | causal | case | flash-dma | SDPA flash / efficient | SDPA cuDNN | FlexAttention | max abs diff vs SDPA |")
    print("|---|---|---|---|---|---|---|---|")
    for S, causal, case, t, flops, err in rows:
        def cell(x):
            return "-" if x is None else f"{x:.3f} ({flops / x / 1e9:.0f})"
        other = t.get("flash_attention", t.get("efficient_attention"))
        print(f"| {S} | {int(causal)} | {case} | {cell(t['flash-dma'])} | {cell(other)} | "
              f"{cell(t.get('cudnn_attention'))} | {cell(t.get('flex'))} | {err:.3g} |")


if __name__ == "__main__":
    main()
