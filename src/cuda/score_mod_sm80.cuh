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

// s[nt][e]: n-tile nt (8 keys) of a 16-row fragment; element e covers row g + 8 * (e >= 2) and
// key 2t + (e & 1) within the tile (g = lane / 4, t = lane % 4).
template <class T, int kTilesN>
__device__ __forceinline__ void apply_score_mod(float (&s)[kTilesN][4], const AttentionFwdParams& p, int b, int h,
                                                int row0, int key0, int lane, const ScoreTiles& tiles) {
  // Interior tiles of unmasked, unbiased attention: every key visible, only scale/softcap.
  const bool interior = !p.mask && !p.bias && row0 + 16 <= p.Sq && key0 + 8 * kTilesN <= p.Sk &&
                        (!p.causal || key0 + 8 * kTilesN - 1 <= row0 + p.Sk - p.Sq);
  if (interior) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = s[nt][e] * p.scale;
        s[nt][e] = p.softcap > 0.f ? p.softcap * tanhf(x / p.softcap) : x;
      }
    return;
  }
  const int g = lane / 4, t = lane % 4;
  // Row base offsets once per call; each element then adds only j * key stride.
  int rows[2];
  int64_t mask_row[2], bias_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = row0 + g + 8 * r;
    mask_row[r] = b * p.mask_stride[0] + head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1] +
                  int64_t(rows[r]) * p.mask_stride[2];
    bias_row[r] = b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1] +
                  int64_t(rows[r]) * p.bias_stride[2];
  }
  const int last_key_of_row0 = rows[0] + p.Sk - p.Sq;  // causal: j <= i + Sk - Sq
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, i = rows[r];
      const int j = key0 + nt * 8 + 2 * t + (e & 1);
      float x = s[nt][e] * p.scale;
      if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
      bool visible = i < p.Sq && j < p.Sk && (!p.causal || j <= last_key_of_row0 + 8 * r);
      const int jl = j - key0;
      if (visible && p.mask) {
        if (tiles.mask) {
          const int rl = tiles.mask_bcast_rows ? 0 : i - tiles.tile_row0;
          visible = tiles.mask[rl * tiles.mask_pitch + jl] != 0;
        } else {
          visible = p.mask[mask_row[r] + j * p.mask_stride[3]] != 0;
        }
      }
      if (visible && p.bias) {
        if (tiles.bias) {
          const int idx = (tiles.bias_bcast_rows ? 0 : i - tiles.tile_row0) * tiles.bias_pitch + jl;
          x += p.bias_f32 ? static_cast<const float*>(tiles.bias)[idx] : to_float(static_cast<const T*>(tiles.bias)[idx]);
        } else {
          const int64_t off = bias_row[r] + j * p.bias_stride[3];
          x += p.bias_f32 ? static_cast<const float*>(p.bias)[off] : to_float(static_cast<const T*>(p.bias)[off]);
        }
      }
      s[nt][e] = visible ? x : -INFINITY;
    }
}

}  // namespace fdma::cuda
