#!/usr/bin/env bash
# The warp-specialized forward on a GPU machine in one go: build for Hopper, the attention GPU
# tests, compute-sanitizer (memcheck, racecheck, synccheck) over its test, then
# bench_fwd_ws.py; the benchmark's table prints last. Logs go to $OUT.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 300 build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-AttentionGpu.*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" "$OUT/gtest.log" | head -20
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    FDMA_FWD_WS=1 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/fdma_gpu_tests \
      --gtest_filter='AttentionGpu.WarpSpecialized*' >"$OUT/$tool.log" 2>&1
    echo "$tool rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
fi
[ "${BENCH:-1}" = 1 ] && timeout 300 python3 bench/bench_fwd_ws.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
