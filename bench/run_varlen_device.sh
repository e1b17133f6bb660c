#!/usr/bin/env bash
# Packed variable-length batches on a GPU machine in one go: build for Hopper (sm_90a only, no
# line tables), the GPU tests of the varlen and dynamic-mask paths, compute-sanitizer memcheck
# and racecheck over the varlen tests that feed bad offsets, the Python tests on CUDA, then
# bench_varlen.py (its tables print last). Logs go to $OUT. GoogleTest may be carried in
# .devdeps/gtest. Narrower runs: GTEST_FILTER, SANITIZE=0, RACECHECK=0, PYTEST_FILES, BENCH=0,
# BENCH_ARGS (for example "--only dense").
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-VarlenGpu*:DmaGpu*:SelectGpu*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" -A4 "$OUT/gtest.log" | head -40
bad_offsets='VarlenGpu.BadOffsetsStayInBounds:VarlenGpu.AttentionBadOffsetsStayInBounds'
if [ "${SANITIZE:-1}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/fdma_gpu_tests \
    --gtest_filter="${MEMCHECK_FILTER:-$bad_offsets:VarlenGpu.EverySelectionPath}" >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  if [ "${RACECHECK:-1}" = 1 ]; then
    compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/fdma_gpu_tests \
      --gtest_filter="$bad_offsets" >"$OUT/racecheck.log" 2>&1
    echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  fi
fi
# shellcheck disable=SC2086
python3 -m pytest ${PYTEST_FILES:-tests/python/test_varlen.py tests/python/test_flash_dma.py} --device cuda -q -x \
  >"$OUT/pytest.log" 2>&1
echo "pytest rc $?: $(tail -1 "$OUT/pytest.log")"
grep -E "^E |Error" "$OUT/pytest.log" | head -10
# shellcheck disable=SC2086
[ "${BENCH:-1}" = 1 ] && python3 bench/bench_varlen.py --json "$OUT/varlen.json" --dense-json "$OUT/varlen_dense.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
