"""Dense attention forward+backward on Hopper: the fused dq (a non-deterministic call: the dk/dv
kernel reduces dS K into an fp32 temporary, five matmuls) against the two-kernel backward (the
same call with deterministic=1: dq and dk/dv kernels, seven matmuls, no atomics), SDPA flash
(FlashAttention-2) and SDPA cuDNN, in one process. Each round times every system once per
problem, the order rotated each round; the table gives medians over rounds of per-round medians
of CUDA events. At D = 64 and 128 the fused call runs the warp-specialized backward
(attention_bwd_ws.cuh; with a mask, a bias with a query dim, or both); "fused
dk/dv kernel" is the same call with
FDMA_BWD_WS=0 (the dk/dv kernel's fused dq, or the two kernels where that one declines).

Usage: python3 bench/bench_bwd_fused.py [--lib build/libfdma.so] [--seqlens 8192,16384]
                                        [--headdims 64,128] [--rounds 3]
                                        [--cases dense,per-key,block,block-all,mask,padding,
                                                 bias,bias-nograd,bias-shared,mask-bias]
With several comma-separated libraries (--lib base.so,new.so) the fused call also runs with
each, as "fused@0", "fused@1", ... in the same rotation (an A/B of two builds in one process),
and with --ab-two-kernel the two-kernel call too ("two-kernel@0", ...); the other columns use
the first.
bf16, B1 H16 Hk16. TF/s = 3.5 * 4*B*H*S*S*D / t (bwd = 2.5x fwd), halved for causal (the block
cases count every score too). Also checks the fused call against the two-kernel one: dk, dv
(and dbias) bitwise, and the largest differences of dq and of dk, dv.
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
from flash_dma import _abi  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="8192,16384")
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="dense,per-key",
                    help="dense, per-key (a bias [B, H, 1, S]), block (a [B, 1, S, S] mask of 128 x 128 blocks, "
                    "1/8 kept), block-all (the same with every block kept), mask (a [B, 1, S, S] mask keeping each "
                    "score with probability 0.9: every tile masked), padding (a [B, 1, 1, S] key padding mask "
                    "hiding the last S/8 keys), bias (a [B, H, S, S] bias and its dbias), bias-nograd (the same "
                    "bias, no dbias asked for), bias-shared (a [1, 1, S, S] bias and its dbias, summed over heads), "
                    "mask-bias (the mask of 'mask' and the bias of 'bias' together, with dbias)")
    ap.add_argument("--ab-two-kernel", action="store_true",
                    help="with several --lib, also time the two-kernel call with each")
    args = ap.parse_args()
    libs = [_abi.load_library(path) for path in args.lib.split(",")]
    lib = libs[0]
    dev, B, H = torch.device("cuda"), 1, 16
    rows = []
    for D in [int(d) for d in args.headdims.split(",")]:
        for S in [int(s) for s in args.seqlens.split(",")]:
            for case, causal in [(c, cz) for c in args.cases.split(",") for cz in (False, True)]:
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
                bias = None
                if case == "per-key":
                    bias = torch.randn(B, H, 1, S, device=dev, dtype=torch.bfloat16)
                elif case == "bias-shared":
                    bias = torch.randn(1, 1, S, S, device=dev, dtype=torch.bfloat16)
                elif case.startswith("bias") or case == "mask-bias":
                    bias = torch.randn(B, H, S, S, device=dev, dtype=torch.bfloat16)
                mask = None
                if case.startswith("block"):  # as bench_attention_bwd.py
                    blocks = torch.rand(B, 1, S // 128, S // 128, device=dev) < (1.0 if case == "block-all" else 1 / 8)
                    mask = blocks.repeat_interleave(128, 2).repeat_interleave(128, 3)
                elif case in ("mask", "mask-bias"):
                    mask = torch.rand(B, 1, S, S, device=dev) < 0.9
                elif case == "padding":
                    mask = torch.ones(B, 1, 1, S, device=dev, dtype=torch.bool)
                    mask[..., S - S // 8:] = False
                out = torch.empty_like(q)
                lse = torch.empty(B, H, S, device=dev, dtype=torch.float32)
                grads = {det: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                               torch.empty_like(bias) if bias is not None and case != "bias-nograd" else None)
                         for det in (0, 1)}
                params = {}
                for det in (0, 1):
                    p = _abi.AttentionParams()
                    dq, dk, dv, db = grads[det]
                    p.q, p.k, p.v, p.out, p.lse = view(q), view(k), view(v), view(out), view(lse)
                    p.dout, p.dq, p.dk, p.dv = view(dout), view(dq), view(dk), view(dv)
                    p.bias, p.dbias, p.mask = view(bias), view(db), view(mask)
                    p.causal, p.deterministic = int(causal), det
                    p.stream = torch.cuda.current_stream().cuda_stream
                    params[det] = p
                sizes = []
                for det in (0, 1):
                    for ps in (_abi.PASS_FORWARD, _abi.PASS_BACKWARD):
                        n = ctypes.c_size_t(0)
                        if lib.fdma_attention_workspace_size(ctypes.byref(params[det]), ps, ctypes.byref(n)) != 0:
                            raise RuntimeError(lib.fdma_last_error().decode())
                        sizes.append(n.value)
                ws = torch.empty(max(1, *sizes), device=dev, dtype=torch.uint8)
                for p in params.values():
                    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()

                def ours(det, ws=True, lib=lib):
                    def run():
                        call(lib, lib.fdma_attention_fwd, params[det])
                        os.environ["FDMA_BWD_WS"] = "1" if ws else "0"
                        try:
                            call(lib, lib.fdma_attention_bwd, params[det])
                        finally:
                            os.environ.pop("FDMA_BWD_WS")
                    return run

                qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
                dot = dout.transpose(1, 2)

                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        o.backward(dot)
                    return run

                systems = {"fused": ours(0), "two-kernel": ours(1)}
                if len(libs) > 1:
                    systems.update({f"fused@{i}": ours(0, lib=other) for i, other in enumerate(libs)})
                    if args.ab_two_kernel:
                        systems.update({f"two-kernel@{i}": ours(1, lib=other) for i, other in enumerate(libs)})
                if D in (64, 128):
                    systems["fused dk/dv kernel"] = ours(0, ws=False)
                if bias is None and mask is None:
                    systems.update({"sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
                                    "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)})
                for name, fn in list(systems.items()):
                    try:
                        fn()
                    except RuntimeError as e:
                        print(f"  {name} unavailable: {str(e).splitlines()[0][:100]}")
                        del systems[name]
                torch.cuda.synchronize()
                if "fused dk/dv kernel" in systems:  # the default call's gradients, last
                    systems["fused"]()
                    torch.cuda.synchronize()
                if args.ab_two_kernel and len(libs) > 1:  # the first library's two-kernel gradients, last
                    systems["two-kernel"]()
                    torch.cuda.synchronize()
                same = all(torch.equal(a, b) for a, b in zip(grads[0][1:], grads[1][1:]) if a is not None)
                dq_diff = (grads[0][0].float() - grads[1][0].float()).abs().max().item()
                dkv_diff = max((a.float() - b.float()).abs().max().item()
                               for a, b in zip(grads[0][1:3], grads[1][1:3]))
                times = {name: [] for name in systems}
                order = list(systems)
                for r in range(args.rounds):
                    for name in order[r % len(order):] + order[:r % len(order)]:
                        times[name].append(median_ms(systems[name]))
                med = {name: statistics.median(t) for name, t in times.items()}
                flops = 3.5 * 4 * B * H * S * S * D / (2 if causal else 1)
                rows.append((D, S, case, causal, med, flops, same, dq_diff, dkv_diff))
                print(D, S, case, causal, {n: round(t, 3) for n, t in med.items()}, same, f"{dq_diff:.3g}",
                      f"{dkv_diff:.3g}", flush=True)
                del ws, params, grads
                torch.cuda.empty_cache()
    ab = range(len(libs)) if len(libs) > 1 else range(0)
    names = ("fused", *(f"fused@{i}" for i in ab), "fused dk/dv kernel", "two-kernel",
             *(f"two-kernel@{i}" for i in ab if args.ab_two_kernel), "sdpa flash", "sdpa cudnn")
    print(f"\n{torch.cuda.get_device_name()}, bf16, B{B} H{H} Hk{H}; fwd+bwd ms (TF/s), "
          f"medians of {args.rounds} rounds")
    print("| D | S | case | causal | " + " | ".join(names) + " | dk, dv == two-kernel | max abs dq diff | dk, dv |")
    print("|---" * (7 + len(names)) + "|")
    for D, S, case, causal, med, flops, same, dq_diff, dkv_diff in rows:
        cells = ["-" if n not in med else f"{med[n]:.2f} ({flops / med[n] / 1e9:.0f})" for n in names]
        print(f"| {D} | {S} | {case} | {int(causal)} | " + " | ".join(cells) + f" | {same} | {dq_diff:.3g} | {dkv_diff:.3g} |")


if __name__ == "__main__":
    main()
