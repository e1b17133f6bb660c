"""Attention forward+backward on the GPU: Flash-DMA against SDPA's backends in one run.

Usage (on a GPU machine with torch): python3 bench/bench_attention_bwd.py [--lib build/libfdma.so]
Times one forward plus one backward (dq, dk, dv and, with a bias, dbias), beside SDPA and
FlexAttention (compiled; the bias as a captured tensor with a gradient), for the cases in CASES
(--cases picks them by prefix). Medians of CUDA
events after warm-up. TF/s = 3.5 * 4*B*H*Sq*Sk*D / t (bwd = 2.5x fwd), halved for causal.
Prints a markdown table last.
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import flex_time, median_ms, view  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flash_dma import _abi  # noqa: E402


CASES = ("dense", "per-key bias [B,H,1,Sk]", "4-D bias [B,H,Sq,Sk]", "block mask 1/8 [B,1,Sq,Sk]",
         "block mask all active [B,1,Sq,Sk]",
         "softcap 30 (SDPA has none: no baseline, no diff)")


def call(lib, fn, p):
    if fn(ctypes.byref(p)) != 0:
        raise RuntimeError(lib.fdma_last_error().decode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="4096,8192,16384")
    ap.add_argument("--flex", type=int, default=1, help="also time FlexAttention forward+backward")
    ap.add_argument("--cases", default="dense,per-key",
                    help="comma-separated case name prefixes, of: " + ", ".join(CASES))
    ap.add_argument("--causal", default="0,1", help="comma-separated 0/1")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev = torch.device("cuda")
    B, H, Hk, D = 1, 16, 16, 128
    rows = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        for causal in (c == "1" for c in args.causal.split(",")):
            for case in (c for c in CASES if any(c.startswith(w) for w in args.cases.split(","))):
                torch.manual_seed(0)
                q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16)
                v = torch.randn(B, S, Hk, D, device=dev, dtype=torch.bfloat16)
                bias = mask = None
                if case.startswith("per-key"):
                    bias = torch.randn(B, H, 1, S, device=dev, dtype=torch.bfloat16)
                elif case.startswith("4-D"):
                    bias = torch.randn(B, H, S, S, device=dev, dtype=torch.bfloat16)
                elif case.startswith("block"):  # 128 x 128 blocks, as bench_attention.py
                    # "all active": the same mask path with every tile kept (the time a sparse mask is measured against)
                    share = 1.0 if "all active" in case else 1 / 8
                    blocks = torch.rand(B, 1, S // 128, S // 128, device=dev) < share
                    mask = blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)
                out, dout = torch.empty_like(q), torch.randn_like(q)
                lse = torch.empty(B, H, S, device=dev, dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                dbias = torch.empty_like(bias) if bias is not None else None
                p = _abi.AttentionParams()
                p.q, p.k, p.v, p.out, p.lse = view(q), view(k), view(v), view(out), view(lse)
                p.dout, p.dq, p.dk, p.dv = view(dout), view(dq), view(dk), view(dv)
                p.bias, p.dbias, p.mask = view(bias), view(dbias), view(mask)
                p.causal = int(causal)
                p.softcap = 30.0 if case.startswith("softcap") else 0.0
                p.stream = torch.cuda.current_stream().cuda_stream
                sizes = []
                for ps in (_abi.PASS_FORWARD, _abi.PASS_BACKWARD):
                    n = ctypes.c_size_t(0)
                    if lib.fdma_attention_workspace_size(ctypes.byref(p), ps, ctypes.byref(n)) != 0:
                        raise RuntimeError(lib.fdma_last_error().decode())
                    sizes.append(n.value)
                ws = torch.empty(max(1, *sizes), device=dev, dtype=torch.uint8)
                p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()

                def ours_fwd():
                    call(lib, lib.fdma_attention_fwd, p)

                def ours():
                    call(lib, lib.fdma_attention_fwd, p)
                    call(lib, lib.fdma_attention_bwd, p)

                qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
                bt = None
                if bias is not None:
                    bt = bias.detach().clone()
                    if causal:
                        tri = torch.ones(S, S, device=dev, dtype=torch.bool).tril()
                        bt = bt.masked_fill(~tri, float("-inf"))
                    bt.requires_grad_()
                elif mask is not None:  # SDPA takes the mask as a bool attn_mask (no gradient)
                    bt = mask & torch.ones(S, S, device=dev, dtype=torch.bool).tril() if causal else mask
                dot = dout.transpose(1, 2)

                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            if bt is None:
                                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            else:
                                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bt)
                        o.backward(dot)
                    return run

                ours()
                if p.softcap:  # timed alone: the GPU tests check softcap against the CPU backend
                    t = {"flash-dma fwd": median_ms(ours_fwd), "flash-dma": median_ms(ours)}
                    rows.append((S, causal, case, t, 3.5 * 4 * B * H * S * S * D / (2 if causal else 1), None))
                    print(S, causal, case, {k_: round(x, 3) for k_, x in t.items()}, flush=True)
                    continue
                sdpa(SDPBackend.FLASH_ATTENTION if bt is None else SDPBackend.EFFICIENT_ATTENTION)()
                # rows a block mask hides entirely: SDPA's gradients are NaN there, ours 0
                errs = [(dq.transpose(1, 2).float() - qt.grad.float().nan_to_num()).abs().max().item(),
                        (dk.transpose(1, 2).float() - kt.grad.float().nan_to_num()).abs().max().item(),
                        (dv.transpose(1, 2).float() - vt.grad.float().nan_to_num()).abs().max().item()]
                if bias is not None:
                    # a per-key bias was widened by the causal -inf: fold its gradient back over queries
                    g = bt.grad.sum(2, keepdim=True) if bias.shape[2] == 1 and bt.grad.shape[2] != 1 else bt.grad
                    # per head: a 4-D bias's gradient in fp32 at once may not fit beside everything else
                    errs.append(max((dbias[:, i].float() - g[:, i].float()).abs().max().item() for i in range(H)))
                mult = 3.5 * 4 * B * H * S * S * D / (2 if causal else 1)
                t = {"flash-dma fwd": median_ms(ours_fwd), "flash-dma": median_ms(ours)}
                cands = ([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION] if bt is None
                         else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION])
                for be in cands:
                    try:
                        t[be.name.lower()] = median_ms(sdpa(be))
                    except RuntimeError as e:
                        t[be.name.lower()] = None
                        print(f"  {be.name} unavailable: {str(e).splitlines()[0][:100]}")
                if args.flex:  # the bias as a captured tensor with a gradient; causal through the block mask
                    fb = bias.detach().clone().requires_grad_() if bias is not None else None
                    t["flex"] = flex_time(qt, kt, vt, causal, fb, mask, S, dout=dot)
                rows.append((S, causal, case, t, mult, max(errs)))
                print(S, causal, case, {k_: (round(x, 3) if x else None) for k_, x in t.items()},
                      f"max|grad diff| {max(errs):.3g}", flush=True)
    print(f"\n{torch.cuda.get_device_name()}, bf16, B{B} H{H} Hk{Hk} D{D}; fwd+bwd ms (TF/s)")
    print("| S | causal | case | flash-dma fwd+bwd | (fwd alone) | SDPA flash / efficient | SDPA cuDNN | FlexAttention | "
          "max abs grad diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for S, causal, case, t, mult, err in rows:
        def cell(x):
            return "-" if x is None else f"{x:.2f} ({mult / x / 1e9:.0f})"
        other = t.get("flash_attention", t.get("efficient_attention"))
        print(f"| {S} | {int(causal)} | {case} | {cell(t['flash-dma'])} | {t['flash-dma fwd']:.2f} | {cell(other)} | "
              f"{cell(t.get('cudnn_attention'))} | {cell(t.get('flex'))} | {'-' if err is None else f'{err:.3g}'} |")


if __name__ == "__main__":
    main()
