#!/usr/bin/env bash
# A kernel change against its base on a GPU machine in one go. The base tree is .base/ (here:
# `git archive BASE | tar -x -C .base`, with /.base/ in .git/info/exclude; carried to the
# device). Builds both for Hopper (the base into build-base), runs the GPU tests GTEST_FILTER
# and compute-sanitizer over SAN_FILTER (SANITIZE=0 skips them) on the working tree, then
# bench_switches.py with both libraries alternating in one process (BENCH_ARGS, and
# BENCH_SEED=1 for the seed config too); outputs are checked bitwise between them (gradients
# too, which non-deterministic calls may change in their last bits). Logs go to $OUT; the tables print last. BUILD_ARGS (device_build.sh) builds both trees
# with a subset of the kernels: GTEST_FILTER then names only tests within it.
source "$(dirname "$0")/device_build.sh"
[ -d .base ] || { echo "no .base/ tree"; exit 1; }
BUILD_SRC=.base BUILD_DIR=build-base LOGS=/tmp/base-logs device_build fdma
device_build fdma fdma_gpu_tests
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 FDMA_LIBRARY=$PWD/build/libfdma.so
device_gtests "${GTEST_FILTER:-DmaGpu.*:AttentionGpu.WarpSpecialized*}" "${SAN_FILTER:-DmaGpu.WarpSpecialized*}"
[ "${BENCH:-1}" = 1 ] || exit 0
LIBS=build-base/libfdma.so,build/libfdma.so
timeout 240 python3 bench/bench_switches.py --lib $LIBS --configs ${CONFIGS:-default} ${BENCH_ARGS:---seqlens 16384,32768 --rounds 5} 2>&1 |
  tee "$OUT/bench_ab.log" | tail -8
if [ "${BENCH_SEED:-1}" = 1 ]; then
  timeout 120 python3 bench/bench_switches.py --lib $LIBS --configs ${CONFIGS:-default} --seqlens 32768 --rounds 5 --heads 2 \
    --kv-heads 1 --headdim 64 --window 1024 2>&1 | tee "$OUT/bench_ab_seed.log" | tail -6
fi
