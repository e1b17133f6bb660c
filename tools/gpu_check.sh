#!/usr/bin/env bash
# The GPU checks in one command, on a machine with an NVIDIA GPU (CONTRIBUTING.md): build for
# the GPU's architecture, every GPU suite, the Python tests on CUDA, then compute-sanitizer's
# memcheck, racecheck, initcheck and synccheck over GPU tests chosen to finish in a few
# minutes. Prints one table last; logs go to $OUT (default /tmp/fdma_gpu_check).
#
#   tools/gpu_check.sh                       # everything
#   STAGES="memcheck racecheck" tools/gpu_check.sh   # some of: build gtest pytest memcheck racecheck initcheck synccheck
#
# GoogleTest may be carried in .devdeps/gtest (include/, lib/) where the machine lacks it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fdma_gpu_check}
STAGES=${STAGES:-"build gtest pytest memcheck racecheck initcheck synccheck"}
mkdir -p "$OUT"

# Sanitizer filters: the kernels of every path (training forward and backward, masks, the
# selection, lists, the backward's setup, decode, prefill, empty problems, the warp-specialized
# forward, the fused dq and the copy primitives) on problems small enough for the tools.
MEMCHECK='BwdSetupGpu.*:KvCacheGpu.OutOfRange*:KvCacheGpu.ChunkedPrefillLoop*:KvCacheGpu.SelectStateDecodeLoops:KvCacheGpu.Overlapped*:DmaGpu.FewQueriesEitherPath:DmaGpu.BackwardIsBitwiseDeterministic:DmaGpu.MadeUp*:AttentionGpu.BackwardIsBitwiseDeterministic:AttentionGpu.BlockSparseMaskSkipsEmptyTiles:AttentionGpu.EmptyProblems:MaskSummaryGpu.*:NextActiveGpu.*:AttentionGpu.WarpSpecialized*:DmaGpu.WarpSpecialized*:TmaGpu.*:AttentionGpu.FusedDq*:SelectGpu.WalkEveryKeyHitsSmall'
RACECHECK='BwdSetupGpu.*:KvCacheGpu.SelectStateRebuilds*:KvCacheGpu.ChunkedPrefillLoop*:DmaGpu.BackwardIsBitwiseDeterministic:AttentionGpu.BackwardIsBitwiseDeterministic:AttentionGpu.WarpSpecialized*:DmaGpu.WarpSpecialized*:AttentionGpu.FusedDq*:SelectGpu.WalkEveryKeyHitsSmall'
INITCHECK='DmaGpu.HeadDims:AttentionGpu.HeadDims:KvCacheGpu.SelectStateDecodeLoops'
SYNCCHECK='BwdSetupGpu.*:KvCacheGpu.SelectStateDecodeLoops:KvCacheGpu.ChunkedPrefillLoop*:DmaGpu.BackwardIsBitwiseDeterministic:AttentionGpu.BackwardIsBitwiseDeterministic:AttentionGpu.WarpSpecialized*:DmaGpu.WarpSpecialized*:AttentionGpu.FusedDq*:SelectGpu.WalkEveryKeyHitsSmall'

rows=()
row() { rows+=("| $1 | $2 | $3 s |"); }
want() { [[ " $STAGES " == *" $1 "* ]]; }

if want build; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
  arch=${ARCH:-${cc:-90}}
  [ "$arch" = 90 ] && arch=90a  # Hopper's wgmma kernels need the arch-specific target
  GT=()
  [ -d .devdeps/gtest ] && GT=(-DGTEST_ROOT="$PWD/.devdeps/gtest")
  t0=$(date +%s)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DFDMA_CUDA_LINEINFO=OFF "${GT[@]}" >"$OUT/cmake.log" 2>&1 &&
    cmake --build build -j "$(nproc)" --target fdma fdma_gpu_tests fdma_cli >"$OUT/build.log" 2>&1
  rc=$?
  row "build (sm_$arch)" "$([ $rc = 0 ] && echo ok || echo "FAILED, $OUT/build.log")" $(( $(date +%s) - t0 ))
  [ $rc = 0 ] || { printf '%s\n' "${rows[@]}"; exit 1; }
fi
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1

if want gtest; then
  t0=$(date +%s)
  build/tests/fdma_gpu_tests >"$OUT/gtest.log" 2>&1
  rc=$?
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$OUT/gtest.log" | grep -oE '[0-9]+$')
  failed=$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/gtest.log")
  row "GPU suites" "$([ $rc = 0 ] && echo "${passed:-0} passed" || echo "$failed failed, $OUT/gtest.log")" $(( $(date +%s) - t0 ))
fi

if want pytest; then
  t0=$(date +%s)
  python3 -m pytest tests/python --device cuda -q >"$OUT/pytest.log" 2>&1
  rc=$?
  row "Python tests on CUDA" "$(tail -1 "$OUT/pytest.log" | sed 's/ in [0-9.]*s//')$([ $rc = 0 ] || echo ", $OUT/pytest.log")" \
    $(( $(date +%s) - t0 ))
fi

sanitize() {  # tool, filter
  local t0 rc summary
  t0=$(date +%s)
  compute-sanitizer --tool "$1" --error-exitcode 9 build/tests/fdma_gpu_tests --gtest_filter="$2" >"$OUT/$1.log" 2>&1
  rc=$?
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$1.log" | tail -1 | sed 's/^========= //')
  local tests
  tests=$(grep -cE '^\[       OK \]' "$OUT/$1.log")
  row "compute-sanitizer $1 ($tests tests)" "$([ $rc = 0 ] && echo "${summary:-ok}" || echo "rc $rc: ${summary}, $OUT/$1.log")" \
    $(( $(date +%s) - t0 ))
}
want memcheck && sanitize memcheck "$MEMCHECK"
want racecheck && sanitize racecheck "$RACECHECK"
want initcheck && sanitize initcheck "$INITCHECK"
want synccheck && sanitize synccheck "$SYNCCHECK"

echo
echo "| check | result | time |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
