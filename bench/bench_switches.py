"""The library's GPU path switches against its defaults, in one process and interleaved: causal
dynamic_mask_attention (B1 H16 Hk4 D128 w2048 bf16 unless told) forward and forward+backward, medians of
CUDA events, each configuration timed in turn per round (the order rotated each round) so clock
drift hits all alike.

Configurations (environment switches, read by the library per call):
  default                   the library's defaults: on Hopper the warp-specialized forward (TMA or
                            gathering producer warps, ping-pong consumers), launches overlapping
                            their predecessors (programmatic dependent launch), CTAs in grid order
  cpasync                   FDMA_FWD_WS=0: the cp.async wgmma forward, whose list's last key tile
                            runs 32 or 64 keys wide where it holds no more
  full                      FDMA_FWD_WS=0 FDMA_FWD_LAST_TILE=full: the cp.async forward with every
                            key tile 128 keys wide
  serial                    FDMA_OVERLAP_LAUNCHES=0: every kernel waits for the previous one to end
  full+serial               both switches off: full-width last tiles and serial launches
  dkdv1, dkdv2              FDMA_DKDV_GROUPS=1 or 2: one or two warp groups per dk/dv CTA, forced
                            (the default picks per call: two in dynamic-mask mode; with one, dk,
                            dv, dkey_scores differ bitwise: another summation order)
  split1                    FDMA_DKDV_SPLITS=1: each dk/dv key group's queries walked by one CTA
                            (the default splits them for few KV heads and short windows; split,
                            dk, dv, dkey_scores differ bitwise)
  wavelet                   FDMA_SELECT_ENDS=wavelet: the causal selection's interval ends through
                            the wavelet matrix instead of the walk (the same intervals)
  ckpt0, ckpt4, ckpt16      FDMA_TILE_CHECKPOINTS=0, 4 or 16: the causal tile lists with no
                            checkpoint lists, or one every 4 or 16 tiles (the default: 8)
  narrow0, narrow1, narrow3 FDMA_WALK_NARROW=0, 1 or 3: the selection's walk cuts none, or the w
                            or 3w ranks after rank w, one step a piece (the default: 3w where the
                            walk's grid so cut runs in one wave, else none; the same intervals)
  det                       deterministic=1 (a call parameter): the dq and dk/dv kernels, where
                            the default on Hopper at D 64 and 128 is the warp-specialized backward
                            with fused dq (its gradients differ in the last bits: atomics)

Usage: python3 bench/bench_switches.py [--lib build/libfdma.so] [--seqlens 16384,32768] [--rounds 5]
                                      [--configs default,full,...] [--heads 16 --kv-heads 4 --headdim 128 --window 2048]
With several comma-separated libraries (--lib a.so,b.so), every configuration runs with each,
labelled "@0", "@1", ... Also checks whether every run's output, and its gradients (dq, dk, dv,
dkey_scores), equal the first library's default's bitwise, and the largest difference from
them relative to each tensor's largest magnitude. The calls are non-deterministic (dq summed
with atomics on Hopper): gradients may differ in their last bits between any two runs, the
output may not.
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms, view  # noqa: E402
from dma_problem import attach_workspace, dma_problem  # noqa: E402
from flash_dma import _abi  # noqa: E402

CONFIGS = {
    "default": {},
    "cpasync": {"FDMA_FWD_WS": "0"},
    "full": {"FDMA_FWD_WS": "0", "FDMA_FWD_LAST_TILE": "full"},
    "serial": {"FDMA_OVERLAP_LAUNCHES": "0"},
    "full+serial": {"FDMA_FWD_WS": "0", "FDMA_FWD_LAST_TILE": "full", "FDMA_OVERLAP_LAUNCHES": "0"},
    "dkdv1": {"FDMA_DKDV_GROUPS": "1"},
    "dkdv2": {"FDMA_DKDV_GROUPS": "2"},
    "split1": {"FDMA_DKDV_SPLITS": "1"},
    "wavelet": {"FDMA_SELECT_ENDS": "wavelet"},
    "ckpt0": {"FDMA_TILE_CHECKPOINTS": "0"},
    "ckpt4": {"FDMA_TILE_CHECKPOINTS": "4"},
    "ckpt16": {"FDMA_TILE_CHECKPOINTS": "16"},
    "narrow0": {"FDMA_WALK_NARROW": "0"},
    "narrow1": {"FDMA_WALK_NARROW": "1"},
    "narrow3": {"FDMA_WALK_NARROW": "3"},
    "sort-global": {"FDMA_SELECT_PATH": "global"},
    "sort-shared": {"FDMA_SELECT_PATH": "shared"},
    "det": {"deterministic": 1},
}


def set_config(name, params):
    for var in ("FDMA_FWD_WS", "FDMA_FWD_LAST_TILE", "FDMA_OVERLAP_LAUNCHES", "FDMA_DKDV_GROUPS", "FDMA_DKDV_SPLITS",
                "FDMA_SELECT_ENDS", "FDMA_SELECT_PATH", "FDMA_TILE_CHECKPOINTS"):
        os.environ.pop(var, None)
    config = dict(CONFIGS[name])
    params.deterministic = config.pop("deterministic", 0)
    os.environ.update(config)


def ok(lib, st):
    if st != 0:
        raise RuntimeError(lib.fdma_last_error().decode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so", help="one library, or several comma-separated to A/B")
    ap.add_argument("--seqlens", default="16384,32768")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="which configurations, default first")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--score-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the key scores' dtype (16-bit scores sort on fewer bits)")
    args = ap.parse_args()
    names = args.configs.split(",")
    if names[0] != "default" or any(n not in CONFIGS for n in names):
        ap.error(f"--configs: 'default' first, then any of {', '.join(CONFIGS)}")
    libs = [_abi.load_library(path) for path in args.lib.split(",")]
    # (label, library, configuration): every configuration with every library, the first
    # library's default first (the reference of the bitwise check).
    runs = [(name if len(libs) == 1 else f"{name} @{li}", lib, name) for li, lib in enumerate(libs) for name in names]
    dev = torch.device("cuda")
    B, H, Hk, D, w = 1, args.heads, args.kv_heads, args.headdim, args.window
    rows = []
    for S in [int(s) for s in args.seqlens.split(",")]:
        prob = dma_problem(S, B=B, H=H, Hk=Hk, D=D, w=w, score_dtype=getattr(torch, args.score_dtype))
        out, p = prob.out, prob.params
        kept = torch.empty(2, B, Hk, S, device=dev, dtype=torch.int32)
        p.keep_begin, p.keep_end = view(kept[0]), view(kept[1])
        # Sized for every configuration (the deterministic backward may need more or less: split
        # partials; the checkpoint lists' count changes the lists' room).
        ws = None
        for name in names + ["det"]:
            set_config(name, p)
            cand = attach_workspace([(lib, p) for lib in libs])
            if ws is None or cand.numel() > ws.numel():
                ws = cand
            del cand
        p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
        set_config("default", p)

        def fwd(lib):
            ok(lib, lib.fdma_dma_fwd(ctypes.byref(p)))

        def fwdbwd(lib):
            fwd(lib)
            ok(lib, lib.fdma_dma_bwd(ctypes.byref(p)))

        grads = (out, prob.dq, prob.dk, prob.dv, prob.dscores)
        outs = {}
        for label, lib, name in runs:
            set_config(name, p)
            fwdbwd(lib)
            torch.cuda.synchronize()
            outs[label] = [g.clone() for g in grads]
        ref = outs[runs[0][0]]
        same = {}  # label: (out equal, every gradient equal)
        for label, _, _ in runs:
            got = outs[label]
            same[label] = (torch.equal(got[0], ref[0]), all(torch.equal(a, b) for a, b in zip(got[1:], ref[1:])))
        diff = {label: max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
                           for a, b in zip(outs[label], ref)) for label, _, _ in runs}
        times = {label: {"fwd": [], "fwd+bwd": []} for label, _, _ in runs}
        for r in range(args.rounds):
            # The order rotates each round: in a fixed order the second library of an A/B measured
            # slower at 128K in three runs out of three (docs/performance.md, "method").
            for label, lib, name in runs[r % len(runs):] + runs[:r % len(runs)]:
                set_config(name, p)
                times[label]["fwd"].append(median_ms(lambda: fwd(lib), warmup=2, iters=args.iters))
                times[label]["fwd+bwd"].append(median_ms(lambda: fwdbwd(lib), warmup=1, iters=args.iters))
        set_config("default", p)
        for label, _, _ in runs:
            f = sorted(times[label]["fwd"])
            fb = sorted(times[label]["fwd+bwd"])
            rows.append((S, label, f[len(f) // 2], f[0], f[-1], fb[len(fb) // 2], fb[0], fb[-1], same[label], diff[label]))
        del prob, kept, ws, outs
        torch.cuda.empty_cache()

    print(f"\n{torch.cuda.get_device_name()}; medians of {args.rounds} rounds (min-max) of {args.iters}-launch medians")
    print("| S | config | fwd ms | fwd+bwd ms | out == default | grads == default | max relative difference |")
    print("|---|---|---|---|---|---|---|")
    for S, name, f, f0, f1, fb, fb0, fb1, same, diff in rows:
        print(f"| {S} | {name} | {f:.3f} ({f0:.3f}-{f1:.3f}) | {fb:.3f} ({fb0:.3f}-{fb1:.3f}) | {same[0]} | {same[1]} | {diff:.1e} |")


if __name__ == "__main__":
    main()
