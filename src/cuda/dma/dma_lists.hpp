// From the selection's intervals to what the dynamic-mask kernels walk (KeyLists):
//   key records: per key {begin, end, bias};
//   kept list:   per (batch, KV head) the keys with a non-empty interval, in index order;
//   bias chunks: forward only, per kept key its term / scale as three bf16 (KeyLists::bias_chunks);
//   tile lists:  causal calls and packed batches, per query tile of block_m rows the kept keys some row of the tile
//                keeps (at most min(w, Sk) + block_m of them; docs/design.md, "Per-tile key lists"): those kept by
//                every row of the tile first, then the others, each part in index order.
//                With checkpoints (DmaListShape::checkpoint_tiles), every C tiles a checkpoint
//                list first: the kept keys below the checkpoint row's causal limit still kept
//                at that row (at most min(w, Sk) in a selection's intervals), so that a tile
//                scans its checkpoint's list and the kept keys from that limit on, not every
//                kept key below its rows;
//                Non-causal selections keep the same keys for every query, so every tile
//                reads the kept list itself;
//   tile ranges: dense packed batches (attention_varlen.cu), in place of tile lists: a query tile
//                keeps every key its rows' sequences let it see, so its list is a slice of the
//                kept list, (first, count) per tile, with no per-tile copy of O(Sq * Sk / block_m);
//   by end:      backward only, the space for the kept keys ordered by the tile of their
//                interval end, which bwd_setup.hpp fills beside the backward's zeroing.
// Everything lives in the caller's workspace; no host synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/primitives/path_switches.hpp"

namespace fdma::cuda {

struct DmaListShape {
  int B, Hk, Sk, Sq;
  int64_t window;
  bool tile_lists;  // per query tile (causal calls, and every packed batch: its sequences keep different keys)
  int block_m;  // query rows per tile of the lists, a power of two (kFwdListBlockM forward, kBwdBlockM backward)
  bool by_end;  // space for the kept keys ordered by interval end (the backward's key groups, bwd_setup.hpp)
  bool tile_ranges = false;  // dense packed batches: per query tile a slice of the kept list (above)
  bool fold_bias = false;    // the forward's folded key terms (KeyLists::bias_chunks, fold_off)
  bool causal = false;       // tile ranges: end each tile's slice at its last row's causal limit
  // A packed variable-length batch (fdma.h, "varlen"), seen as one batch (B = 1, Sq = total_q,
  // Sk = total_k): the caller's intervals are in query indices of each key's sequence and the
  // records get packed ones; a query tile may meet several sequences, each keeping at most
  // min(w, max_k) keys (plus one a row, causal), and at most min(num_seqs, block_m) of them.
  const int32_t *cu_q = nullptr, *cu_k = nullptr;
  int num_seqs = 0, max_k = 0;
  // Tiles a checkpoint list (0: none; tile lists of one sequence only, tile_checkpoints).
  int checkpoint_tiles = 0;
  __host__ __device__ int q_tiles() const { return (Sq + block_m - 1) / block_m; }
  __host__ __device__ int checkpoints() const {
    return checkpoint_tiles > 0 ? (q_tiles() + checkpoint_tiles - 1) / checkpoint_tiles : 0;
  }
  // The most keys one query row keeps.
  __host__ __device__ int64_t row_keeps() const { return window < Sk ? window : Sk; }
  // A checkpoint list's room: one row's keys. A list that would hold more (the caller's own
  // intervals) is marked overflowed and its tiles scan the whole kept list.
  __host__ __device__ int64_t checkpoint_cap() const { return row_keeps(); }
  __host__ __device__ int64_t cap() const {
    const int64_t w = row_keeps();
    if (!cu_k) return w + block_m;
    const int64_t per_seq = window < max_k ? window : max_k, seqs = num_seqs < block_m ? num_seqs : block_m;
    const int64_t most = per_seq * seqs + block_m;
    return most < int64_t(Sk) ? most : Sk;
  }
  __host__ __device__ int64_t keys() const { return int64_t(B) * Hk * Sk; }
};

// Whether a forward's lists carry the folded key terms (KeyLists::bias_chunks): calls that the
// warp-specialized gathered forward may take in bf16 at D 64 or 128 (head_dim: the kernels'
// bucket) with no softcap (the term is added after the cap) and a positive scale (unscaled
// scores keep their order). Decided by the problem alone, so that a workspace query and its
// call agree; where another forward kernel runs, the chunks go unread.
inline bool lists_fold_bias(bool forward, bool bf16, double softcap, double scale, int head_dim) {
  return forward && bf16 && softcap == 0 && scale > 0 && (head_dim == 64 || head_dim == 128) && fold_bias_allowed();
}

// Query rows per tile of a forward's lists (DmaListShape::block_m), at every head dim: the
// warp-specialized gathered kernel's tiles (D 64, 128 and 256). The cp.async kernel's 64-row tiles
// at D 192 and 256 read the list of the tile holding their rows (KeyLists::tile_rows_log2), at most 64
// keys more than their rows keep, so that one list serves both kernels and a call's lists never
// depend on the kernel that reads them.
constexpr int kFwdListBlockM = 128;

// The tiles a checkpoint list serves for a call's tile lists (DmaListShape::checkpoint_tiles):
// FDMA_TILE_CHECKPOINTS where set, else 8 for calls of 1024 tiles or more (B * Hk * tiles:
// fewer run in one wave of the tile kernel, where a checkpoint launch only adds its own scan);
// none for packed batches (their tiles start their scans at their sequences' keys) or where the
// lists have a single checkpoint's worth of tiles.
int tile_checkpoints(const DmaListShape& s);

// The records and the kept list go by blocks of kListBlockKeys consecutive keys of a row:
// each block's kept keys are counted, and placed after those of the row's earlier blocks.
constexpr int kListBlockKeysLog2 = 10, kListBlockKeys = 1 << kListBlockKeysLog2;
__host__ __device__ inline int list_blocks_per_row(int Sk) {
  return Sk > kListBlockKeys ? (Sk + kListBlockKeys - 1) / kListBlockKeys : 1;
}

struct DmaListScratch {
  KeyInfo* info;                 // [B * Hk * Sk]
  int32_t* block_counts;         // [B * Hk * blocks a row]: kept keys of each block of a row (dma_lists.cu)
  int32_t *kept, *kept_count;    // [B * Hk * Sk], [B * Hk]
  int2* kept_span;                  // tile lists: [B * Hk * Sk], (begin, end) of each kept key, kept order
  int32_t *tile_keys, *tile_count;  // tile lists: [B * Hk * q_tiles * cap], [B * Hk * q_tiles]
  int32_t* checkpoint_keys;         // checkpoints: [B * Hk * checkpoints * checkpoint_cap]
  int2* checkpoint_spans;           //   and each key's (begin, end)
  int2* checkpoint_meta;            //   [B * Hk * checkpoints]: (keys listed or -1: overflowed,
                                    //   kept keys below the checkpoint's limit)
  int32_t* tile_first;              // tile ranges: [B * Hk * q_tiles] (and tile_count)
  BiasChunk* bias_chunks;           // fold_bias: [B * Hk * Sk]
  int32_t* fold_off;                // fold_bias: one word
  int32_t* kept_by_end;  // by_end: [B * Hk * Sk], filled by bwd_setup
};

// Workspace bytes for the pieces above (256-byte aligned, in that order).
size_t dma_lists_workspace(const DmaListShape& s);
DmaListScratch carve_dma_lists(void* base, const DmaListShape& s);

struct DmaListInputs {
  const int32_t *begin, *end;  // [B, Hk, Sk] intervals from the selection (or the caller)
  int64_t begin_stride[3], end_stride[3];
  const void* scores;          // key_scores [B, Hk, Sk]
  int score_dtype;             // fdma_dtype
  int64_t score_stride[3];
  bool add_scores;
  float scale;  // fold_bias: the call's softmax scale (the chunks hold bias / scale)
  // The selection has counted each block's kept keys into the scratch's block_counts and
  // zeroed fold_off (KeptCounts, select_topw.cuh): one launch then writes records and kept list.
  bool counted = false;
};

// Builds records, kept list and (causal) tile lists; fills `lists` to point at them. overlap:
// each kernel may start while its predecessor finishes (launch.cuh).
cudaError_t build_dma_lists(const DmaListShape& s, const DmaListInputs& in, const DmaListScratch& scratch,
                            KeyLists& lists, cudaStream_t stream, bool overlap = false);

// Non-causal forward: every query keeps the same kept keys, so their K/V rows and biases are
// copied once into dense [B, Hk, W, D] / [B, Hk, W] buffers (W = min(w, Sk) slots; slots past
// a row's kept count get zero rows and a -inf bias) for the dense attention kernel, whose
// per-key bias streams through shared memory (docs/performance.md, "attention backward").
struct KeptGatherArgs {
  const void *k, *v;
  int64_t k_stride[3], v_stride[3];  // (batch, seq, head), elements
  int D, elem_bytes, W;
  void *k_out, *v_out;  // [B, Hk, W, D] contiguous
  float* bias_out;      // [B, Hk, W]
};
cudaError_t gather_kept_keys(const DmaListShape& s, const KeyLists& lists, const KeptGatherArgs& g,
                             cudaStream_t stream);

}  // namespace fdma::cuda
