#!/usr/bin/env bash
# Packed variable-length batches on a GPU machine in one go: build for Hopper (sm_90a only, no
# line tables), the GPU tests of the varlen and dynamic-mask paths, compute-sanitizer memcheck
# and racecheck over the varlen tests, the Python tests on CUDA, then bench_varlen.py (its table
# prints last). Logs go to $OUT. GoogleTest may be carried in .devdeps/gtest.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-VarlenGpu*:DmaGpu*:SelectGpu*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" -A4 "$OUT/gtest.log" | head -40
if [ "${SANITIZE:-1}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/fdma_gpu_tests \
    --gtest_filter='VarlenGpu.BadOffsetsStayInBounds:VarlenGpu.EverySelectionPath' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/fdma_gpu_tests \
    --gtest_filter='VarlenGpu.BadOffsetsStayInBounds' >"$OUT/racecheck.log" 2>&1
  echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
python3 -m pytest tests/python/test_varlen.py tests/python/test_flash_dma.py --device cuda -q -x >"$OUT/pytest.log" 2>&1
echo "pytest rc $?: $(tail -1 "$OUT/pytest.log")"
grep -E "^E |Error" "$OUT/pytest.log" | head -10
[ "${BENCH:-1}" = 1 ] && python3 bench/bench_varlen.py --json "$OUT/varlen.json" 2>&1 | tee "$OUT/bench.log" | tail -5
