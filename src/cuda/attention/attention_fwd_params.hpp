// The plain struct the attention forward kernel reads: pointers, sizes, element strides
// (0 on broadcast dims), flags. Filled on the host from a validated AttentionProblem.
#pragma once

#include <cstdint>

namespace fdma::cuda {

// Dynamic-mask mode (dma_cuda.cu): instead of keys 0..Sk-1, each query tile walks a list of
// the keys its queries keep, gathering their K/V rows, and key j is visible to query i iff
// info[j].begin <= i < info[j].end (the selection's interval, causality included), with
// info[j].bias (the key's score, or 0) added. Null `keys`: ordinary attention.
struct KeyInfo {
  int32_t begin, end;
  float bias;
  int32_t pad;  // 16 bytes: one cp.async per key
};
// A key's term folded into S (KeyLists::bias_chunks): eight bf16, the first three its term /
// scale split exactly (hi, mid, lo), the rest zero; 16 bytes, one cp.async.
struct alignas(16) BiasChunk {
  uint32_t words[4];
};
struct KeyLists {
  const int32_t* keys;  // per (b * Hk + hk, query tile): key indices (dma_lists.hpp: order)
  int64_t keys_bh_stride, keys_tile_stride;  // elements; tile stride 0: one list for all tiles
  // Tile ranges (dense packed batches, dma_lists.hpp): a tile's list is the slice of the
  // (b, hk) list starting at tile_first[(b * Hk + hk) * count_tiles + tile]; null: tile * keys_tile_stride.
  const int32_t* tile_first;
  const int32_t* counts;                     // [(b * Hk + hk) * count_tiles + tile]
  int count_tiles;                           // 1 when every tile shares the list
  // Query rows per tile of the lists, 2^tile_rows_log2 (a shift, not a division, in each CTA's
  // prologue). A kernel whose query tiles are narrower reads the list of the tile holding its
  // rows: a superset of the keys they keep, which their intervals sort out.
  int tile_rows_log2;
  int max_listed;                            // tile lists: the most keys the kernels stage (longer ones stay in global memory)
  const KeyInfo* info;                       // [B * Hk, Sk]
  // The warp-specialized gathered forward (bf16) folds each key's term into S = Q K^T: one more
  // 16-column slice of the product, Q's columns (1, 1, 1, 0, ...) against the key's chunk
  // (hi, mid, lo, 0, ...), the three bf16 terms that sum to its bias / scale, so that scores come
  // out unscaled and take no add. Null where the lists were built without them. fold_off: set
  // (nonzero) when some kept key's bias / scale does not fit the fold (beyond 2^100): such calls
  // take the scaled multiply-add instead, since the fold would overflow or round them.
  const BiasChunk* bias_chunks;              // [B * Hk, Sk]
  const int32_t* fold_off;
  // dk/dv: the kept keys of each (b, hk) in index order, and the same keys ordered by the tile
  // of their interval end (latest first, then index; written by bwd_setup.hpp), which the
  // backward cuts into key groups (bwd_key_groups.cuh, bwd_ws_plan.cu).
  const int32_t *kept, *kept_count;  // [B * Hk, Sk], [B * Hk]
  int32_t* kept_by_end;              // [B * Hk, Sk]: the first kept_count of each row are set
  void* dscores;  // optional [B, Hk, Sk] gradient of the scores (float32 or q's dtype)
  bool dscores_f32;
  int64_t dscores_stride[3];
};

// The forward copies a tile's list of key indices into shared memory before walking it when
// every list fits in this many keys: a gathered row's index is then a shared-memory read
// rather than a global load in front of each cp.async.
constexpr int kMaxStagedKeys = 8192;
// The next-active table (next_active.cuh): two bytes per key tile of the kernel and one more,
// then 32 ints of scratch; up to 4096 tiles.
constexpr int kMaxNextActiveTiles = 4096;
constexpr int next_active_table_bytes(int tiles) { return ((tiles + 1) * 2 + 15) / 16 * 16 + 32 * 4; }
constexpr int staged_list_bytes(const KeyLists& l) {  // constexpr: callable from device code too
  return l.keys && l.max_listed <= kMaxStagedKeys ? (l.max_listed * 4 + 15) / 16 * 16 : 0;
}

constexpr uint8_t kTileSome = 1, kTileAll = 2;  // mask tile summary bits

struct AttentionFwdParams {
  const void *q, *k, *v;
  void* out;
  float* lse;  // optional
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3], lse_stride[3];  // (batch, seq, head) / lse (b, h, i)
  const uint8_t* mask;  // optional; [b, head, i, j] strides
  int64_t mask_stride[4];
  int mask_head_mode;  // 0 shared, 1 per KV head, 2 per query head
  const void* bias;    // optional
  bool bias_f32;       // else q's dtype
  int64_t bias_stride[4];
  int bias_head_mode;
  // Tiles of mask/bias stream through shared memory with K/V when their rows allow 16-byte
  // copies (key stride 1, aligned rows); otherwise each score reads global memory itself.
  bool mask_tiled, bias_tiled;
  // Per (mask batch, mask head, query tile, key tile): kTileSome if the mask keeps any key
  // there, | kTileAll if it keeps all (mask_tile_summary.cu). Null without a mask. Tiles of
  // zero are skipped whole; tiles of all run as if unmasked.
  const uint8_t* tile_active;
  int active_batches, active_heads;    // the mask's own batch and head counts
  int active_q_tiles, active_k_tiles;  // 1 when the mask broadcasts over that dim
  // Walk the active key tiles through a table in shared memory built from the CTA's summary row
  // first (next_active.cuh, next_active_bytes), not a loop of global loads per step.
  // On by default (FDMA_NEXT_ACTIVE_TABLE=0 turns it off; the 1/8 block mask's forward+backward
  // went 6.35 -> 4.31 ms at 16K on the H100); the launch drops it where the shared memory
  // would not fit.
  bool next_active_table;
  int B, Sq, Sk, H, Hk, G, D;
  float scale, softcap;
  bool causal;  // false in dynamic-mask mode: the intervals carry causality
  KeyLists lists;
  // Dynamic-mask mode on Hopper: a list's last key tile runs 32 or 64 keys wide when it holds
  // no more (attention_fwd.cuh); on unless FDMA_FWD_LAST_TILE=full (dma_cuda.cu).
  bool narrow_last_tile;
  // Host side: launch the kernel overlapping the previous one in the stream (launch.cuh).
  bool overlap_previous;
};

// Shared-memory bytes of the next-active table for a kernel walking key tiles of block_n keys
// (next_active_table), 0 without one. A summary with one key tile (the mask broadcast over
// keys) needs none: its walk stops at the first tile it checks.
constexpr int next_active_bytes(const AttentionFwdParams& p, int block_n) {  // constexpr: device code too
  const int tiles = (p.Sk + block_n - 1) / block_n;
  return p.next_active_table && p.tile_active && p.active_k_tiles > 1 && tiles <= kMaxNextActiveTiles
             ? next_active_table_bytes(tiles)
             : 0;
}

}  // namespace fdma::cuda
