// The plain struct the attention backward kernels read (attention_bwd.cuh). The
// forward's params describe q, k, v, out, lse, mask, bias and the sizes; the rest are the
// gradients and the fp32 arrays the backward keeps in the caller's workspace.
#pragma once

#include <cstdint>

#include "cuda/attention/attention_fwd_params.hpp"

namespace fdma::cuda {

// Backward tiles: 64 query rows x 64 keys for both kernels, so one mask tile summary (64 x 64)
// serves both; the dq kernel walks keys 32 at a time above D = 128 to stay inside registers,
// and the dk/dv kernel writes its output columns in chunks of at most 128.
constexpr int kBwdBlockM = 64, kBwdBlockN = 64;
// The dense backward's row padding: the warp-specialized kernel's 128-query steps at D = 64.
constexpr int kBwdRowPad = 128;
constexpr int bwd_dq_block_n(int head_dim) { return head_dim > 128 ? 32 : 64; }
constexpr int bwd_dkdv_block_m(int head_dim) { return head_dim > 64 ? 32 : 64; }
constexpr int bwd_dkdv_chunk(int head_dim) { return head_dim <= 128 ? head_dim : head_dim / 2; }
// Warp groups per dk/dv CTA (the launcher falls back to two where two one-group CTAs would not
// share an SM). One, so that two CTAs share an SM and one's K/V load and dk/dv stores overlap
// the other's steps: 3-10% faster with a block mask, 5-6% at D = 64 and 192 without one. Two
// for the gathered walk, where a few key groups span every query and halving their walk sets
// the makespan (one measured 23% slower), and for the unmasked wgmma kernel at D = 128 (one
// measured 3-4% slower at 16K). docs/performance.md, "attention backward".
constexpr int bwd_dkdv_groups(int head_dim, bool wgmma, bool gathered, bool masked) {
  return gathered || (wgmma && head_dim == 128 && !masked) ? 2 : 1;
}

// Dynamic-mask mode, the warp-specialized backward (attention_bwd_ws.cuh): key groups of
// kBwdWsKeys kept keys, ranked within windows of kBwdWsWindow (gather_key_group), so
// kBwdWsWindow / kBwdWsKeys groups per window of each (batch, KV head).
constexpr int kBwdWsKeys = 128, kBwdWsWindow = 512;
inline int64_t bwd_ws_groups_per_row(int64_t Sk) {
  return (Sk + kBwdWsWindow - 1) / kBwdWsWindow * (kBwdWsWindow / kBwdWsKeys);
}

// Its work list, written by bwd_ws_plan (dma/bwd_ws_plan.hpp) before the kernel runs. Group g =
// (b * Hk + hk) * groups_per_row + x has its kBwdWsKeys key indices at keys[g * kBwdWsKeys] (-1
// past its size) and its query range in groups[g] (no tiles: empty), and each 64-key half's in
// halves[2 g], halves[2 g + 1] (the D 256 kernel hands the halves out apart). The queries are cut into
// ranges of tiles_per_range 64-row tiles, and an item is a group's walk over one range (G steps
// a tile it spans). Range r's items sit at items[r * n_groups, + counts[r]) in no fixed order; a
// CTA takes the next one of the lowest range with any left, by taken[r] (counts and taken
// zeroed with the fp32 sums), so the CTAs running at a time work on one range of queries and
// their dq sums and Q, dO tiles stay in L2. Each item adds its dk, dv and dscores into the fp32
// rows AttentionBwdParams::dkdv_partial / dscores_partial. An item is handed out as
// bwd_ws_item_parts(D) parts (the D 256 kernel's halves); each part done, or skipped for having no steps, counts once
// in range_done[its range] and group_done[its group], so the finish kernel (dma/bwd_ws_finish.hpp)
// writes out a range's dq rows and a group's dk, dv and dscores rows as soon as no part adds to
// them any more, by finish_taken[r] as the CTAs take items.
struct BwdWsGroup {
  int32_t q_begin, q_tiles, n_keys, pad;  // first query row (a multiple of 64), 64-row tiles, keys
};
struct BwdWsItem {
  int32_t group, range;
};
constexpr int kBwdWsHalfKeys = kBwdWsKeys / 2;
// Parts a plan item is handed out as: 64-key halves at D 256 (the CTA's keys there), else whole.
constexpr int bwd_ws_item_parts(int D) { return D > 128 ? kBwdWsKeys / kBwdWsHalfKeys : 1; }
// The first and last range a group's query tiles meet (last < first: none).
struct BwdWsRanges {
  int first, last;
};
constexpr BwdWsRanges bwd_ws_group_ranges(const BwdWsGroup& g, int tiles_per_range) {
  return g.q_tiles <= 0 ? BwdWsRanges{0, -1}
                        : BwdWsRanges{g.q_begin / 64 / tiles_per_range, (g.q_begin / 64 + g.q_tiles - 1) / tiles_per_range};
}
struct BwdWsPlan {
  int32_t* keys;
  BwdWsGroup *groups, *halves;
  BwdWsItem* items;
  int *counts, *taken;                          // [ranges] each
  int *range_done, *finish_taken, *group_done;  // [ranges], [ranges], [n_groups]
  int tiles_per_range, ranges, groups_per_row, n_groups;
  // The dq sums zeroed in the kernel (bwd_ws_dq_zero.cuh; null: zeroed before it): tiles
  // zeroed per range [ranges], the next tile to claim; 64-row tiles a (batch, head), float4s a tile.
  int *zero_done = nullptr, *zero_next = nullptr;
  int dq_tiles = 0, dq_tile_float4s = 0;
};

// The dq sums' zeroing order (bwd_ws_dq_zero.cuh): range by range, within a range each of the
// `rows` (batch, head) rows' tiles of it in turn. Tile c of that order, and how many a range has.
struct DqZeroTile {
  int range, row, tile;
};
constexpr int dq_zero_tiles_in_range(int r, int rows, int dq_tiles, int tiles_per_range) {
  const int t0 = r * tiles_per_range, left = dq_tiles - t0;
  return rows * (left < 0 ? 0 : left < tiles_per_range ? left : tiles_per_range);
}
constexpr DqZeroTile dq_zero_tile(int c, int rows, int dq_tiles, int tiles_per_range) {
  const int per_range = rows * tiles_per_range, r = c / per_range, local = c - r * per_range;
  const int in_range = dq_zero_tiles_in_range(r, rows, dq_tiles, tiles_per_range) / rows;
  return DqZeroTile{r, local / in_range, r * tiles_per_range + local % in_range};
}

// Who reduces dbias (the CPU backend makes the same split, attention_cpu.cpp).
enum class DbiasOwner : int { none = 0, rows = 1, columns = 2 };

struct AttentionBwdParams {
  AttentionFwdParams f;  // its tile_active is the 64 x 64 summary; mask_tiled/bias_tiled: score_terms_bwd.cuh
  const void* dout;
  void *dq, *dk, *dv;
  int64_t dout_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
  // [B, H, Sq_pad] each: rowsum(dO * O), and lse * log2(e) with -inf (a row that sees
  // nothing) replaced by +inf so that every probability of that row comes out 0.
  float *delta, *lse2;  // written by the prepare kernel, read by dq and dk/dv
  // Sq rounded up to kBwdRowPad (dense calls) or kBwdBlockM (gathered ones, whose steps are 64
  // queries): every step's rows exist.
  int Sq_pad;
  // dbias: owner, its tensor, and the fp32 reduction slots [slots][numel] (dense, in the
  // bias's declared shape) when the owner cannot write it directly.
  DbiasOwner dbias_owner;
  void* dbias;
  bool dbias_f32;
  int64_t dbias_size[4], dbias_stride[4];  // stride 0 on size-1 dims
  float* dbias_acc;
  int dbias_slots;
  // The dq kernel's block walks these many batches and heads in turn (> 1 when it owns a
  // dbias that broadcasts over them, so one block sums each element in a fixed order).
  int rows_batches_per_block, rows_heads_per_block;
  // Dynamic-mask mode: each dk/dv key group's walk over its queries split into dkdv_splits
  // contiguous shares, one CTA each (grid z = B x splits), where the few key groups that every
  // later query keeps would otherwise set the kernel's time alone (docs/performance.md, "small
  // problems"). Each share writes fp32 partial rows, dk then dv, to dkdv_partial
  // [splits][B * Hk][Sk][2 * D] and its dscores to dscores_partial [splits][B * Hk][Sk];
  // dkdv_split_sum (dkdv_split.cu) adds them in split order. 0 or 1: no split.
  int dkdv_splits;
  float *dkdv_partial, *dscores_partial;
  // Fused dq (non-deterministic calls, sm_90a, not gathered, no dbias with a query dim): the
  // dk/dv kernel also reduces each step's dS K into dq_acc [B, H, Sq_pad, D bucket] fp32 (zeroed
  // first, in the caller's workspace) and no dq kernel runs: five matmuls of QK^T's size
  // instead of seven, at the price of the temporary and a sum whose order varies.
  // bwd_dq_convert (gathered: bwd_ws_finish) writes dq from it. Null: the two-kernel backward. Layout: dq_acc_offset,
  // its columns the kernel's head dim (64 or 128: D's bucket).
  float* dq_acc;
  // Dynamic-mask mode with dq_acc: the warp-specialized kernel's work list (BwdWsPlan).
  BwdWsPlan ws;
};

// The fused dq's fp32 sums in tiles of 32 rows x 64 columns, each 8 KB and contiguous, so that a
// warp group adds its step's 64 x D product with D / 32 bulk reductions (tma.cuh): tile
// (row / 32, col / 64) of (batch, head) bh is number (bh * Sq_pad / 32 + row / 32) * cols / 64 +
// col / 64. Within a tile, row r keeps column pair c / 2 at pair (c / 2) ^ (4 * (r % 8)): a
// warp's staging stores (rows g, pairs 4 nt + t) then touch each bank twice, the least for their
// 256 bytes (row-major, all eight rows hit the same banks).
constexpr int kDqAccTileRows = 32, kDqAccTileCols = 64, kDqAccTileBytes = kDqAccTileRows * kDqAccTileCols * 4;
constexpr int dq_acc_in_tile(int r, int c) {
  return r * kDqAccTileCols + 2 * ((c / 2) ^ (4 * (r % 8))) + c % 2;
}
constexpr int64_t dq_acc_offset(int64_t bh, int row, int col, int Sq_pad, int cols) {
  const int64_t tile = (bh * (Sq_pad / kDqAccTileRows) + row / kDqAccTileRows) * (cols / kDqAccTileCols) +
                       col / kDqAccTileCols;
  return tile * (kDqAccTileRows * kDqAccTileCols) + dq_acc_in_tile(row % kDqAccTileRows, col % kDqAccTileCols);
}

}  // namespace fdma::cuda
