"""Attention forward on Hopper: the warp-specialized kernel (the default at D 64, 128 and 256)
against the cp.async wgmma kernel (FDMA_FWD_WS=0; mma.sync at D 256), SDPA flash
(FlashAttention-2) and SDPA cuDNN (dense cases), in one process. Cases: dense; per-key (a bias
[B, H, 1, S]); mask (a [1, 1, S, S] mask keeping each score with probability 0.9: every tile
masked, none skipped); block (a [1, 1, S, S] mask of 128 x 128 blocks, 1/8 of them kept whole);
bias (a [1, H, S, S] bias in q's dtype); mask-bias (the mask and the bias together: a mask tile
and a bias tile a key tile). For these, SDPA's memory-efficient
backend with the same mask or bias is the baseline. Each round times every system once per
problem, the order rotated each round; the table gives medians over rounds of per-round
medians of CUDA events.

Usage: python3 bench/bench_fwd_ws.py [--seqlens 8192,16384] [--headdims 64,128] [--rounds 3]
                                     [--cases dense,per-key] [--keys 2176[,4352...]] [--systems ws,cudnn]
bf16, B1 H16 Hk16 unless told. TF/s = 4*B*H*S*Sk*D / t, halved for causal (the block mask's
kept share not counted: the same work as dense). --keys: Sk keys
against S queries, non-causal only (short rows: each CTA walks few key tiles, as in the
dynamic-mask forward, whose query tiles list about w + 128 keys); with several (--keys
384,768,1152,2176,4352) also a line fit of each system's time against Sk, whose intercept is
what a CTA costs beyond its keys (docs/performance.md, "short walks"); "flash-dma ws" goes
through the Python package, whose host time per call shows in calls of a quarter of a
millisecond (0.287 against 0.220 ms through the C ABI at 512 keys, D 128): fit the "ws@0"
column of --lib for the kernel alone. Also checks each
flash-dma output against SDPA flash (dense) or the cp.async kernel (the other cases): max |diff|.
With --lib base.so,new.so the warp-specialized call also runs through each library's C ABI, as
"ws@0", "ws@1", ..., in the same rotation: an A/B of two builds in one process.
"""
import argparse
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms, view  # noqa: E402
from bench_attention_bwd import call  # noqa: E402
import flash_dma  # noqa: E402
from flash_dma import _abi  # noqa: E402


SWITCHES = ("FDMA_FWD_WS",)


def with_env(env, fn):
    """fn run with exactly the switches in `env` set (None: the defaults)."""
    def run():
        for name in SWITCHES:
            os.environ.pop(name, None)
        os.environ.update(env or {})
        return fn()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="8192,16384")
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="dense", help="dense, per-key, mask, block, bias, mask-bias (comma-separated)")
    ap.add_argument("--keys", default="", help="Sk, when not S (non-causal only); several comma-separated: "
                    "also a line fit of each system's time against Sk")
    ap.add_argument("--systems", default="", help="time only these columns (comma-separated: "
                    "ws, cpasync, flash, cudnn, efficient, ws@0, ws@1, ...); default all")
    ap.add_argument("--lib", default="", help="libraries to A/B through the C ABI (comma-separated)")
    args = ap.parse_args()
    libs = [_abi.load_library(path) for path in args.lib.split(",")] if args.lib else []
    key_counts = [int(k) for k in args.keys.split(",")] if args.keys else []
    dev, B, H = torch.device("cuda"), args.batch, args.heads
    rows, fits = [], {}
    for D in [int(d) for d in args.headdims.split(",")]:
        for S in [int(s) for s in args.seqlens.split(",")]:
            for Sk in key_counts or [S]:
                torch.manual_seed(0)
                q = torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16)
                k, v = (torch.randn(B, Sk, H, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                key_bias = torch.randn(B, H, 1, Sk, device=dev, dtype=torch.bfloat16)
                causals = (False,) if key_counts else (False, True)
                for case, causal in [(c, cz) for c in args.cases.split(",") for cz in causals]:
                    bias = key_bias if case == "per-key" else None
                    mask = None
                    if case in ("mask", "mask-bias"):
                        mask = torch.rand(1, 1, S, Sk, device=dev) < 0.9
                    elif case == "block":
                        blocks = torch.rand(1, 1, (S + 127) // 128, (Sk + 127) // 128, device=dev) < 0.125
                        mask = blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)[:, :, :S, :Sk].contiguous()
                    if case in ("bias", "mask-bias"):
                        bias = torch.randn(1, H, S, Sk, device=dev, dtype=torch.bfloat16)
                    # SDPA's form of the same terms: an additive float mask (-inf where hidden)
                    sdpa_terms = None
                    if mask is not None:
                        sdpa_terms = (bias if bias is not None else torch.zeros(1, 1, S, Sk, device=dev, dtype=torch.bfloat16)
                                      ).masked_fill(~mask, float("-inf"))
                        if causal:  # bottom-right aligned, as ours; S == Sk here
                            sdpa_terms = sdpa_terms.masked_fill(torch.ones(S, Sk, device=dev, dtype=torch.bool).triu(1), float("-inf"))
                    elif case == "bias":
                        sdpa_terms = bias if not causal else bias.masked_fill(
                            torch.ones(S, Sk, device=dev, dtype=torch.bool).triu(1), float("-inf"))

                    def sdpa(backend):
                        def run():
                            with sdpa_kernel(backend):
                                if sdpa_terms is not None:
                                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=sdpa_terms)
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        return run

                    def ours():
                        return flash_dma.attention(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=causal)

                    def ours_lib(lib):  # the same call through a library's C ABI
                        out, lse = torch.empty_like(q), torch.empty(B, H, S, device=dev, dtype=torch.float32)
                        p = _abi.AttentionParams()
                        p.q, p.k, p.v, p.out, p.lse = view(q), view(k), view(v), view(out), view(lse)
                        p.bias, p.mask, p.causal = view(bias), view(mask), int(causal)
                        p.stream = torch.cuda.current_stream().cuda_stream
                        n = ctypes.c_size_t(0)
                        if lib.fdma_attention_workspace_size(ctypes.byref(p), _abi.PASS_FORWARD, ctypes.byref(n)) != 0:
                            raise RuntimeError(lib.fdma_last_error().decode())
                        ws = torch.empty(max(1, n.value), device=dev, dtype=torch.uint8)
                        p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()

                        def run():
                            call(lib, lib.fdma_attention_fwd, p)
                            return out
                        run.keep = (p, ws, lse)  # alive as long as the call: the library writes through p
                        return run

                    systems = {"flash-dma ws": with_env(None, ours),
                               "flash-dma cp.async": with_env({"FDMA_FWD_WS": "0"}, ours)}
                    systems.update({f"ws@{i}": with_env(None, ours_lib(lib)) for i, lib in enumerate(libs)})
                    if case == "dense":
                        systems.update({"SDPA flash": sdpa(SDPBackend.FLASH_ATTENTION),
                                        "SDPA cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION)})
                    elif case != "per-key":
                        systems["SDPA efficient"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
                    short = {"ws": "flash-dma ws", "cpasync": "flash-dma cp.async", "flash": "SDPA flash",
                             "cudnn": "SDPA cuDNN", "efficient": "SDPA efficient"}
                    timed = ([short.get(x, x) for x in args.systems.split(",") if short.get(x, x) in systems] if args.systems
                             else list(systems))
                    with torch.no_grad():
                        # the reference: SDPA flash, or with a mask or bias the cp.async kernel
                        ref = (systems["SDPA flash"]().transpose(1, 2) if case == "dense" else
                               systems["flash-dma cp.async"]()).float()
                        errs = {n: (systems[n]().float() - ref).abs().max().item()
                                for n in ("flash-dma ws", "flash-dma cp.async", *(f"ws@{i}" for i in range(len(libs))))}
                        # the libraries' outputs bitwise equal to the first one's
                        first = systems["ws@0"]().clone() if libs else None
                        same = all(torch.equal(first, systems[f"ws@{i}"]()) for i in range(1, len(libs)))
                        names = [n for n in systems if n in timed]
                        times = {n: [] for n in names}
                        for r in range(args.rounds):
                            for n in names[r % len(names):] + names[:r % len(names)]:
                                times[n].append(median_ms(systems[n], warmup=2, iters=10))
                    with_env(None, lambda: None)()
                    flops = 4 * B * H * S * Sk * D / (2 if causal else 1)
                    med = {n: statistics.median(t) for n, t in times.items()}
                    rows.append((case, D, S if Sk == S else f"{S} x {Sk}", causal, med, flops, errs, same))
                    fits.setdefault((case, D, S), []).append((Sk, med))
                    print(case, D, S, Sk, causal, {n: round(t, 3) for n, t in med.items()}, errs, same, flush=True)
    print(f"\n{torch.cuda.get_device_name()}, bf16, B{B} H{H}, forward; ms (TF/s), medians of {args.rounds} rotated rounds")
    columns = ["flash-dma ws", *(f"ws@{i}" for i in range(len(libs))), "flash-dma cp.async", "SDPA flash",
               "SDPA cuDNN", "SDPA efficient"]
    print("| case | D | S | causal | " + " | ".join(columns) + " | max abs diff ws / cp.async |" +
          (" ws@ outputs bitwise equal |" if libs else ""))
    print("|---" * (len(columns) + 5 + bool(libs)) + "|")
    for case, D, S, causal, med, flops, errs, same in rows:
        cells = " | ".join(f"{med[n]:.3f} ({flops / med[n] / 1e9:.0f})" if n in med else "-" for n in columns)
        print(f"| {case} | {D} | {S} | {int(causal)} | {cells} | "
              f"{errs['flash-dma ws']:.3g} / {errs['flash-dma cp.async']:.3g} |" + (f" {same} |" if libs else ""))
    if len(key_counts) > 1:
        print_fits(fits, B * H, torch.cuda.get_device_properties(0).multi_processor_count)


def print_fits(fits, heads, sms):
    """Least-squares line of each system's time against Sk per (case, D, S): the time a key
    costs, and the intercept spread over the CTAs an SM runs (128-row query tiles, one CTA an
    SM at a time): what a CTA costs beyond its keys."""
    print(f"\nline fits of ms against Sk ({sms} SMs; a CTA = 128 query rows of one head)")
    print("| case | D | S | system | us per 1K keys | intercept ms | us a CTA beyond its keys |")
    print("|---|---|---|---|---|---|---|")
    for (case, D, S), points in fits.items():
        ctas = heads * ((S + 127) // 128)
        for name in points[0][1]:
            xs = [k for k, med in points if name in med]
            ys = [med[name] for k, med in points if name in med]
            if len(xs) < 2:
                continue
            slope, icpt = statistics.linear_regression(xs, ys)
            print(f"| {case} | {D} | {S} | {name} | {slope * 1e6:.1f} | {icpt:.4f} | {icpt * 1e3 * sms / ctas:.2f} |")


if __name__ == "__main__":
    main()
