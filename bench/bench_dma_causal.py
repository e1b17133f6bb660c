"""Causal dynamic_mask_attention on the GPU, forward and forward+backward, against the
baselines in one run: dense SDPA cuDNN causal (no sparsity), the floor (SDPA flash
over exactly w keys per query), FlexAttention compiled with an O(N) mask_mod for the same
selection (built from our select op's intervals), SDPA efficient with the selection as a
dense additive bias (where it fits), and this project's attention kernel fed the selection as a
[B, Hk, S, S] mask and the scores as a [B, Hk, 1, S] bias (up to --mask-max).

Ours keeps the forward's selection for the backward (keep_begin/keep_end, as the Python
autograd path does); "selecting twice" times the backward selecting again.

Usage: python3 bench/bench_dma_causal.py [--lib build/libfdma.so] [--seqlens 4096,...] [--json out.json]
bf16, B1 H16 Hk4 D128 w2048 unless --heads/--kv-heads/--headdim/--window say otherwise (the
seed config: --heads 2 --kv-heads 1 --headdim 64 --window 1024 --seqlens 32768). Useful TF/s count kept (query, key) pairs only:
fwd 4*H*D*pairs, fwd+bwd 3.5x that. Medians of CUDA events; a markdown table last.
"""
import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms, view  # noqa: E402
from dma_problem import dma_problem  # noqa: E402
from flash_dma import _abi  # noqa: E402


def ok(lib, st):
    if st != 0:
        raise RuntimeError(lib.fdma_last_error().decode())


def try_time(name, fn, t, iters=10):
    try:
        t[name] = median_ms(fn, warmup=2, iters=iters)
    except (RuntimeError, torch.OutOfMemoryError) as e:  # noqa: PERF203
        t[name] = None
        print(f"  {name} unavailable: {str(e).splitlines()[0][:120]}", flush=True)
    torch.cuda.empty_cache()


def attention_with_mask(lib, S, B, H, q, k, v, dout, scores, begin, end, ours_out, stream, t, diff):
    """This project's attention kernel fed the same selection as a [B, Hk, S, S] mask (keys
    kept by their query intervals, causal) and the scores as a [B, Hk, 1, S] bias with its
    gradient: what a user of the general operation would run for the same attention."""
    dev = q.device
    try:
        idx = torch.arange(S, device=dev)
        kept = (begin.unsqueeze(2) <= idx.view(1, 1, S, 1)) & (end.unsqueeze(2) > idx.view(1, 1, S, 1))
        kb = scores.to(torch.bfloat16).unsqueeze(2).contiguous()
        dkb, o, lse = torch.empty_like(kb), torch.empty_like(q), torch.empty(B, H, S, device=dev)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        a = _abi.AttentionParams()
        a.q, a.k, a.v, a.mask, a.bias = view(q), view(k), view(v), view(kept), view(kb)
        a.out, a.lse, a.dout, a.dq, a.dk, a.dv, a.dbias = view(o), view(lse), view(dout), view(dq), view(dk), view(dv), view(dkb)
        a.causal, a.stream = 1, stream
        need = []
        for ps in (_abi.PASS_FORWARD, _abi.PASS_BACKWARD):
            n = ctypes.c_size_t(0)
            ok(lib, lib.fdma_attention_workspace_size(ctypes.byref(a), ps, ctypes.byref(n)))
            need.append(n.value)
        ws = torch.empty(max(1, *need), device=dev, dtype=torch.uint8)
        a.workspace, a.workspace_bytes = ws.data_ptr(), ws.numel()

        def run(backward):
            def go():
                ok(lib, lib.fdma_attention_fwd(ctypes.byref(a)))
                if backward:
                    ok(lib, lib.fdma_attention_bwd(ctypes.byref(a)))
            return go

        try_time("attention+mask fwd", run(False), t)
        try_time("attention+mask fwd+bwd", run(True), t)
        diff["diff"] = (o.float() - ours_out.float()).abs().max().item()
    except (RuntimeError, torch.OutOfMemoryError) as e:  # noqa: PERF203
        print(f"  attention + 4-D mask unavailable: {str(e).splitlines()[0][:120]}", flush=True)
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--flex-max", type=int, default=32768)
    ap.add_argument("--bias-max", type=int, default=8192)
    ap.add_argument("--mask-max", type=int, default=65536,
                    help="longest S for this project's attention fed the selection as a 4-D mask (B*Hk*S*S bytes)")
    ap.add_argument("--json", default="")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev = torch.device("cuda")
    B, H, Hk, D, w = 1, args.heads, args.kv_heads, args.headdim, args.window
    G = H // Hk
    results = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        prob = dma_problem(S, B=B, H=H, Hk=Hk, D=D, w=w)
        q, k, v, dout, scores, out, p = prob.q, prob.k, prob.v, prob.dout, prob.scores, prob.out, prob.params
        # pr selects in both passes; p (as the Python autograd path) keeps the forward's
        # selection in keep_begin/keep_end for the backward.
        pr = _abi.DmaParams.from_buffer_copy(p)
        kept_sel = torch.empty(2, B, Hk, S, device=dev, dtype=torch.int32)
        p.keep_begin, p.keep_end = view(kept_sel[0]), view(kept_sel[1])
        sizes = []
        for params in (p, pr):
            for ps in (_abi.PASS_FORWARD, _abi.PASS_BACKWARD):
                n = ctypes.c_size_t(0)
                ok(lib, lib.fdma_dma_workspace_size(ctypes.byref(params), ps, ctypes.byref(n)))
                sizes.append(n.value)
        ws = torch.empty(max(sizes), device=dev, dtype=torch.uint8)
        p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
        pr.workspace, pr.workspace_bytes = ws.data_ptr(), ws.numel()

        def ours_fwd():
            ok(lib, lib.fdma_dma_fwd(ctypes.byref(p)))

        def ours_fwdbwd():
            ok(lib, lib.fdma_dma_fwd(ctypes.byref(p)))
            ok(lib, lib.fdma_dma_bwd(ctypes.byref(p)))

        def ours_fwdbwd_reselect():
            ok(lib, lib.fdma_dma_fwd(ctypes.byref(pr)))
            ok(lib, lib.fdma_dma_bwd(ctypes.byref(pr)))

        begin = torch.empty(B, Hk, S, device=dev, dtype=torch.int32)
        end = torch.empty_like(begin)
        sp = _abi.SelectParams()
        sp.key_scores, sp.keep_begin, sp.keep_end = view(scores), view(begin), view(end)
        sp.num_queries, sp.window, sp.causal = S, w, 1
        sp.stream = p.stream
        sbytes = ctypes.c_size_t(0)
        ok(lib, lib.fdma_select_workspace_size(ctypes.byref(sp), ctypes.byref(sbytes)))
        sws = torch.empty(sbytes.value, device=dev, dtype=torch.uint8)
        sp.workspace, sp.workspace_bytes = sws.data_ptr(), sbytes.value

        def select():
            ok(lib, lib.fdma_select(ctypes.byref(sp)))

        select()
        torch.cuda.synchronize()
        pairs = int((end - begin).clamp(min=0).sum().item()) * G  # kept (query head, query, key) triples
        t = {}
        try_time("flash-dma fwd", ours_fwd, t)
        try_time("flash-dma fwd+bwd", ours_fwdbwd, t)
        try_time("flash-dma fwd+bwd selecting twice", ours_fwdbwd_reselect, t)
        try_time("select", select, t)
        del sws
        torch.cuda.empty_cache()

        qt = q.transpose(1, 2).detach().requires_grad_()
        kt = k.transpose(1, 2).repeat_interleave(G, 1).detach().requires_grad_()
        vt = v.transpose(1, 2).repeat_interleave(G, 1).detach().requires_grad_()
        dot = dout.transpose(1, 2)

        def sdpa(backend, backward, **kw):
            def run():
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qt, kt, vt, **kw)
                if backward:
                    o.backward(dot)
            return run

        try_time("cudnn fwd", sdpa(SDPBackend.CUDNN_ATTENTION, False, is_causal=True), t)
        try_time("cudnn fwd+bwd", sdpa(SDPBackend.CUDNN_ATTENTION, True, is_causal=True), t)
        # Floor: every query attends exactly w keys (a w-key slice, flash, non-causal).
        kw_, vw_ = (x[:, :, : min(w, S)].detach().requires_grad_() for x in (kt, vt))

        def floor(backward):
            def run():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(qt, kw_, vw_)
                if backward:
                    o.backward(dot)
            return run

        try_time("floor fwd", floor(False), t)
        try_time("floor fwd+bwd", floor(True), t)

        err = None
        if S <= args.bias_max:
            idx = torch.arange(S, device=dev)
            keep = (begin.unsqueeze(2) <= idx.view(1, 1, S, 1)) & (end.unsqueeze(2) > idx.view(1, 1, S, 1))
            bias = torch.where(keep, scores.unsqueeze(2), float("-inf")).repeat_interleave(G, 1).to(torch.bfloat16)
            bias.requires_grad_()
            del keep
            try_time("sdpa+bias fwd", sdpa(SDPBackend.EFFICIENT_ATTENTION, False, attn_mask=bias), t)
            try_time("sdpa+bias fwd+bwd", sdpa(SDPBackend.EFFICIENT_ATTENTION, True, attn_mask=bias), t)
            ours_fwd()
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                ref = F.scaled_dot_product_attention(qt.detach(), kt.detach(), vt.detach(), attn_mask=bias.detach())
            err = (out.transpose(1, 2).float() - ref.float()).abs().max().item()
            del bias, ref
            torch.cuda.empty_cache()

        if S <= args.mask_max:
            mask_diff = {}
            attention_with_mask(lib, S, B, H, q, k, v, dout, scores, begin, end, out, p.stream, t, mask_diff)
            if "diff" in mask_diff:
                print(f"  attention + 4-D mask: max |out - flash-dma out| {mask_diff['diff']:.4f}", flush=True)

        if S <= args.flex_max:
            try:
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention

                def mask_mod(b, h, q_idx, kv_idx):
                    hk = h // G
                    return (begin[b, hk, kv_idx] <= q_idx) & (end[b, hk, kv_idx] > q_idx)

                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + scores[b, h // G, kv_idx]

                block_mask = create_block_mask(mask_mod, B, H, S, S, device=dev, _compile=True)
                flex = torch.compile(flex_attention)
                kf, vf = (x.transpose(1, 2).detach().requires_grad_() for x in (k, v))

                def flex_run(backward):
                    def run():
                        o = flex(qt, kf, vf, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
                        if backward:
                            o.backward(dot)
                    return run

                try_time("flex fwd", flex_run(False), t)
                try_time("flex fwd+bwd", flex_run(True), t)
                try_time("flex block mask", lambda: create_block_mask(mask_mod, B, H, S, S, device=dev, _compile=True),
                         t, iters=3)
            except Exception as e:  # noqa: BLE001
                print("  FlexAttention failed:", str(e).splitlines()[0][:160], flush=True)
        # Workspace of each pass (the backward given the forward's selection), and that
        # selection (8 bytes per key) held between them.
        res = {"S": S, "pairs": pairs, "times_ms": t, "workspace_fwd": sizes[0], "workspace_bwd": sizes[1],
               "workspace_bwd_selecting": sizes[3], "kept_selection": kept_sel.numel() * 4,
               "select_workspace": sbytes.value, "max_abs_diff_vs_sdpa": err}
        results.append(res)
        print(json.dumps(res), flush=True)
        del prob, q, k, v, dout, out, ws, kept_sel, qt, kt, vt, kw_, vw_
        torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "B": B, "H": H, "Hk": Hk, "D": D, "w": w,
                       "results": results}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}, bf16, causal top-w, B{B} H{H} Hk{Hk} D{D} w{w}; "
          "ms fwd / fwd+bwd (useful TF/s of fwd+bwd)")
    print("| S | flash-dma | fwd+bwd selecting twice | selection (share of fwd) | floor | dense cuDNN causal |"
          " FlexAttention (+ block mask) | SDPA + dense bias | attention + 4-D mask | workspace fwd / bwd MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t, S = r["times_ms"], r["S"]
        flops = 4 * D * r["pairs"]

        def cell(name):
            a, b = t.get(name + " fwd"), t.get(name + " fwd+bwd")
            if a is None and b is None:
                return "-"
            txt = f"{a:.2f}" if a else "-"
            txt += f" / {b:.2f} ({3.5 * flops / b / 1e9:.0f})" if b else " / -"
            return txt

        sel = t.get("select")
        share = f"{sel:.2f} ({100 * sel / t['flash-dma fwd']:.0f}%)" if sel and t.get("flash-dma fwd") else "-"
        flex = cell("flex")
        if t.get("flex block mask"):
            flex += f" (+{t['flex block mask']:.1f})"
        twice = t.get("flash-dma fwd+bwd selecting twice")
        twice = f"{twice:.2f}" if twice else "-"
        print(f"| {S} | {cell('flash-dma')} | {twice} | {share} | {cell('floor')} | {cell('cudnn')} | {flex} | "
              f"{cell('sdpa+bias')} | {cell('attention+mask')} | {r['workspace_fwd'] / 1e6:.0f} / {r['workspace_bwd'] / 1e6:.0f} |")


if __name__ == "__main__":
    main()
