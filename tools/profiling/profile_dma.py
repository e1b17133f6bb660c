"""One causal dynamic_mask_attention forward + backward (B1 H16 Hk4 D128 w2048 unless told,
bf16), for a profiler: `ncu --print-summary per-kernel python3 tools/profiling/profile_dma.py
--seqlen 16384`; the seed config: `--heads 2 --kv-heads 1 --headdim 64 --window 1024 --seqlen 32768`.

With `--timeline N` it runs without ncu: N calls under the torch profiler, then for each kernel
of a call its start and end from the call's first kernel's start (medians over the calls, us,
the GPU's own clock, launches overlapped as the library issues them) and each call's span.
Each call waits for the one before (the GPU idle when it starts, as `median_ms` times a call);
`--back-to-back` queues them, so that the host runs ahead and its launch time hides. Either way
it also prints a call's time by CUDA events, alone and back to back: the difference is host time
the GPU waited for.

With `--host N` it times the host side of N forward and N backward calls (the C ABI call's
wall time, the GPU drained before each), and lists the CUDA runtime and driver calls one call
of each makes (the torch profiler's runtime events: count and host us a call, by name)."""
import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))  # dma_problem.py
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import bench_decode  # noqa: E402
from bench_attention import median_ms, view  # noqa: E402
from dma_problem import attach_workspace, dma_problem  # noqa: E402
from flash_dma import _abi  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libfdma.so")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--score-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the key scores' dtype (16-bit scores sort on fewer bits)")
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--timeline", type=int, default=0, help="calls to profile with the torch profiler")
    ap.add_argument("--back-to-back", action="store_true", help="timeline calls queued, not each alone")
    ap.add_argument("--host", type=int, default=0, help="calls whose host time and runtime calls to report")
    args = ap.parse_args()
    lib = _abi.load_library(args.lib)
    dev, S, B, Hk = torch.device("cuda"), args.seqlen, 1, args.kv_heads
    prob = dma_problem(S, causal=args.causal, B=B, H=args.heads, Hk=Hk, D=args.headdim, w=args.window,
                      score_dtype=getattr(torch, args.score_dtype))
    p = prob.params
    keep = torch.empty(2, B, Hk, S, device=dev, dtype=torch.int32)  # the forward's selection, for the backward
    p.keep_begin, p.keep_end = view(keep[0]), view(keep[1])
    ws = attach_workspace([(lib, p)])

    def call():
        assert lib.fdma_dma_fwd(ctypes.byref(p)) == 0, lib.fdma_last_error()
        if not args.forward_only:
            assert lib.fdma_dma_bwd(ctypes.byref(p)) == 0, lib.fdma_last_error()

    call()
    torch.cuda.synchronize()
    if args.timeline:
        timeline(call, args.timeline, not args.back_to_back)
        event_times(call, args.timeline)
    if args.host:
        fwd = lambda: lib.fdma_dma_fwd(ctypes.byref(p))  # noqa: E731
        bwd = lambda: lib.fdma_dma_bwd(ctypes.byref(p))  # noqa: E731
        for name, f in [("forward", fwd)] + ([] if args.forward_only else [("backward", bwd)]):
            host_calls(name, f, args.host)
    del ws


def timeline(call, n, each_alone):
    kernels = bench_decode.kernel_spans(bench_decode.profile_calls(call, n, each_alone=each_alone))
    per_call = len(kernels) // n
    assert per_call * n == len(kernels), "calls launched different kernels"
    calls = [kernels[i * per_call:(i + 1) * per_call] for i in range(n)]
    spans = [c[-1][1] - c[0][0] for c in calls]
    print(f"{n} calls, {per_call} kernels each, span median {statistics.median(spans):.1f} us; per kernel, "
          "start .. end from the call's start (medians, us):")
    for i in range(per_call):
        begin = statistics.median(c[i][0] - c[0][0] for c in calls)
        end = statistics.median(c[i][1] - c[0][0] for c in calls)
        print(f"  {calls[0][i][2][:48]:48s} {begin:8.1f} .. {end:8.1f}  ({end - begin:7.1f})")


def event_times(call, n):
    """ms a call by CUDA events: each alone (median of n), and n queued back to back (mean)."""
    alone = median_ms(call, warmup=2, iters=n)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(n):
        call()
    b.record()
    torch.cuda.synchronize()
    print(f"a call by events: alone {alone:.3f} ms, back to back {a.elapsed_time(b) / n:.3f} ms")


def host_calls(name, f, n):
    """The host's wall time of a call (median of n, the GPU idle before each), and the runtime
    and driver calls it makes (count and host us a call, from the torch profiler over n calls)."""
    times = []
    for _ in range(n + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        assert f() == 0
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    print(f"{name}: host time a call {statistics.median(times[2:]):.1f} us (median of {n})")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            with torch.profiler.record_function("fdma_call"):
                f()
            torch.cuda.synchronize()
    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    runtime = sorted((e for e in cpu if e.name.startswith("cu") and "Synchronize" not in e.name),
                     key=lambda e: e.time_range.start)
    per = {}
    for e in runtime:
        c, us = per.get(e.name, (0, 0.0))
        per[e.name] = (c + 1, us + e.time_range.elapsed_us())
    for k, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:40s} {c / n:5.1f} calls  {us / n:7.1f} us")
    # One call's runtime calls in order, from the call's start (medians over the calls): the
    # gaps between them are the library's own host code (and, before the first, the ctypes call).
    calls = sorted((e for e in cpu if e.name == "fdma_call"), key=lambda e: e.time_range.start)
    rows = [[e for e in runtime if c.time_range.start <= e.time_range.start < c.time_range.end] for c in calls]
    if rows and all(len(r) == len(rows[0]) for r in rows):
        print(f"  one call in order (us from its start; the call lasts "
              f"{statistics.median(c.time_range.elapsed_us() for c in calls):.1f} under the profiler):")
        for i, e in enumerate(rows[0]):
            start = statistics.median(r[i].time_range.start - c.time_range.start for r, c in zip(rows, calls))
            dur = statistics.median(r[i].time_range.elapsed_us() for r in rows)
            print(f"    {start:7.1f} +{dur:5.1f}  {e.name}")


if __name__ == "__main__":
    main()
