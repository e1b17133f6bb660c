"""Where a decode step's time goes, kernel by kernel, on the GPU's own clock: steady-state
select_state steps (B8 H32 Hk8 128K and B64 32K, w2048, as bench_decode.py runs them), ten to
a CUDA graph, replayed under the torch profiler. For each kernel of a step: when it started and
ended, in us from the start of the step's first kernel (medians over the replayed steps), so
that waits show up: a kernel launched overlapping its predecessor (programmatic dependent
launch) starts before the predecessor ends and waits inside; what the step costs is the span.
The step periods' median, mean and maximum and each replay's span over its steps show whether
some steps cost more than the typical one; the same replays timed by events without the
profiler (as bench_decode.py times them) show whether the profiler changes the steps.

  python3 tools/profiling/decode_timeline.py [--switch VAR=VALUE ...]

Each --switch runs the steps again with one environment switch set (path_switches.hpp)."""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_decode  # noqa: E402

STEPS = 10  # a graph's steps
WARMUP, REPLAYS = 3, 3  # the events' replays and the profiled ones: REPLAYS each


def timeline(B, K, label):
    # Room in the cache for every step's appended token: the warm-up, the first replay, the timed and profiled ones.
    sets = bench_decode.make_sets(B, K + WARMUP + (1 + 2 * REPLAYS) * STEPS, 8, 128, 0, 1, seed=5)
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    step = bench_decode.state_step(q, 2048, dict(sets[0], K=K), 1)
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(STEPS):
            step()
    graph.replay()
    torch.cuda.synchronize()
    # The same replays timed by events without the profiler, as bench_decode.py times them.
    per_step = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        per_step.append(a.elapsed_time(b) * 1e3 / STEPS)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    kernels = bench_decode.kernel_spans(prof)
    first = kernels[0][2]  # each step starts with the same kernel (the append)
    steps, cur = [], []
    for k in kernels:
        if k[2] == first and cur:
            steps.append(cur)
            cur = []
        cur.append(k)
    steps.append(cur)
    assert len(steps) == REPLAYS * STEPS and all(len(s) == len(steps[0]) for s in steps), "unexpected kernels"
    starts = [s[0][0] for s in steps]
    # Periods within a replay (the gap between replays is the host's), and each replay's span
    # over its steps: what bench_decode.py's events divide by the steps of a replay.
    periods = [starts[j + 1] - starts[j] for j in range(len(starts) - 1) if (j + 1) % STEPS]
    spans = [(steps[r + STEPS - 1][-1][1] - steps[r][0][0]) / STEPS for r in range(0, len(steps) - STEPS + 1, STEPS)]
    print(f"{label}: {len(steps)} steps, step period (start to start) median {statistics.median(periods):.1f} us, "
          f"mean {statistics.mean(periods):.1f}, max {max(periods):.1f}; replay span / steps "
          f"{statistics.median(spans):.1f} us; events around a replay without the profiler "
          f"{statistics.median(per_step):.1f} us a step; per kernel, start .. end from the step's start, medians, us:")
    for i, (_, _, name) in enumerate(steps[0]):
        begin = statistics.median(s[i][0] - s[0][0] for s in steps)
        end = statistics.median(s[i][1] - s[0][0] for s in steps)
        print(f"  {name:40s} {begin:7.1f} .. {end:7.1f}  ({end - begin:6.1f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--switch", action="append", default=[])
    args = ap.parse_args()
    for setting in [""] + args.switch:
        if setting:
            var, value = setting.split("=", 1)
            os.environ[var] = value
        for B, K in ((8, 131072), (64, 32768)):
            timeline(B, K, f"B{B} K{K}" + (f" with {setting}" if setting else ""))
        if setting:
            del os.environ[var]


if __name__ == "__main__":
    main()
