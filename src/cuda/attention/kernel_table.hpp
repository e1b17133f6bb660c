// Which compiled kernel runs a head dim: one constexpr function for host code and tests.
// The list of instantiations itself lives in CMakeLists.txt (FDMA_CUDA_HEAD_DIMS x dtypes);
// CMake generates one .cu per entry and the X-macro list `kernel_list.inc` that dispatch
// expands, so the two can never drift.
#pragma once

namespace fdma::cuda {

// The smallest compiled head dim >= D (D <= 256), or 0 when none fits.
constexpr int head_dim_bucket(int D) {
  return D <= 0 ? 0 : D <= 32 ? 32 : D <= 64 ? 64 : D <= 96 ? 96 : D <= 128 ? 128 : D <= 192 ? 192 : D <= 256 ? 256 : 0;
}

// Forward tile shape per compiled head dim, shared by the kernel (FwdMmaSm80), the mask
// summary and the host. Two m16 tiles per warp up to D = 128 (4 warps: 128 rows), one above;
// 32-key tiles at D = 128 where two m-tiles sit at the register limit.
constexpr int fwd_m_tiles_per_warp(int head_dim) { return head_dim <= 128 ? 2 : 1; }
constexpr int fwd_block_m(int head_dim) { return 16 * fwd_m_tiles_per_warp(head_dim) * 4; }
#ifndef FDMA_TUNE_BLOCK_N_D128  // build-time override for tuning runs (docs/performance.md, "attention forward")
#define FDMA_TUNE_BLOCK_N_D128 32
#endif
constexpr int fwd_block_n(int head_dim) { return head_dim == 128 ? FDMA_TUNE_BLOCK_N_D128 : 64; }

}  // namespace fdma::cuda
