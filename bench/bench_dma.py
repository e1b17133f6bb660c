"""dynamic_mask_attention on the GPU (non-causal), forward and forward+backward, against the
floor and dense SDPA.

Usage: python3 bench/bench_dma.py [--lib build/libfdma.so] [--seqlens 8192,16384,32768]
bf16, B1 H16 Hk4 D128 w2048. Floor = SDPA flash over exactly w keys per query (what any
top-w method must at least do). Useful TF/s counts kept pairs only: 4*B*H*Sq*min(w,Sk)*D / t,
3.5x that for forward+backward. Ours keeps the forward's selection for the backward
(keep_begin/keep_end), as the Python autograd path does.
Medians of CUDA-event timings after warm-up; a markdown table last.
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms, view  # noqa: E402
from dma_problem import attach_workspace, dma_problem  # noqa: E402
from flash_dma import _abi  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="8192,16384,32768")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev = torch.device("cuda")
    B, H, Hk, D, w = 1, 16, 4, 128, 2048
    rows = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        prob = dma_problem(S, causal=0, B=B, H=H, Hk=Hk, D=D, w=w)
        q, k, v, scores, out, p = prob.q, prob.k, prob.v, prob.scores, prob.out, prob.params
        kept_sel = torch.empty(2, B, Hk, S, device=dev, dtype=torch.int32)
        p.keep_begin, p.keep_end = view(kept_sel[0]), view(kept_sel[1])
        nbytes = ctypes.c_size_t(0)
        assert lib.fdma_dma_workspace_size(ctypes.byref(p), 0, ctypes.byref(nbytes)) == 0, lib.fdma_last_error()
        ws = attach_workspace([(lib, p)])

        def ours():
            assert lib.fdma_dma_fwd(ctypes.byref(p)) == 0, lib.fdma_last_error().decode()

        def ours_fwdbwd():
            ours()
            assert lib.fdma_dma_bwd(ctypes.byref(p)) == 0, lib.fdma_last_error().decode()

        # The selection alone, through the public select op.
        begin = torch.empty(B, Hk, S, device=dev, dtype=torch.int32)
        end = torch.empty_like(begin)
        sp = _abi.SelectParams()
        sp.key_scores, sp.keep_begin, sp.keep_end = view(scores), view(begin), view(end)
        sp.num_queries, sp.window, sp.causal = S, w, 0
        sp.stream = p.stream
        sbytes = ctypes.c_size_t(0)
        assert lib.fdma_select_workspace_size(ctypes.byref(sp), ctypes.byref(sbytes)) == 0
        sws = torch.empty(sbytes.value, device=dev, dtype=torch.uint8)
        sp.workspace, sp.workspace_bytes = sws.data_ptr(), sbytes.value

        def select():
            assert lib.fdma_select(ctypes.byref(sp)) == 0

        # Causal selection (the wavelet-matrix intervals), timed alone as well.
        cp = _abi.SelectParams()
        ctypes.pointer(cp)[0] = sp
        cp.causal = 1
        cbytes = ctypes.c_size_t(0)
        assert lib.fdma_select_workspace_size(ctypes.byref(cp), ctypes.byref(cbytes)) == 0
        cws = torch.empty(cbytes.value, device=dev, dtype=torch.uint8)
        cp.workspace, cp.workspace_bytes = cws.data_ptr(), cbytes.value

        def select_causal():
            assert lib.fdma_select(ctypes.byref(cp)) == 0

        # Correctness against SDPA over the same kept keys with the scores as bias.
        ours()
        top = torch.topk(scores, w, dim=-1).indices  # [B, Hk, w]; random scores: no ties
        kg = torch.gather(k, 1, top.transpose(1, 2).unsqueeze(-1).expand(B, w, Hk, D))
        vg = torch.gather(v, 1, top.transpose(1, 2).unsqueeze(-1).expand(B, w, Hk, D))
        bias = torch.gather(scores, 2, top).repeat_interleave(H // Hk, 1).unsqueeze(2).to(torch.bfloat16)
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            ref = F.scaled_dot_product_attention(q.transpose(1, 2), kg.transpose(1, 2).repeat_interleave(H // Hk, 1),
                                                 vg.transpose(1, 2).repeat_interleave(H // Hk, 1), attn_mask=bias)
        err = (out.transpose(1, 2).float() - ref.float()).abs().max().item()

        qt = q.transpose(1, 2).detach().requires_grad_()
        kgt, vgt = (x.transpose(1, 2).detach().requires_grad_() for x in (kg, vg))
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        dot = prob.dout.transpose(1, 2)

        def floor(backward=False):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(qt, kgt, vgt, enable_gqa=True)
            if backward:
                o.backward(dot)

        def dense_cudnn():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt.repeat_interleave(H // Hk, 1), vt.repeat_interleave(H // Hk, 1))

        with torch.no_grad():
            t_floor = median_ms(floor)
        t = {"flash-dma": median_ms(ours), "flash-dma fwd+bwd": median_ms(ours_fwdbwd), "select": median_ms(select),
             "select causal": median_ms(select_causal), "floor": t_floor,
             "floor fwd+bwd": median_ms(lambda: floor(True))}
        try:
            t["dense cudnn"] = median_ms(dense_cudnn)
        except RuntimeError as e:
            t["dense cudnn"] = None
            print("cuDNN unavailable:", str(e).splitlines()[0][:100])
        useful = 4 * B * H * S * min(w, S) * D
        rows.append((S, t, useful, err, nbytes.value, cbytes.value))
        del ws, kept_sel  # held until here: the workspace and the kept selection the runs used
        print(S, {k_: (round(x, 3) if x else None) for k_, x in t.items()}, f"max|diff| {err:.3g}", flush=True)
    print(f"\n{torch.cuda.get_device_name()}, bf16, non-causal, B{B} H{H} Hk{Hk} D{D} w{w}; ms (useful TF/s)")
    print("| S | flash-dma fwd | flash-dma fwd+bwd | selection alone | causal selection alone (workspace MB) |"
          " floor: SDPA flash over w keys, fwd / fwd+bwd | ours / floor, fwd / fwd+bwd | dense SDPA cuDNN fwd (all keys) |"
          " workspace MB | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for S, t, useful, err, nbytes, cbytes in rows:
        def cell(x, flops=useful):
            return "-" if x is None else f"{x:.3f} ({flops / x / 1e9:.0f})"
        ratio = f"{t['flash-dma'] / t['floor']:.2f}x / {t['flash-dma fwd+bwd'] / t['floor fwd+bwd']:.2f}x"
        print(f"| {S} | {cell(t['flash-dma'])} | {cell(t['flash-dma fwd+bwd'], 3.5 * useful)} | {t['select']:.3f} | "
              f"{t['select causal']:.3f} ({cbytes / 1e6:.1f}) | "
              f"{cell(t['floor'])} / {cell(t['floor fwd+bwd'], 3.5 * useful)} | {ratio} | "
              f"{cell(t['dense cudnn'], 4 * B * H * S * S * D)} | {nbytes / 1e6:.1f} | {err:.3g} |")


if __name__ == "__main__":
    main()
