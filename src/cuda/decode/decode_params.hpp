// The decode path's kernel parameters (docs/decode.md): where the
// cache is, what the selection leaves for the attention, and the split-K partials.
#pragma once

#include <cstdint>

#include "cuda/primitives/fast_divmod.cuh"

namespace fdma::cuda {

// A KV cache as the kernels see it. Contiguous caches have [B, max_len] as their first two
// dims, paged ones [num_pages, page_size] and a block table. Strides are in elements, with
// every cache's (outer, inner, head) strides in that order (the scores' too, whatever their
// declared layout).
struct CacheView {
  const void* k;
  const void* v;
  int64_t k_stride[3], v_stride[3];
  const void* scores;  // null: dense attention
  int score_dtype;     // fdma_dtype: f32, f16 or bf16
  int64_t score_stride[3];
  const int32_t* seqlens;
  int64_t seqlens_stride;
  const int32_t* block_table;  // null: contiguous
  int64_t table_stride[2];
  FastDivmod page_size{1};
  int num_pages;
  int capacity;  // positions per sequence: max_len, or max_pages * page_size
  int Snew;      // tokens appended by this call
  int B, Hk;
};

// One kept key of a (batch, KV head) row: its position, the page that holds it (paged caches;
// the batch otherwise), the queries that keep it, [begin, end) packed as begin | end << 16,
// and its score (the bias, when scores are added).
struct KeptKey {
  int32_t pos;
  int32_t page;
  uint32_t queries;
  float score;
};

// The radix selection's threshold between digit passes (resolve_digit, score_bits.cuh).
struct RadixThreshold {
  uint32_t prefix;   // the threshold's bits found so far
  int32_t need;      // keys still to keep inside the prefix's bucket
  int32_t count_eq;  // keys whose bits equal the final threshold
  int32_t keep_all;  // at most w candidates: keep every one
};

// Per-row state of the radix selection (decode_select.cu), in the workspace, zeroed per call.
struct SelectState {
  RadixThreshold t;
  uint32_t arrived;    // CTAs of the current pass done (the last one resolves the digit)
  int32_t listed;      // entries in the row's kept list
  int32_t pad[2];
};

constexpr int kSelectBins = 2048;     // 11-bit digits
constexpr int kSelectChunk = 4096;    // keys per selection CTA (16 per thread; 16384 measured 2x slower)
constexpr int kSelectThreads = 256;

struct DecodeSelectArgs {
  CacheView cache;
  int Sq, w;
  bool causal;
  int chunks;       // grid.x: chunks of the longest possible row
  int max_candidates;  // the most keys a row's first query may see
  int cluster_items;   // Hopper cluster selection: keys a thread holds
  int list_cap;     // kept-list slots per row: min(w, capacity) + (causal ? Sq - 1 : 0)
  SelectState* state;  // [rows]
  uint32_t* hist;      // [rows][kSelectBins]
  int32_t* eq_count;   // [rows][chunks]
  KeptKey* list;       // [rows][list_cap]
};

// The attention over kept keys: grid (splits, rows, m-tiles); an m-tile packs 16 (query head
// of the group, query) pairs of one KV head.
struct DecodeAttentionArgs {
  CacheView cache;
  const void* q;
  int64_t q_stride[3];  // b, i, h
  void* out;
  int64_t out_stride[3];
  float* lse;  // [B, H, Sq] with lse_stride, or null
  int64_t lse_stride[3];
  int Sq, H, G, D;
  bool causal, add_scores;
  float scale, softcap;  // softcap 0 = off
  const KeptKey* list;  // null: the select_state below, or dense (every cached key)
  // A decode step of one query with a select_state reads its kept keys from the state the
  // selection just wrote (positions at [1, 1 + slots), their scores' bits after them) instead
  // of a list: for one query the list would hold the same keys, twice the bytes.
  const int32_t* kept_state;
  int64_t kept_state_stride[2];  // b, hk
  int kept_state_slots;
  const SelectState* state;  // .listed: the keys in the list or the state
  int list_cap;
  int splits, split_keys;  // keys per split, a multiple of 64
  float* part_out;         // [B * H * Sq][splits][D] when splits > 1
  float* part_lse;         // [B * H * Sq][splits]
};

}  // namespace fdma::cuda
