// Turns raw q.k accumulators of one warp's S fragment into scores: scale, softcap, then
// visibility (key range, causality, mask) and the additive bias, all per element from
// global memory through broadcast strides. Invisible scores become -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention_fwd_params.hpp"

namespace fdma::cuda {

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

__device__ __forceinline__ int64_t head_index(int mode, int h, int G) { return mode == 2 ? h : mode == 1 ? h / G : 0; }

// Shared-memory tiles of mask and bias for the current key tile (null when not tiled). Row r
// of a tile is query tile_row0 + r, or the single row of a query-broadcast tensor.
struct ScoreTiles {
  const uint8_t* mask;  // [rows][pitch] bytes
  const void* bias;     // [rows][pitch] elements of the bias dtype
  int mask_pitch, bias_pitch, tile_row0;
  bool mask_bcast_rows, bias_bcast_rows;
};

// Bias value of tile element (row rl, key jl) from shared memory or, untiled, global memory.
template <class T>
__device__ __forceinline__ float load_bias(const AttentionFwdParams& p, const ScoreTiles& tiles, int rl, int jl,
                                           int64_t global_row, int j) {
  if (tiles.bias) {
    const int idx = (tiles.bias_bcast_rows ? 0 : rl) * tiles.bias_pitch + jl;
    return p.bias_f32 ? static_cast<const float*>(tiles.bias)[idx] : to_float(static_cast<const T*>(tiles.bias)[idx]);
  }
  const int64_t off = global_row + j * p.bias_stride[3];
  return p.bias_f32 ? static_cast<const float*>(p.bias)[off] : to_float(static_cast<const T*>(p.bias)[off]);
}

__device__ __forceinline__ bool load_mask(const AttentionFwdParams& p, const ScoreTiles& tiles, int rl, int jl,
                                          int64_t global_row, int j) {
  if (tiles.mask) return tiles.mask[(tiles.mask_bcast_rows ? 0 : rl) * tiles.mask_pitch + jl] != 0;
  return p.mask[global_row + j * p.mask_stride[3]] != 0;
}

// s[nt][e]: n-tile nt (8 keys) of a 16-row fragment; element e covers row g + 8 * (e >= 2) and
// key 2t + (e & 1) within the tile (g = lane / 4, t = lane % 4). Scores become
// softcap(scale * qk) + bias where visible, -inf elsewhere. Per-score instructions are what
// this costs (comparable to the mma time at D = 128), so interior tiles, where no bound or
// causal check can fail, skip those checks.
template <class T, int kTilesN>
__device__ __forceinline__ void apply_score_mod(float (&s)[kTilesN][4], const AttentionFwdParams& p, int b, int h,
                                                int row0, int key0, int lane, const ScoreTiles& tiles) {
  const int g = lane / 4, t = lane % 4;
  const bool interior = row0 + 16 <= p.Sq && key0 + 8 * kTilesN <= p.Sk &&
                        (!p.causal || key0 + 8 * kTilesN - 1 <= row0 + p.Sk - p.Sq);
  if (interior && !p.mask && !p.bias) {  // dense attention's common case
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = s[nt][e] * p.scale;
        s[nt][e] = p.softcap > 0.f ? p.softcap * tanhf(x / p.softcap) : x;
      }
    return;
  }
  int rows[2], rl[2];
  int64_t mask_row[2] = {0, 0}, bias_row[2] = {0, 0};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = row0 + g + 8 * r;
    rl[r] = rows[r] - tiles.tile_row0;
    if (p.mask && !tiles.mask)
      mask_row[r] = b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1] +
                    int64_t(rows[r]) * p.mask_stride[2];
    if (p.bias && !tiles.bias)
      bias_row[r] = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1] +
                    int64_t(rows[r]) * p.bias_stride[2];
  }
  const int last_key_of_row0 = rows[0] + p.Sk - p.Sq;  // causal: j <= i + Sk - Sq
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, jl = nt * 8 + 2 * t + (e & 1), j = key0 + jl;
      float x = s[nt][e] * p.scale;
      if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
      bool visible = interior || (rows[r] < p.Sq && j < p.Sk && (!p.causal || j <= last_key_of_row0 + 8 * r));
      if (p.mask) visible = visible && load_mask(p, tiles, rl[r], jl, mask_row[r], j);
      if (p.bias && visible) x += load_bias<T>(p, tiles, rl[r], jl, bias_row[r], j);
      s[nt][e] = visible ? x : -INFINITY;
    }
}

}  // namespace fdma::cuda
