# Sourced by the run_*_device.sh scripts: $OUT for logs, then a Hopper build (sm_90a only, no
# line tables) of the targets given, its time printed. GoogleTest may be carried in .devdeps/gtest.
set -uo pipefail
OUT=${OUT:-/tmp/fdma_out}
mkdir -p "$OUT"
device_build() {
  local gt=()
  [ -d .devdeps/gtest ] && gt=(-DGTEST_ROOT="$PWD/.devdeps/gtest")
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFDMA_CUDA_LINEINFO=OFF \
    "${gt[@]}" >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
  local start
  start=$(date +%s)
  cmake --build build -j "$(nproc)" --target "$@" >"$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
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
