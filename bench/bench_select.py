"""The causal top-w selection alone (`fdma_select`, causal unless --causal 0, w = 2048) on the GPU: time against
row length and row count, run each way the library can (FDMA_SELECT_PATH=cluster: a cluster of
up to 8 CTAs per row on sm_90, 16 for rows past 16K keys where the rows are few, up to 32K keys; =shared: one CTA per
row in shared memory, up to 32K keys; =global: a device-wide sort, then a CTA per row through
global memory; =levels: a device-wide sort, then kernels per wavelet level; unset: the
library's choice; "wavelet ends": the library's choice of path with FDMA_SELECT_ENDS=wavelet, the
causal interval ends through the wavelet matrix instead of the walk). Medians of CUDA events around one call; then the library's choice called 50 times back to back:
host ms per call, and GPU ms per call (events around the 50). A markdown table last.

Usage: python3 bench/bench_select.py [--lib build/libfdma.so] [--seqlens 4096,...] [--rows 4,64]
"""
import argparse
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from bench_attention import median_ms, view  # noqa: E402
from flash_dma import _abi  # noqa: E402

BUILDS = ("auto", "wavelet ends", "cluster", "shared", "global", "levels")


def ok(lib, st):
    if st != 0:
        raise RuntimeError(lib.fdma_last_error().decode())


def time_select(lib, S, rows, w, causal=True, score_dtype=torch.float32):
    dev = torch.device("cuda")
    Hk = min(rows, 8) if rows % 8 == 0 else rows
    B = rows // Hk
    torch.manual_seed(0)
    scores = torch.randn(B, Hk, S, device=dev, dtype=score_dtype)
    begin = torch.empty(B, Hk, S, device=dev, dtype=torch.int32)
    end = torch.empty_like(begin)
    sp = _abi.SelectParams()
    sp.key_scores, sp.keep_begin, sp.keep_end = view(scores), view(begin), view(end)
    sp.num_queries, sp.window, sp.causal = S, w, int(causal)
    sp.stream = torch.cuda.current_stream().cuda_stream
    n = ctypes.c_size_t(0)
    ok(lib, lib.fdma_select_workspace_size(ctypes.byref(sp), ctypes.byref(n)))
    ws = torch.empty(n.value, device=dev, dtype=torch.uint8)
    sp.workspace, sp.workspace_bytes = ws.data_ptr(), n.value
    out = {}
    ref = None
    for build in BUILDS:
        if build in ("shared", "cluster") and S > 32768:
            out[build] = float("nan")
            continue
        os.environ.pop("FDMA_SELECT_ENDS", None)
        if build in ("auto", "wavelet ends"):
            os.environ.pop("FDMA_SELECT_PATH", None)
            if build == "wavelet ends":
                os.environ["FDMA_SELECT_ENDS"] = "wavelet"
        else:
            os.environ["FDMA_SELECT_PATH"] = build
        ok(lib, lib.fdma_select(ctypes.byref(sp)))
        got = torch.stack([begin.clone(), end.clone()])
        if ref is None:
            ref = got
        elif not torch.equal(ref, got):
            raise RuntimeError(f"S={S} rows={rows}: the {build} build selected differently")
        out[build] = median_ms(lambda: ok(lib, lib.fdma_select(ctypes.byref(sp))), warmup=3, iters=20)
    os.environ.pop("FDMA_SELECT_PATH", None)
    os.environ.pop("FDMA_SELECT_ENDS", None)
    # The library's choice called back to back: host time per call, and GPU time per call when
    # the host runs ahead (what a training step sees) against one call timed alone (above).
    calls = 50
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    for _ in range(calls):
        ok(lib, lib.fdma_select(ctypes.byref(sp)))
    b.record()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    out["host"], out["streamed"] = host, a.elapsed_time(b) / calls
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlens", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--rows", default="4,64")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--score-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the key scores' dtype (16-bit scores sort on fewer bits)")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    table = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for S in [int(s) for s in args.seqlens.split(",")]:
            if rows * S > 2**26:
                continue
            t = time_select(lib, S, rows, args.window, bool(args.causal), getattr(torch, args.score_dtype))
            table.append((rows, S, t))
            print(rows, S, t, flush=True)
    print("\n| rows (B x Hk) | S | library's choice | wavelet ends | cluster | shared | global | levels | host per call | back to back |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rows, S, t in table:
        print(f"| {rows} | {S} | " + " | ".join(f"{t[b]:.3f}" for b in BUILDS + ("host", "streamed")) + " |")


if __name__ == "__main__":
    main()
