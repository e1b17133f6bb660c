#!/usr/bin/env bash
# The selection on the device: a Hopper build, the selection's GPU tests (both interval-end
# paths) with compute-sanitizer over the causal ones, bench_select.py, then the forward and
# forward+backward against FDMA_SELECT_ENDS=wavelet (bench_switches.py) at B1 H16 Hk4 D128
# w2048 and the seed config. Logs and JSON under $OUT; the tables last.
cd "$(dirname "$0")/.." || exit 1
source bench/device_build.sh
device_build fdma fdma_gpu_tests
device_gtests "SelectGpu.*:VarlenGpu.EverySelectionPath:VarlenGpu.DynamicMaskAttention:DmaGpu.Causal*" \
  "SelectGpu.CausalMatchesTheCpuExactly:SelectGpu.SignedZerosTieByIndex:SelectGpu.WalkEveryKeyHitsSmall"
python3 bench/bench_select.py --seqlens "${SELECT_SEQLENS:-4096,16384,32768,131072}" --rows 1,4,64 \
  >"$OUT/select.log" 2>&1 || tail -5 "$OUT/select.log"
python3 bench/bench_switches.py --configs default,wavelet --seqlens "${SEQLENS:-16384,32768,131072}" --rounds 3 \
  >"$OUT/switches.log" 2>&1 || tail -5 "$OUT/switches.log"
python3 bench/bench_switches.py --configs default,wavelet --seqlens 32768 --rounds 5 --heads 2 --kv-heads 1 \
  --headdim 64 --window 1024 >"$OUT/switches_seed.log" 2>&1 || tail -5 "$OUT/switches_seed.log"
grep -A20 "^| rows" "$OUT/select.log"
grep -A12 "^|" "$OUT/switches.log" | head -20
grep -A8 "^|" "$OUT/switches_seed.log" | head -10
# Kernel times of one forward (ncu, serialised): the seed config, then B1 H16 Hk4 D128 w2048 16K.
if [ "${PROFILE:-1}" = 1 ]; then
  for a in "--heads 2 --kv-heads 1 --headdim 64 --window 1024 --seqlen 32768" "--seqlen 16384"; do
    echo "ncu, forward $a (us):"
    ncu --metrics gpu__time_duration.sum python3 tools/profiling/profile_dma.py --forward-only $a 2>/dev/null |
      grep -E "^  [a-zA-Z_]|gpu__time_duration" | paste - - | awk '{print $1, $2, $NF}' | tail -n 14
  done
fi
