#!/usr/bin/env bash
# The warp-specialized forward on a GPU machine in one go: build for Hopper, the attention and
# dynamic-mask GPU tests, compute-sanitizer (memcheck, racecheck, synccheck) over its tests,
# then bench_fwd_ws.py (dense) and bench_switches.py (dynamic mask, against FDMA_FWD_WS=0);
# the tables print last. Logs go to $OUT.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 400 build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-AttentionGpu.*:DmaGpu.*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" "$OUT/gtest.log" | head -20
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/fdma_gpu_tests \
      --gtest_filter="${SAN_FILTER:-AttentionGpu.WarpSpecialized*:DmaGpu.WarpSpecialized*}" >"$OUT/$tool.log" 2>&1
    echo "$tool rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
fi
[ "${BENCH:-1}" = 1 ] || exit 0
timeout 200 python3 bench/bench_switches.py --configs default,cpasync --seqlens 16384,32768 --rounds 3 2>&1 |
  tee "$OUT/bench_dma.log" | tail -6
timeout 100 python3 bench/bench_switches.py --configs default,cpasync --seqlens 32768 --rounds 3 --heads 2 \
  --kv-heads 1 --headdim 64 --window 1024 2>&1 | tee "$OUT/bench_seed.log" | tail -4
timeout 300 python3 bench/bench_fwd_ws.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
