// Turns raw q.k accumulators of one warp's S fragment into scores: scale, softcap, then
// visibility (key range, causality, mask) and the additive bias, all per element from
// global memory through broadcast strides. Invisible scores become -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"

namespace fdma::cuda {

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

__device__ __forceinline__ int64_t head_index(int mode, int h, int G) { return mode == 2 ? h : mode == 1 ? h / G : 0; }

// softcap(scale * qk), the part of a score before the bias. kSoftcap is the uniform
// `softcap > 0`, fixed per loop by the caller: evaluated per score, both branches of it were
// issued for every score (tanhf included) and the unrolled loops overflowed the instruction cache.
// Under softcap the divisions by softcap are products with its reciprocal, the same expression
// for every score so the compiler computes it once: a division per score was about 10
// instructions plus a slow-path call (SASS of the backward: ~30 instructions per score
// against 8 without softcap).
template <bool kSoftcap>
__device__ __forceinline__ float capped_score(const AttentionFwdParams& p, float qk) {
  if constexpr (kSoftcap) return p.softcap * tanhf(qk * (p.scale * (1.f / p.softcap)));
  return qk * p.scale;
}

// d capped / d qk from the capped value: scale * (1 - tanh^2) under softcap, else scale.
template <bool kSoftcap>
__device__ __forceinline__ float capped_slope(const AttentionFwdParams& p, float capped) {
  if constexpr (kSoftcap) {
    const float t = capped * (1.f / p.softcap);
    return p.scale * (1.f - t * t);
  }
  return p.scale;
}

// Calls f(std::true_type or std::false_type): the uniform `softcap > 0` as a constant.
template <class F>
__device__ __forceinline__ void with_softcap(const AttentionFwdParams& p, F&& f) {
  if (p.softcap > 0.f)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// s = softcap(scale * s) for a whole fragment, one loop per case.
template <int kTilesN>
__device__ __forceinline__ void cap_scores(float (&s)[kTilesN][4], const AttentionFwdParams& p) {
  with_softcap(p, [&](auto softcap) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = capped_score<decltype(softcap)::value>(p, s[nt][e]);
  });
}

// Shared-memory tiles of mask and bias for the current key tile (null when not tiled). Row r
// of a tile is query tile_row0 + r, or the single row of a query-broadcast tensor.
struct ScoreTiles {
  const uint8_t* mask;  // [rows][pitch] bytes
  const void* bias;     // [rows][pitch] elements of the bias dtype
  int mask_pitch, bias_pitch, tile_row0;
  bool mask_bcast_rows, bias_bcast_rows;
  bool mask_keeps_all;  // the mask keeps the whole tile (its summary): nothing to test
};

// Adds the bias (if any) to s and sets s to -inf where the mask hides the score. Each source
// layout gets its own loop, picked once per tile, so the per-score work carries no branches on
// uniform flags (which doubled the instruction count when they sat inside the loop;
// docs/performance.md, "attention forward"). Adding in place, not through an array of terms, keeps 8 * kTilesN
// registers free (the wgmma forward spilled with the array). kGlobalTerms = false compiles out
// the reads through global memory (for masks and biases that cannot be tiled): the wgmma
// forward, which is only launched with tiled terms, spilled in its hot loop with them.
template <class T, class Load, int kTilesN>
__device__ __forceinline__ void add_tile(float (&s)[kTilesN][4], int t, Load&& load) {
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] += load(e >> 1, nt * 8 + 2 * t + (e & 1));
}

// A bias row shared by all query rows (a [.., 1, Sk] bias): each thread's key pair is one
// 4- or 8-byte load, added to both of its rows.
// Two adjacent elements (an even index into a 16-byte aligned row) in one shared-memory load.
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load_pair(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}

template <class E, int kTilesN>
__device__ __forceinline__ void add_key_row(float (&s)[kTilesN][4], const E* row, int t) {
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) {
    const float2 pair = load_pair(row + nt * 8 + 2 * t);
    const float v0 = pair.x, v1 = pair.y;
    s[nt][0] += v0;
    s[nt][1] += v1;
    s[nt][2] += v0;
    s[nt][3] += v1;
  }
}

// s = scale * s + bias of each key, for a bias row shared by all rows: one multiply-add per
// score where capping the scores first and adding the bias after take two.
template <class E, int kTilesN>
__device__ __forceinline__ void scale_add_key_row(float (&s)[kTilesN][4], const E* row, int t, float scale) {
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) {
    const float2 pair = load_pair(row + nt * 8 + 2 * t);
    s[nt][0] = fmaf(s[nt][0], scale, pair.x);
    s[nt][1] = fmaf(s[nt][1], scale, pair.y);
    s[nt][2] = fmaf(s[nt][2], scale, pair.x);
    s[nt][3] = fmaf(s[nt][3], scale, pair.y);
  }
}

// Two adjacent mask bytes (an even offset into a 16-byte aligned tile row) in one load.
__device__ __forceinline__ uint32_t mask_pair(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

template <class T, bool kGlobalTerms, int kTilesN>
__device__ __forceinline__ void add_bias_and_mask(float (&s)[kTilesN][4], const AttentionFwdParams& p,
                                                  const ScoreTiles& tiles, int b, int h, const int (&rows)[2],
                                                  int key0, int t) {
  if (p.bias) {
    if (tiles.bias && tiles.bias_bcast_rows) {  // one value per key column: one load for both rows
      if (p.bias_f32)
        add_key_row(s, static_cast<const float*>(tiles.bias), t);
      else
        add_key_row(s, static_cast<const T*>(tiles.bias), t);
    } else if (tiles.bias) {
      const int r0 = tiles.bias_bcast_rows ? 0 : (rows[0] - tiles.tile_row0) * tiles.bias_pitch;
      const int r1 = tiles.bias_bcast_rows ? 0 : (rows[1] - tiles.tile_row0) * tiles.bias_pitch;
      if (p.bias_f32) {
        const float* tile = static_cast<const float*>(tiles.bias);
        add_tile<T>(s, t, [&](int r, int jl) { return tile[(r ? r1 : r0) + jl]; });
      } else {
        const T* tile = static_cast<const T*>(tiles.bias);
        add_tile<T>(s, t, [&](int r, int jl) { return to_float(tile[(r ? r1 : r0) + jl]); });
      }
    } else if constexpr (kGlobalTerms) {
      const int64_t base = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1];
      // Rows past Sq read row Sq - 1 (in bounds); their scores are discarded anyway.
      const int64_t r0 = base + int64_t(min(rows[0], p.Sq - 1)) * p.bias_stride[2];
      const int64_t r1 = base + int64_t(min(rows[1], p.Sq - 1)) * p.bias_stride[2];
      const int64_t ks = p.bias_stride[3];
      add_tile<T>(s, t, [&](int r, int jl) {
        const int64_t off = (r ? r1 : r0) + int64_t(min(key0 + jl, p.Sk - 1)) * ks;
        return p.bias_f32 ? static_cast<const float*>(p.bias)[off] : to_float(static_cast<const T*>(p.bias)[off]);
      });
    }
  }
  if (p.mask && !tiles.mask_keeps_all) {
    if (tiles.mask) {
      const int r0 = tiles.mask_bcast_rows ? 0 : (rows[0] - tiles.tile_row0) * tiles.mask_pitch;
      const int r1 = tiles.mask_bcast_rows ? 0 : (rows[1] - tiles.tile_row0) * tiles.mask_pitch;
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // the thread's two adjacent keys of a row in one load
          const uint32_t keep = mask_pair(tiles.mask + (r ? r1 : r0) + nt * 8 + 2 * t);
          if (!(keep & 0xff)) s[nt][2 * r] = -INFINITY;
          if (!(keep >> 8)) s[nt][2 * r + 1] = -INFINITY;
        }
    } else if constexpr (kGlobalTerms) {
      const int64_t base = b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1];
      const int64_t r0 = base + int64_t(min(rows[0], p.Sq - 1)) * p.mask_stride[2];
      const int64_t r1 = base + int64_t(min(rows[1], p.Sq - 1)) * p.mask_stride[2];
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = min(key0 + nt * 8 + 2 * t + (e & 1), p.Sk - 1);
          if (!p.mask[((e >> 1) ? r1 : r0) + j * p.mask_stride[3]]) s[nt][e] = -INFINITY;
        }
    }
  }
}

// Whether no bound or causal check can fail on the tile of 16 rows from row0 and 8 * kTilesN
// keys from key0.
template <int kTilesN>
__device__ __forceinline__ bool interior_tile(const AttentionFwdParams& p, int row0, int key0) {
  return row0 + 16 <= p.Sq && key0 + 8 * kTilesN <= p.Sk && (!p.causal || key0 + 8 * kTilesN - 1 <= row0 + p.Sk - p.Sq);
}

// Sets s to -inf where (rows[r], key) is out of range or hidden by causality (layout as
// apply_score_mod's; t = lane % 4).
template <int kTilesN>
__device__ __forceinline__ void hide_out_of_range(float (&s)[kTilesN][4], const AttentionFwdParams& p,
                                                  const int (&rows)[2], int key0, int t) {
  const int last_key_of_row0 = rows[0] + p.Sk - p.Sq;  // causal: j <= i + Sk - Sq
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, j = key0 + nt * 8 + 2 * t + (e & 1);
      const bool visible = rows[r] < p.Sq && j < p.Sk && (!p.causal || j <= last_key_of_row0 + 8 * r);
      if (!visible) s[nt][e] = -INFINITY;
    }
}

// s[nt][e]: n-tile nt (8 keys) of a 16-row fragment; element e covers row g + 8 * (e >= 2) and
// key 2t + (e & 1) within the tile (g = lane / 4, t = lane % 4). Scores become
// softcap(scale * qk) + bias where visible, -inf elsewhere. Interior tiles, where no bound or
// causal check can fail, skip those checks.
template <class T, bool kGlobalTerms, int kTilesN>
__device__ __forceinline__ void apply_score_mod(float (&s)[kTilesN][4], const AttentionFwdParams& p, int b, int h,
                                                int row0, int key0, int lane, const ScoreTiles& tiles) {
  const int g = lane / 4, t = lane % 4;
  const bool interior = interior_tile<kTilesN>(p, row0, key0);
  cap_scores(s, p);
  const int rows[2] = {row0 + g, row0 + g + 8};
  if (p.mask || p.bias) add_bias_and_mask<T, kGlobalTerms>(s, p, tiles, b, h, rows, key0, t);
  if (interior) return;
  hide_out_of_range(s, p, rows, key0, t);
}

// Dynamic-mask mode: the list of kept keys of the lists' query tile that holds row0, the first
// row of a kernel's tile, of (b, hk) (bh = b * Hk + hk), and its length. The kernel's tile is
// that tile or a part of it (KeyLists::tile_rows_log2).
__device__ __forceinline__ const int32_t* tile_key_list(const KeyLists& l, int64_t bh, int row0, int& n_listed) {
  const int tile = l.count_tiles == 1 ? 0 : row0 >> l.tile_rows_log2;
  n_listed = l.counts[bh * l.count_tiles + tile];
  const int64_t first = l.tile_first ? l.tile_first[bh * l.count_tiles + tile] : int64_t(tile) * l.keys_tile_stride;
  return l.keys + bh * l.keys_bh_stride + first;
}

// capped + additive term, where a hidden score is -inf whatever q.k was (a NaN in a key
// row must not reach queries that do not see it).
__device__ __forceinline__ float add_visible(float capped, float add) { return add == -INFINITY ? add : capped + add; }

// Dynamic-mask mode: key column c of the tile (its KeyInfo record in shared memory) is
// visible to query i iff begin <= i < end; visible scores get the key's bias.
__device__ __forceinline__ float interval_add(const KeyInfo& key, int i) {
  return i >= key.begin && i < key.end ? key.bias : -INFINITY;
}

// Whether every one of the tile's kTilesN * 8 keys is kept by all 16 rows [row0, row0 + 16):
// then the fragment needs the keys' biases only, no interval test per score. Most tiles of a
// causal top-w list qualify (a row changes about w / i of its keys), all but those with keys
// whose intervals begin or end among the rows, or padding. Warp-uniform. Begin and end come in
// one load: one load latency before the vote, not two.
template <int kTilesN>
__device__ __forceinline__ bool keys_cover_rows(const KeyInfo* keys, int row0, int lane) {
  bool covers = true;
#pragma unroll
  for (int c = lane; c < kTilesN * 8; c += 32) {
    const int2 interval = *reinterpret_cast<const int2*>(&keys[c].begin);
    covers &= interval.x <= row0 && interval.y >= row0 + 16;
  }
  return __all_sync(0xffffffffu, covers);
}

// Dynamic-mask mode: what a 16-row strip [row0, row0 + 16) needs of a key tile's KeyInfo records
// (shared memory) besides the per-score intervals: the biases of the thread's columns, and
// whether the keys cover the rows (keys_cover_rows). Read apart from the scores so that a
// caller can have them loaded while its S is computed.
template <int kTilesN>
struct KeyTileTerms {
  float bias[kTilesN][2];
  bool covers;  // warp-uniform
};

// kWithBias false: the vote alone (the terms folded into S, KeyLists::bias_chunks).
template <int kTilesN, bool kWithBias = true>
__device__ __forceinline__ KeyTileTerms<kTilesN> load_key_terms(const KeyInfo* keys, int row0, int lane) {
  KeyTileTerms<kTilesN> terms;
  terms.covers = keys_cover_rows<kTilesN>(keys, row0, lane);
  const int t = lane % 4;
  if constexpr (kWithBias)
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) terms.bias[nt][c] = keys[nt * 8 + 2 * t + c].bias;  // one load for both rows
  return terms;
}

// Whether score e of the thread's column tile nt (the mma accumulator layout: row
// row0 + lane / 4 + 8 (e >> 1), key 8 nt + 2 (lane % 4) + (e & 1)) lies in its key's interval;
// begin and end in one load.
__device__ __forceinline__ bool interval_holds(const KeyInfo* keys, int row0, int nt, int e, int lane) {
  const int2 interval = *reinterpret_cast<const int2*>(&keys[nt * 8 + 2 * (lane % 4) + (e & 1)].begin);
  const int i = row0 + lane / 4 + 8 * (e >> 1);
  return i >= interval.x && i < interval.y;
}

// Key column c of the tile is visible to query i iff begin <= i < end; visible scores get the
// key's bias. Under softcap the scores are capped first (the scale inside the cap), then added
// to; without, the scale goes into one multiply-add with the key's term (rounded once).
template <int kTilesN>
__device__ __forceinline__ void apply_interval_mod(float (&s)[kTilesN][4], const AttentionFwdParams& p, int row0,
                                                   const KeyInfo* keys, const KeyTileTerms<kTilesN>& terms,
                                                   int lane) {
  float scale = p.scale;
  if (p.softcap > 0.f) {
    cap_scores(s, p);
    scale = 1.f;
  }
  if (terms.covers) {  // capped + bias as on the CPU, with no hidden-score select
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[nt][c] = fmaf(s[nt][c], scale, terms.bias[nt][c]);
        s[nt][c + 2] = fmaf(s[nt][c + 2], scale, terms.bias[nt][c]);
      }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)  // hidden: -inf whatever q.k was (add_visible)
      s[nt][e] = interval_holds(keys, row0, nt, e, lane) ? fmaf(s[nt][e], scale, terms.bias[nt][e & 1]) : -INFINITY;
}

// The same with the key terms folded into S (KeyLists::bias_chunks): S holds q.k + term / scale,
// unscaled for the softmax's exponent, so only the intervals apply.
template <int kTilesN>
__device__ __forceinline__ void apply_interval_select(float (&s)[kTilesN][4], int row0, const KeyInfo* keys,
                                                      bool covers, int lane) {
  if (covers) return;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)  // hidden: -inf whatever q.k was (add_visible)
      if (!interval_holds(keys, row0, nt, e, lane)) s[nt][e] = -INFINITY;
}

template <int kTilesN>
__device__ __forceinline__ void apply_interval_mod(float (&s)[kTilesN][4], const AttentionFwdParams& p, int row0,
                                                   const KeyInfo* keys, int lane) {
  apply_interval_mod(s, p, row0, keys, load_key_terms<kTilesN>(keys, row0, lane), lane);
}

// The additive term of one score read straight from global memory, for kernels that visit
// scores in other orders than the forward (the backward's transposed tiles): -inf where
// (i, j) is out of range, hidden by causality or by the mask; else the bias (0 without one).
template <class T>
__device__ __forceinline__ float score_add_at(const AttentionFwdParams& p, int b, int h, int i, int j) {
  if (i >= p.Sq || j >= p.Sk || (p.causal && j > i + p.Sk - p.Sq)) return -INFINITY;
  if (p.mask && !p.mask[b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1] +
                        int64_t(i) * p.mask_stride[2] + int64_t(j) * p.mask_stride[3]])
    return -INFINITY;
  if (!p.bias) return 0.f;
  const int64_t off = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1] +
                      int64_t(i) * p.bias_stride[2] + int64_t(j) * p.bias_stride[3];
  return p.bias_f32 ? static_cast<const float*>(p.bias)[off] : to_float(static_cast<const T*>(p.bias)[off]);
}

// Whether (i, j) is in range and not hidden by causality (no mask consulted).
__device__ __forceinline__ bool visible_at(const AttentionFwdParams& p, int i, int j) {
  return i < p.Sq && j < p.Sk && (!p.causal || j <= i + p.Sk - p.Sq);
}
// A bias broadcast over queries and no mask: the additive term depends on the key alone, so
// the backward reads it once per key instead of once per score.
__device__ __forceinline__ bool key_bias_only(const AttentionFwdParams& p) {
  return p.bias && !p.mask && p.bias_stride[2] == 0;
}
// A mask broadcast over queries ([.., 1, Sk]) as key j's additive term: 0 where it keeps the
// key, -inf where not (key j clamped into range as below).
__device__ __forceinline__ float key_mask_at(const AttentionFwdParams& p, int b, int h, int j) {
  const int64_t off = b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1] +
                      int64_t(min(j, p.Sk - 1)) * p.mask_stride[3];
  return __ldg(p.mask + off) ? 0.f : -INFINITY;
}
// That key's bias (key j clamped into range; its scores are hidden anyway when j >= Sk).
template <class T>
__device__ __forceinline__ float key_bias_at(const AttentionFwdParams& p, int b, int h, int j) {
  const int64_t off = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1] +
                      int64_t(min(j, p.Sk - 1)) * p.bias_stride[3];
  return p.bias_f32 ? __ldg(static_cast<const float*>(p.bias) + off)
                    : to_float(__ldg(static_cast<const T*>(p.bias) + off));
}
// The biases of keys key0 + nt * 8 + 2t + c into kb[nt][c], from global memory: the row's base
// and the dtype worked out once, then independent loads (keys clamped as in key_bias_at).
template <class T, int kN>
__device__ __forceinline__ void key_bias_pairs_at(const AttentionFwdParams& p, int b, int h, int key0, int t,
                                                  float (&kb)[kN][2]) {
  const int64_t base = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1];
  auto off = [&](int nt, int c) { return base + int64_t(min(key0 + nt * 8 + 2 * t + c, p.Sk - 1)) * p.bias_stride[3]; };
  if (p.bias_f32) {
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) kb[nt][c] = __ldg(static_cast<const float*>(p.bias) + off(nt, c));
  } else {
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) kb[nt][c] = to_float(__ldg(static_cast<const T*>(p.bias) + off(nt, c)));
  }
}

}  // namespace fdma::cuda
