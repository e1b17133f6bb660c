// Where a gathering producer warp's copies go (gather_rows_by_warp, fwd_ws_producers.cuh): the
// map from (lane, pass, copy) to a row of the gathered tile, a 16-byte chunk of that row, and
// the chunk's byte offset in the 128-byte-swizzled tile (wgmma.cuh: chunk c of row r at
// c ^ (r % 8) within its column block). Host and device share it, so that the host tests check
// the kernel's own arithmetic (tests/test_gather_lanes.cpp).
//
// Warp `block` (0..3) fills rows kWarpRows block .. + kWarpRows - 1 of a tile of kRows rows
// (128, or 64 at D = 256). kRowLanes lanes copy a row (4 up to D = 128, 8 at 256), a pass
// kRowsPerPass = 32 / kRowLanes rows: lane (sub = lane / kRowLanes, ch = lane % kRowLanes)
// copies chunks ch, ch + kRowLanes, ... of row kWarpRows block + kRowsPerPass i + sub in pass
// i. Each chunk's place in the swizzle is its column mod 8 XOR the row mod 8, and the row mod
// 8 is a constant of the pass (u = i mod kPhase within a swizzle phase of 8 rows) XOR sub: a
// lane works its base and swizzle out once, and its copies add constants to them.
#pragma once

#include <cstdint>

#include "cuda/primitives/host_device.cuh"

namespace fdma::cuda {

template <int kHeadDim, int kRows>
struct GatherLanes {
  static_assert(kRows == 128 || kRows == 64, "four blocks of 32 or 16 rows");
  static_assert(kHeadDim % 64 == 0, "whole 128-byte column blocks");
  // Four lanes a row spread its index work over more copies; at D = 256 they were slower than
  // 8 (docs/performance.md, "four lanes a gathered row").
  static constexpr int kRowLanes = kHeadDim == 256 ? 8 : 4;
  static constexpr int kLaneChunks = kHeadDim / 8 / kRowLanes;  // copies a lane makes of each row
  static constexpr int kWarpRows = kRows / 4, kRowsPerPass = 32 / kRowLanes, kPasses = kWarpRows / kRowsPerPass;
  static constexpr int kPhase = 8 / kRowsPerPass;  // passes a swizzle phase: their row mod 8 XORs are constants

  // Lane (sub, ch): its row in a pass and its first chunk.
  FDMA_HOST_DEVICE static constexpr int pass_row(int lane) { return lane / kRowLanes; }
  FDMA_HOST_DEVICE static constexpr int first_chunk(int lane) { return lane % kRowLanes; }
  // The lane holding the list entry of pass i's row (gather_rows_by_warp), and that row's place
  // in the tile.
  FDMA_HOST_DEVICE static constexpr int source_lane(int sub, int i) { return i * kRowsPerPass + sub; }
  FDMA_HOST_DEVICE static constexpr int row(int block, int sub, int i) { return kWarpRows * block + source_lane(sub, i); }
  // The row's chunk that copy c copies, and the bytes from copy 0's source to copy c's.
  FDMA_HOST_DEVICE static constexpr int chunk(int ch, int c) { return ch + kRowLanes * c; }
  FDMA_HOST_DEVICE static constexpr int copy_step_bytes(int c) { return kRowLanes * c * 16; }
  // The lane's part of every destination: its row in the pass, and its swizzle.
  FDMA_HOST_DEVICE static constexpr uint32_t lane_base(int block, int sub) {
    return uint32_t((kWarpRows * block + sub) * 128);
  }
  FDMA_HOST_DEVICE static constexpr uint32_t lane_swizzle(int ch, int sub) { return uint32_t(ch ^ sub) << 4; }
  // Copy c of pass i, u = i mod kPhase (a constant where the caller unrolls a phase): the chunk
  // ch + col with ch < kRowLanes dividing col is ch XOR col, so col / 8 names its column block
  // and col % 8 flips its place in the swizzle as the pass's row mod 8 does.
  FDMA_HOST_DEVICE static constexpr uint32_t offset(uint32_t base, uint32_t swizzle, int i, int u, int c) {
    return base + (kRowLanes * c / 8) * kRows * 128 + i * kRowsPerPass * 128 +
           (swizzle ^ (uint32_t(((kRowLanes * c) % 8) ^ ((u * kRowsPerPass) % 8)) << 4));
  }
};

}  // namespace fdma::cuda
