#!/usr/bin/env bash
# The decode path on a GPU machine in one go: build for Hopper (sm_90a only, no line tables),
# the KV-cache GPU tests, compute-sanitizer memcheck over the decode kernels, the Python tests
# on CUDA, then bench_decode.py; the benchmark's table prints last. Logs go to $OUT.
# GoogleTest may be carried in .devdeps/gtest (include/, lib/) where the machine lacks it.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests fdma_cli
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-KvCache*}" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|error" "$OUT/gtest.log" | head -20
if [ "${SANITIZE:-1}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/fdma_gpu_tests \
    --gtest_filter='KvCacheGpu.OutOfRange*:KvCacheGpu.Speculative*:KvCacheGpu.Dense*:KvCacheGpu.SelectState*:KvCacheGpu.Float16*:KvCacheGpu.ChunkedPrefill*' \
    >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/fdma_gpu_tests \
    --gtest_filter='KvCacheGpu.Speculative*:KvCacheGpu.SelectStateRebuilds*:KvCacheGpu.SelectStateAfter*:KvCacheGpu.SelectStateSplitRows:KvCacheGpu.ChunkedPrefillLoop*' \
    >"$OUT/racecheck.log" 2>&1
  echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
for st in 1 0; do  # the main job's decode variant on the GPU, with and without a select_state
  build/fdma decode --cache 32768 --steps 4 --batch 4 --heads 8 --kv-heads 2 --headdim 128 --window 1024 \
    --page-size 64 --state $st >"$OUT/fdma_decode_state$st.log" 2>&1
  echo "fdma decode --state $st rc $?: $(grep -E 'median|result' "$OUT/fdma_decode_state$st.log" | tr -s ' ' | tr '\n' ' ')"
done
python3 -m pytest tests/python/test_kvcache.py tests/python/test_doge_integration.py --device cuda -q -x \
  >"$OUT/pytest.log" 2>&1
echo "pytest rc $?: $(tail -1 "$OUT/pytest.log")"
grep -E "^E |Error" "$OUT/pytest.log" | head -10
[ "${BENCH:-1}" = 1 ] && python3 bench/bench_decode.py --json "$OUT/decode.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -14
