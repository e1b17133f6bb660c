// The warp-specialized forward's producer group (attention_fwd_ws.cuh): the copy-issuing
// thread of dense and scored calls (Q, then each key tile's K with its terms and V, by the copy
// engine), the helper warps that lay a mask over its bias tile, and the gathering warps of
// gathered calls (the listed keys' rows and records by cp.async).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/fwd_ws_gather_lanes.cuh"
#include "cuda/attention/fwd_ws_shape.cuh"
#include "cuda/attention/mask_over_bias_sm90.cuh"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm90.cuh"
#include "cuda/primitives/tma.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// The copy-issuing thread's loads (dense and scored calls): Q once onto q_full.
template <class Shape>
__device__ __forceinline__ void fwd_ws_load_q(const FwdTensorMaps& maps, uint32_t base, int row0, int h, int b) {
  using Mma = typename Shape::Mma;
  mbar::arrive_expect_tx(Shape::q_full(base), Mma::kQBytes);
#pragma unroll
  for (int c = 0; c < Shape::kColBlocks; ++c)
    tma::load_4d(base + Shape::kQ + c * Mma::kBlockBytesQ, &maps.q, Shape::q_full(base), c * 64, row0, h, b);
}

// The j-th key tile the CTA walks (keys from key0) into its stage, each buffer once the
// consumers have released what it held: K with the tile's terms, which load_terms(stage, full
// barrier) issues and which bring term_bytes, then V.
template <class Shape, class LoadTerms>
__device__ __forceinline__ void fwd_ws_load_kv(const FwdTensorMaps& maps, uint32_t base, int j, int key0, int hk,
                                               int b, int term_bytes, LoadTerms&& load_terms) {
  using Mma = typename Shape::Mma;
  static_assert(Shape::kVStages == Shape::kStages, "copy-engine calls keep K and V in one ring");
  const int s = j % Shape::kStages;
  const uint32_t free_parity = ((j / Shape::kStages) & 1) ^ 1;  // the first pass finds every stage free
  const uint32_t k_full = Shape::k_full(base, s), v_full = Shape::v_full(base, s);
  mbar::wait(Shape::k_empty(base, s), free_parity);
  mbar::arrive_expect_tx(k_full, Mma::kKVBytes + term_bytes);
  load_terms(s, k_full);
#pragma unroll
  for (int c = 0; c < Shape::kColBlocks; ++c)
    tma::load_4d(Shape::k_tile(base, s) + c * Mma::kBlockBytesKV, &maps.k, k_full, c * 64, key0, hk, b);
  mbar::wait(Shape::v_empty(base, s), free_parity);
  mbar::arrive_expect_tx(v_full, Mma::kKVBytes);
#pragma unroll
  for (int c = 0; c < Shape::kColBlocks; ++c)
    tma::load_4d(Shape::v_tile(base, s) + c * Mma::kBlockBytesKV, &maps.v, v_full, c * 64, key0, hk, b);
}

// The copy-issuing thread of a dense call: Q, then K(j) and V(j) for every key tile.
// With a per-key bias (bias_bytes > 0), each K copy brings the tile's bias row along: row
// (bias_batch, bias_head) of the bias map.
template <class Shape>
__device__ __forceinline__ void fwd_ws_produce_tma(const FwdTensorMaps& maps, uint32_t base, int n_blocks, int row0,
                                                   int h, int hk, int b, int bias_bytes, int bias_head,
                                                   int bias_batch) {
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.k);
  tma::prefetch_map(&maps.v);
  if (bias_bytes) tma::prefetch_map(&maps.bias);
  if (n_blocks == 0) return;  // the consumers wait for nothing: no copy may outlive the CTA
  fwd_ws_load_q<Shape>(maps, base, row0, h, b);
  for (int j = 0; j < n_blocks; ++j) {
    const int key0 = j * Shape::kBlockN;
    fwd_ws_load_kv<Shape>(maps, base, j, key0, hk, b, bias_bytes, [&](int s, uint32_t full) {
      if (bias_bytes) tma::load_3d(base + Shape::bias_offset(s), &maps.bias, full, key0, bias_head, bias_batch);
    });
  }
}

// The copy-issuing thread of a scored call: as fwd_ws_produce_tma over the key tiles of `walk`,
// each K copy bringing the tile's mask (unless the summary keeps the tile whole) and bias with
// it: as a tile of the CTA's 128 rows, or one row shared by every query row.
template <class Shape, class Walk>
__device__ __forceinline__ void fwd_ws_produce_scored(const AttentionFwdParams& p, const FwdTensorMaps& maps,
                                                      uint32_t base, const Walk& walk, int first, int row0, int h,
                                                      int hk, int b) {
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.k);
  tma::prefetch_map(&maps.v);
  if (p.mask) tma::prefetch_map(&maps.mask);
  if (p.bias) tma::prefetch_map(&maps.bias);
  if (first >= walk.n_blocks) return;  // the consumers wait for nothing: no copy may outlive the CTA
  const FwdWsTerms<Shape> terms(p);
  const int mask_head = int(head_index(p.mask_head_mode, h, p.G)), mask_batch = p.mask_stride[0] == 0 ? 0 : b;
  const int bias_head = int(head_index(p.bias_head_mode, h, p.G)), bias_batch = p.bias_stride[0] == 0 ? 0 : b;
  fwd_ws_load_q<Shape>(maps, base, row0, h, b);
  for (int j = 0, nb = first; nb < walk.n_blocks; ++j, nb = walk.next(nb + 1)) {
    const int key0 = nb * Shape::kBlockN;
    const bool mask_all = walk.tiles.keeps_all(nb);
    if constexpr (Shape::kMaskOverBias)  // into L2 while the stage drains, for the helper warps' loads
      if (!mask_all) tma::prefetch_4d(&maps.mask, key0, row0, mask_head, mask_batch);
    fwd_ws_load_kv<Shape>(maps, base, j, key0, hk, b, terms.copy_bytes(mask_all), [&](int s, uint32_t full) {
      if (terms.mask_tile && !mask_all)
        tma::load_4d(base + terms.mask_tile_at(s), &maps.mask, full, key0, row0, mask_head, mask_batch);
      if (terms.mask_row && !mask_all)
        tma::load_3d(base + terms.mask_row_at(s), &maps.mask, full, key0, mask_head, mask_batch);
      if (terms.bias_tile)
        for (int c = 0; c < Shape::kBlockN / 64; ++c)
          tma::load_4d(base + terms.bias_tile_at(s) + c * Shape::kBlockM * 128, &maps.bias, full, key0 + c * 64, row0,
                       bias_head, bias_batch);
      if (terms.bias_row) tma::load_3d(base + terms.bias_row_at(s), &maps.bias, full, key0, bias_head, bias_batch);
    });
  }
}

// Mask over bias: the producer group's warps 1-3 (`a` 0..95) over the key tiles of `walk`,
// beside the copy-issuing thread: once a tile's copies landed, -inf over the bias terms its
// mask drops (mask_over_bias_sm90.cuh; none where the summary keeps the tile whole), then an
// arrival on the stage's ready barrier, which the consumers wait on before reading the terms.
// They wait for every tile's copies, so that they arrive once per use of the stage.
template <class T, class Shape, class Walk>
__device__ __forceinline__ void fwd_ws_lay_masks(const AttentionFwdParams& p, uint32_t base, const Walk& walk,
                                                 int first, int row0, int h, int b, int a) {
  const FwdWsTerms<Shape> terms(p);
  const uint8_t* mask = p.mask + b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1];
  for (int j = 0, nb = first; nb < walk.n_blocks; ++j, nb = walk.next(nb + 1)) {
    const int s = j % Shape::kStages;
    const uint32_t parity = (j / Shape::kStages) & 1;
    auto wait_landed = [&] { mbar::wait(Shape::k_full(base, s), parity); };
    if (walk.tiles.keeps_all(nb))
      wait_landed();
    else
      lay_mask_over_bias<T, Shape::kBlockM, Shape::kBlockN, kMaskHelperThreads>(p, mask, row0, nb * Shape::kBlockN,
                                                                 base + terms.bias_tile_at(s), wait_landed, a);
    mbar::arrive(Shape::ready(base, s));  // releases the writes to the consumers
  }
}

// Gathered rows into a swizzled tile of kRows rows (128, or 64 at D = 256), by one producer warp:
// its quarter of them, rows kRows / 4 * block .. + kRows / 4 - 1, lane l holding the list index
// of the quarter's row l (-1 past the list, and in lanes past the quarter), so that each index
// is one coalesced load per tile, handed to the lanes copying its row by shuffles. Which lane
// copies which chunk of which row, and where it goes: GatherLanes (fwd_ws_gather_lanes.cuh).
// A row costs a lane one shuffle, one wide multiply-add and its copies: the producer's issue
// slots are shared with the consumers' softmax on every scheduler. kFullRows: the call's D is
// kHeadDim, so no chunk is padding (no test per chunk).
template <int kHeadDim, int kRows, bool kFullRows, class T>
__device__ __forceinline__ void gather_rows_by_warp(uint32_t smem, const T* base, int32_t row_bytes, int32_t row_idx,
                                                    int block, int lane, int D) {
  using L = GatherLanes<kHeadDim, kRows>;
  constexpr int kUnroll = L::kRowLanes == 8 ? 1 : L::kPasses / L::kPhase;  // as measured: unrolled at 4 lanes, not 8
  const int ch = L::first_chunk(lane), sub = L::pass_row(lane);
  const char* src = reinterpret_cast<const char*>(base) + L::chunk(ch, 0) * 16;
  // Head-dim padding: zeros.
  bool in_row[L::kLaneChunks];
#pragma unroll
  for (int c = 0; c < L::kLaneChunks; ++c) in_row[c] = kFullRows || L::chunk(ch, c) * 8 < D;
  const uint32_t dst = smem + L::lane_base(block, sub), swz = L::lane_swizzle(ch, sub);
#pragma unroll kUnroll
  for (int i0 = 0; i0 < L::kPasses; i0 += L::kPhase) {
#pragma unroll
    for (int u = 0; u < L::kPhase; ++u) {
      const int i = i0 + u;
      const int32_t idx = __shfl_sync(0xffffffffu, row_idx, L::source_lane(sub, i));
      const uint64_t offset = uint64_t(uint32_t(max(idx, 0))) * uint32_t(row_bytes);  // one wide multiply-add
#pragma unroll
      for (int c = 0; c < L::kLaneChunks; ++c)
        ptx::cp_async_16(L::offset(dst, swz, i, u, c), src + offset + L::copy_step_bytes(c),
                         idx >= 0 && in_row[c] ? 16 : 0);
    }
  }
}

// The gathering producer group (128 threads, `tid` 0..127): Q's rows, then for every key tile
// the listed keys' K rows with their KeyInfo records (and, where the call folds, their term
// chunks), and their V rows, with cp.async; each thread arrives on a buffer's full barrier when
// its own copies have landed.
template <class T, int kHeadDim, class Shape>
__device__ __forceinline__ void fwd_ws_produce_gather(const AttentionFwdParams& p, uint32_t base, const int32_t* list,
                                                      int n_listed, int n_blocks, int row0, int h, int hk, int b,
                                                      int tid, bool fold) {
  if (n_blocks == 0) return;
  constexpr int kN = Shape::kBlockN, kWarpRows = kN / 4;
  const int warp = tid / 32, lane = tid % 32;
  // This lane's row of a tile: the list entry it loads for its warp's rows (gather_rows_by_warp),
  // and the row whose KeyInfo record (and term chunk) it copies. At 64-key tiles only the first
  // 16 lanes of a warp hold one.
  const int row = kWarpRows * warp + lane;
  const bool has_row = kWarpRows == 32 || lane < kWarpRows;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[2];
  const KeyInfo* info = p.lists.info + (int64_t(b) * p.Hk + hk) * p.Sk;
  const BiasChunk* chunks = fold ? p.lists.bias_chunks + (int64_t(b) * p.Hk + hk) * p.Sk : nullptr;
  // Row strides in bytes fit 32 bits (attention_fwd_ws_applies).
  const int32_t k_row_bytes = int32_t(p.k_stride[1] * int64_t(sizeof(T)));
  const int32_t v_row_bytes = int32_t(p.v_stride[1] * int64_t(sizeof(T)));
  // The first tile's list entry before Q's copies, so that its load's latency runs under them;
  // each later tile's once the tile before it is issued.
  int32_t idx = has_row && row < n_listed ? list[row] : -1;
  load_rows_sw128_async<128, kHeadDim, Shape::kBlockM>(base + Shape::kQ, q, p.q_stride[1], row0, p.Sq, p.D, tid);
  mbar::arrive_on_cp_async(Shape::q_full(base));
  // At D = 256 rows of exactly kHeadDim columns copy every chunk, in a loop of their own with no
  // per-chunk padding test: ptxas then keeps the loop's addresses in registers (no local reloads)
  // and the forward gains 3-5%. At D = 128 the second copy of the loop costs registers (spills
  // 32 -> 36 bytes) and the forward lost 4%, so there one loop serves every width.
  auto tiles = [&](auto full_rows) {
    constexpr bool kFull = decltype(full_rows)::value;
    for (int j = 0; j < n_blocks; ++j) {
      const int s = j % Shape::kStages, sv = j % Shape::kVStages;
      const uint32_t free_parity = ((j / Shape::kStages) & 1) ^ 1, v_free_parity = ((j / Shape::kVStages) & 1) ^ 1;
      mbar::wait(Shape::k_empty(base, s), free_parity);
      gather_rows_by_warp<kHeadDim, kN, kFull>(Shape::k_tile(base, s), k, k_row_bytes, idx, warp, lane, p.D);
      if (has_row)
        ptx::cp_async_16(base + Shape::info_offset(s) + row * 16, idx >= 0 ? info + idx : info, idx >= 0 ? 16 : 0);
      if (Shape::kFold && fold)  // the row's chunk 0 of the term slice (zeros past the list; every lane has a row)
        ptx::cp_async_16(Shape::k_term_tile(base, s) + wgmma::sw32_offset(row, 0),
                         idx >= 0 ? static_cast<const void*>(chunks + idx) : static_cast<const void*>(info),
                         idx >= 0 ? 16 : 0);
      mbar::arrive_on_cp_async(Shape::k_full(base, s));
      mbar::wait(Shape::v_empty(base, sv), v_free_parity);
      gather_rows_by_warp<kHeadDim, kN, kFull>(Shape::v_tile(base, sv), v, v_row_bytes, idx, warp, lane, p.D);
      mbar::arrive_on_cp_async(Shape::v_full(base, sv));
      const int key = (j + 1) * kN + row;  // the next tile's list entry of this lane's row
      idx = has_row && key < n_listed ? list[key] : -1;
    }
  };
  if (kHeadDim == 256 && p.D == kHeadDim)
    tiles(std::true_type{});
  else
    tiles(std::false_type{});
}

}  // namespace fdma::cuda
