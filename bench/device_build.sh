# Sourced by the run_*_device.sh scripts: $OUT for logs, then a Hopper build (sm_90a only, no
# line tables) of the targets given, its time printed. GoogleTest may be carried in .devdeps/gtest.
set -uo pipefail
OUT=${OUT:-/tmp/fdma_out}
mkdir -p "$OUT"
# BUILD_SRC and BUILD_DIR (default . and build) build another tree, LOGS (default $OUT) where
# its logs go. BUILD_ARGS: more cmake arguments, as a timing run's subset of the kernels
# (BUILD_ARGS="-DFDMA_CUDA_HEAD_DIMS=64;128 -DFDMA_CUDA_DTYPES=bf16": a sixth of the
# kernels, 81 s on 2 cores; calls at other head dims or dtypes fail on such a build).
device_build() {
  local gt=() extra=() src=${BUILD_SRC:-.} dir=${BUILD_DIR:-build} logs=${LOGS:-$OUT}
  [ -d .devdeps/gtest ] && gt=(-DGTEST_ROOT="$PWD/.devdeps/gtest")
  read -r -a extra <<<"${BUILD_ARGS:-}"
  mkdir -p "$logs"
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFDMA_CUDA_LINEINFO=OFF "${gt[@]}" "${extra[@]}" >"$logs/cmake.log" 2>&1 || { tail -20 "$logs/cmake.log"; exit 1; }
  local start
  start=$(date +%s)
  cmake --build "$dir" -j "$(nproc)" --target "$@" >"$logs/build.log" 2>&1 ||
    { grep -E "error|Error" "$logs/build.log" | head -30; exit 1; }
  echo "build $dir: $(( $(date +%s) - start )) s"
}

# device_gtests FILTER SAN_FILTER: the GPU tests FILTER ($GTEST_FILTER overrides), then memcheck,
# racecheck and synccheck over SAN_FILTER ($SAN_FILTER overrides; SANITIZE=0 skips them).
device_gtests() {
  timeout 400 build/tests/fdma_gpu_tests --gtest_filter="${GTEST_FILTER:-$1}" >"$OUT/gtest.log" 2>&1
  echo "gtest rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.log" | tr '\n' ' ')"
  grep -E "Failure|FAILED|error" "$OUT/gtest.log" | head -20
  [ "${SANITIZE:-1}" = 1 ] || return 0
  local tool
  for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/fdma_gpu_tests \
      --gtest_filter="${SAN_FILTER:-$2}" >"$OUT/$tool.log" 2>&1
    echo "$tool rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
}
