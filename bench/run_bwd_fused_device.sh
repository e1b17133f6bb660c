#!/usr/bin/env bash
# The fused-dq backward on a GPU machine in one go: build for Hopper, the attention GPU tests
# (non-deterministic backwards take the fused dq on Hopper: the warp-specialized backward
# without a mask at D 64 and 128, else the dk/dv kernel's), compute-sanitizer (memcheck,
# racecheck, synccheck) over their own tests, then bench_bwd_fused.py (both fused paths against
# the two-kernel backward, SDPA flash and cuDNN); the table prints last. Logs go to $OUT. The
# wgmma primitives' tests run first: WgmmaGpu.FusedDqStep* checks the dq step alone.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
device_gtests 'WgmmaGpu.*:AttentionGpu.*' \
  'WgmmaGpu.FusedDq*:AttentionGpu.FusedDq*:AttentionGpu.WarpSpecializedBackward*'
[ "${BENCH:-1}" = 1 ] || exit 0
timeout 400 python3 bench/bench_bwd_fused.py --lib build/libfdma.so ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
