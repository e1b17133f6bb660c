#!/usr/bin/env bash
# The warp-specialized forward on a GPU machine in one go: build for Hopper, the attention and
# dynamic-mask GPU tests, compute-sanitizer (memcheck, racecheck, synccheck) over its tests,
# then bench_fwd_ws.py (dense) and bench_switches.py (dynamic mask, against FDMA_FWD_WS=0);
# the tables print last. Logs go to $OUT.
source "$(dirname "$0")/device_build.sh"
device_build fdma fdma_gpu_tests
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
device_gtests 'AttentionGpu.*:DmaGpu.*' \
  'AttentionGpu.WarpSpecialized*:DmaGpu.WarpSpecialized*'
[ "${BENCH:-1}" = 1 ] || exit 0
timeout 200 python3 bench/bench_switches.py --configs default,cpasync --seqlens 16384,32768 --rounds 3 2>&1 |
  tee "$OUT/bench_dma.log" | tail -6
timeout 100 python3 bench/bench_switches.py --configs default,cpasync --seqlens 32768 --rounds 3 --heads 2 \
  --kv-heads 1 --headdim 64 --window 1024 2>&1 | tee "$OUT/bench_seed.log" | tail -4
timeout 300 python3 bench/bench_fwd_ws.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -12
