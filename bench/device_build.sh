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
