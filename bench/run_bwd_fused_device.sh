#!/usr/bin/env bash
# The fused-dq backward on a GPU machine in one go: build for Hopper, the attention GPU tests
# (non-deterministic backwards take the fused dq on Hopper), compute-sanitizer (memcheck,
# racecheck, synccheck) over its own test, then bench_bwd_fused.py (fused against the
# two-kernel backward, SDPA flash and cuDNN); the table prints last. Logs go to $OUT. The wgmma
# primitives' tests run first: WgmmaGpu.FusedDqStep* checks the dq step alone.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 400 build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-WgmmaGpu.*:AttentionGpu.*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" "$OUT/gtest.log" | head -20
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/fdma_gpu_tests \
      --gtest_filter="${SAN_FILTER:-WgmmaGpu.FusedDq*:AttentionGpu.FusedDq*}" >"$OUT/$tool.log" 2>&1
    echo "$tool rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
fi
[ "${BENCH:-1}" = 1 ] || exit 0
timeout 400 python3 bench/bench_bwd_fused.py --lib build/libfdma.so ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
