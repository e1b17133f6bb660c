"""Where a warp-specialized forward step's time goes, per consumer group, on the SM's own clock.

Needs a library built from a tree with `fwd_ws_timeline.patch` applied (the probe writes the
clock at 8 points of each step of both consumer groups of every 32nd CTA into a device array,
and a kernel of its own prints them after each forward: a printf inside the forward would make
ptxas serialize every wgmma of it, warning C7510, and time a different kernel). On the GPU
machine:

  git apply tools/profiling/fwd_ws_timeline.patch
  BUILD_DIR=build-probe BUILD_ARGS="-DFDMA_CUDA_HEAD_DIMS=64;128 -DFDMA_CUDA_DTYPES=bf16" \\
      bash -c 'source bench/device_build.sh; device_build fdma'
  python3 tools/profiling/fwd_ws_timeline.py --lib build-probe/libfdma.so --seqlen 16384
  python3 tools/profiling/fwd_ws_timeline.py --lib build-probe/libfdma.so --heads 2 --kv-heads 1 \\
      --headdim 64 --window 1024 --seqlen 32768          # the seed config

`--dense-keys 2176` times a dense call instead (16K queries against the keys a dynamic-mask
query tile lists at w 2048), on the dense kind's wider key tiles.

Building with -DCMAKE_CUDA_FLAGS=-DFDMA_PROBE_NOCOPY as well leaves out the producer's K and V
row copies (the outputs are then garbage): what the steps cost without the gather's traffic.

Prints two sampled CTAs' first steps (both groups: step start, K landed, V landed, turn taken,
matmuls issued, S done, P V done, step end; cycles from the CTA's first point) and medians over
the middle steps of all sampled CTAs.
"""
import argparse
import collections
import ctypes
import os
import statistics
import subprocess
import sys

POINTS = ["start", "K", "V", "turn", "issued", "S", "PV", "end"]


def run_calls(args):
    """The child: --calls forward calls, each timed and followed by a CALL line."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import torch
    from bench_attention import view
    from dma_problem import attach_workspace, dma_problem
    from flash_dma import _abi

    torch.zeros(1, device="cuda")
    lib = _abi.load_library(args.lib)
    if args.dense_keys:  # a dense non-causal call: S queries against that many keys
        torch.manual_seed(0)
        q = torch.randn(1, args.seqlen, args.heads, args.headdim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, args.dense_keys, args.kv_heads, args.headdim, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        out, lse = torch.empty_like(q), torch.empty(1, args.heads, args.seqlen, device="cuda", dtype=torch.float32)
        p = _abi.AttentionParams()
        p.q, p.k, p.v, p.out, p.lse = view(q), view(k), view(v), view(out), view(lse)
        p.stream = torch.cuda.current_stream().cuda_stream
        n = ctypes.c_size_t(0)
        assert lib.fdma_attention_workspace_size(ctypes.byref(p), _abi.PASS_FORWARD, ctypes.byref(n)) == 0
        ws = torch.empty(max(1, n.value), device="cuda", dtype=torch.uint8)
        p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
        forward = lib.fdma_attention_fwd
    else:
        prob = dma_problem(args.seqlen, H=args.heads, Hk=args.kv_heads, D=args.headdim, w=args.window)
        p = prob.params
        ws = attach_workspace([(lib, p)])
        forward = lib.fdma_dma_fwd
    for i in range(args.calls):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        assert forward(ctypes.byref(p)) == 0, lib.fdma_last_error()
        e1.record()
        torch.cuda.synchronize()
        print(f"CALL {i} {e0.elapsed_time(e1):.3f} ms", flush=True)
    del ws


def report(text):
    lines = text.split("\n")
    calls = [i for i, line in enumerate(lines) if line.startswith("CALL ")]
    print(" ".join(lines[i] for i in calls))
    seg = lines[calls[-2]:calls[-1]] if len(calls) >= 2 else lines  # the last call's points
    steps = collections.defaultdict(dict)
    for line in seg:
        if line.startswith("T "):
            cta, group, j, n_blocks, *t = map(int, line.split()[1:])
            steps[cta][(group, j)] = (n_blocks, t)
    if not steps:
        sys.exit("no probe lines: is the library built from the patched tree?")
    phases = collections.defaultdict(list)
    shown = 0
    for cta, m in sorted(steps.items()):
        n_blocks, t0 = m[(0, 0)][0], m[(0, 0)][1][0]

        def rel(x):
            return (x - t0) % 2**32

        rows = []
        for j in range(1, min(n_blocks, 24)):
            if (0, j) not in m or (1, j) not in m:
                continue
            a, b = [rel(x) for x in m[(0, j)][1]], [rel(x) for x in m[(1, j)][1]]
            rows.append((j, a, b))
            if not 2 <= j < n_blocks - 1:  # the middle steps: full tiles, both neighbours full
                continue
            for x in (a, b):
                for k, name in enumerate(["K wait", "V wait", "turn wait", "issue", "S wait", "scores, P V wait",
                                          "softmax, rescale, pack"]):
                    phases[name].append(x[k + 1] - x[k])
            phases["group 1 issues after group 0"].append(b[3] - a[3])
            if (0, j + 1) in m:
                phases["group 0's period"].append(rel(m[(0, j + 1)][1][3]) - a[3])
        if shown < 2 and rows:
            shown += 1
            print(f"CTA {cta} ({n_blocks} key tiles): " + ", ".join(POINTS) + " (cycles)")
            for j, a, b in rows[:6]:
                print(f"  {j:2d} group 0 " + " ".join(f"{x:6d}" for x in a))
                print(f"     group 1 " + " ".join(f"{x:6d}" for x in b))
    print(f"medians (p10, p90) over the middle steps of {len(steps)} CTAs, cycles:")
    for name, v in phases.items():
        v = sorted(v)
        print(f"  {name:30s} {statistics.median(v):7.0f} ({v[len(v) // 10]}, {v[9 * len(v) // 10]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build-probe/libfdma.so")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--dense-keys", type=int, default=0,
                    help="time a dense non-causal call of --seqlen queries against this many keys instead")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_calls(args)
        return
    # Device printf writes to the process's own stdout: a child's, captured whole.
    out = subprocess.run([sys.executable, __file__, "--child"] + sys.argv[1:], capture_output=True, text=True,
                         check=True).stdout
    report(out)


if __name__ == "__main__":
    main()
