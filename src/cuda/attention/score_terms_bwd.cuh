// The backward's mask and bias tiles. A window [queries][keys] of the mask (bytes) and of the
// bias streams through shared memory with the step's other operands (K/V in the dq kernel,
// Q/dO in the dk/dv kernel), so interior scores read their additive term from shared memory
// instead of global memory per score (which made the backward of a 4-D top-w mask 13x its
// forward; docs/performance.md, "attention backward"). Rows of a tile are queries in both kernels; a query-broadcast
// mask has one row. A query-broadcast bias's per-key values the kernels hold in registers
// (BiasTerm::key): the dq kernel reads them from a one-row tile (kKeyRow; from global memory
// per tile, those loads stalled it), the dk/dv kernel, whose keys stay for all its steps,
// from global memory once per head (measured slower through the tile; docs/performance.md, "attention backward").
#pragma once

#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

// Where a score's bias comes from on the tiled path.
enum class BiasTerm : int { none = 0, key = 1, tile = 2 };

// The host sets mask_tiled / bias_tiled for the backward (attention_cuda.cu: a bias with a
// query dim only in q's dtype) and clears them when the tiles would not fit.
template <int kRows, int kKeys, bool kKeyRow>
struct TermTiles {
  static constexpr int kMaskPitch = kKeys + 16;  // bytes; the padding spreads rows over banks
  static constexpr int kBiasPitch = kKeys + 8;   // elements of 2 bytes (a tile with a query dim)
  __host__ __device__ static bool mask_bcast(const AttentionFwdParams& p) { return p.mask_stride[2] == 0; }
  __host__ __device__ static bool bias_bcast(const AttentionFwdParams& p) { return p.bias_stride[2] == 0; }
  __host__ __device__ static int mask_bytes(const AttentionFwdParams& p) {
    return p.mask_tiled ? (mask_bcast(p) ? 1 : kRows) * kMaskPitch : 0;
  }
  // Whether the kernel tiles the bias (the host's choice, and a key row only with kKeyRow).
  __host__ __device__ static bool bias_in_tiles(const AttentionFwdParams& p) {
    return p.bias_tiled && (kKeyRow || !bias_bcast(p));
  }
  __host__ __device__ static int bias_bytes(const AttentionFwdParams& p) {
    if (!bias_in_tiles(p)) return 0;
    return bias_bcast(p) ? kKeys * (p.bias_f32 ? 4 : 2) : kRows * kBiasPitch * 2;
  }
  __host__ __device__ static int bytes(const AttentionFwdParams& p) { return mask_bytes(p) + bias_bytes(p); }

  // Where (b, h)'s mask and bias start (element [b, h, 0, 0]), worked out once per head: the
  // head arithmetic per tile cost the dq kernel a few percent (docs/performance.md, "attention backward").
  struct Rows {
    const char* mask;
    const char* bias;
  };
  __device__ static Rows rows_of(const AttentionFwdParams& p, int b, int h) {
    Rows r{nullptr, nullptr};
    if (p.mask_tiled)
      r.mask = reinterpret_cast<const char*>(p.mask) + b * p.mask_stride[0] +
               head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1];
    if (bias_in_tiles(p))
      r.bias = static_cast<const char*>(p.bias) +
               (b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1]) * (p.bias_f32 ? 4 : 2);
    return r;
  }

  // Issues the cp.async copies of queries [q0, q0 + kRows) x keys [key0, key0 + kKeys) of the
  // head at `at` into one buffer of bytes(p); rows and keys past the ends are zero-filled. No
  // mask tile where the mask keeps the whole tile (mask_all; the kernel then tests nothing).
  template <int kThreads>
  __device__ static void load(unsigned char* smem, const AttentionFwdParams& p, const Rows& at, int q0, int key0,
                              int tid, bool mask_all) {
    const int rows = min(kRows, p.Sq - q0), keys = min(kKeys, p.Sk - key0);
    if (p.mask_tiled && !mask_all) {
      const uint32_t dst = ptx::smem_addr(smem);
      const char* src = at.mask + key0;
      if (mask_bcast(p))
        load_bytes_window_async<kThreads, 1, kKeys>(dst, kMaskPitch, src, 0, 1, keys, tid);
      else
        load_bytes_window_async<kThreads, kRows, kKeys>(dst, kMaskPitch, src + q0 * p.mask_stride[2], p.mask_stride[2],
                                                        rows, keys, tid);
    }
    if (bias_in_tiles(p)) {
      const uint32_t dst = ptx::smem_addr(smem + mask_bytes(p));
      if (bias_bcast(p) && p.bias_f32)
        load_bytes_window_async<kThreads, 1, kKeys * 4>(dst, 0, at.bias + key0 * 4, 0, 1, keys * 4, tid);
      else if (bias_bcast(p))
        load_bytes_window_async<kThreads, 1, kKeys * 2>(dst, 0, at.bias + key0 * 2, 0, 1, keys * 2, tid);
      else
        load_bytes_window_async<kThreads, kRows, kKeys * 2>(dst, kBiasPitch * 2,
                                                            at.bias + (q0 * p.bias_stride[2] + key0) * 2,
                                                            p.bias_stride[2] * 2, rows, keys * 2, tid);
    }
  }
  // The bias tile of a buffer with a query dim (bias_tiled, q's dtype).
  template <class T>
  __device__ static const T* bias_tile(const unsigned char* smem, const AttentionFwdParams& p) {
    return reinterpret_cast<const T*>(smem + mask_bytes(p));
  }
  // The biases of keys nt * 8 + 2t and nt * 8 + 2t + 1 of a buffer's query-broadcast row
  // (kKeyRow, bias_tiled) into kb[nt][0..1]: one load per pair, and the dtype chosen once, so
  // that the loads issue back to back (a branch per key cost the dq kernel 1.7x its dense time;
  // docs/performance.md, "attention backward").
  template <class T, int kN>
  __device__ static void key_bias_pairs(const unsigned char* smem, const AttentionFwdParams& p, int t,
                                        float (&kb)[kN][2]) {
    auto take = [&](const auto* row) {
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const float2 v = load_pair(row + nt * 8 + 2 * t);
        kb[nt][0] = v.x, kb[nt][1] = v.y;
      }
    };
    const unsigned char* row = smem + mask_bytes(p);
    if (p.bias_f32)
      take(reinterpret_cast<const float*>(row));
    else
      take(reinterpret_cast<const T*>(row));
  }
};

// The additive term of one score on the tiled path: -inf where the mask hides it (`keep`, its
// mask byte, read only with kMask), else the bias from its tile (`bias` points at the score's
// element), the key's value in registers, or 0.
template <bool kMask, BiasTerm kBias, class T>
__device__ __forceinline__ float tile_term(uint32_t keep, const T* bias, float key_bias) {
  if constexpr (kMask)
    if (!keep) return -INFINITY;
  if constexpr (kBias == BiasTerm::tile) return to_float(*bias);
  if constexpr (kBias == BiasTerm::key) return key_bias;
  return 0.f;
}

// Calls f(mask, bias) with the uniform `mask present` and bias source as constants, so each
// combination gets its own unrolled loop (docs/performance.md, "attention backward": no uniform branches per score).
template <class F>
__device__ __forceinline__ void with_terms(bool mask, BiasTerm bias, F&& f) {
  auto by_bias = [&](auto m) {
    if (bias == BiasTerm::tile)
      f(m, std::integral_constant<BiasTerm, BiasTerm::tile>{});
    else if (bias == BiasTerm::key)
      f(m, std::integral_constant<BiasTerm, BiasTerm::key>{});
    else
      f(m, std::integral_constant<BiasTerm, BiasTerm::none>{});
  };
  if (mask)
    by_bias(std::true_type{});
  else
    by_bias(std::false_type{});
}

// Which terms an interior tile can take from tiles and registers: all of them, or the kernel
// reads them per score from global memory (score_add_at). `bias_term` is set when it can.
__device__ __forceinline__ bool terms_on_chip(const AttentionFwdParams& p, BiasTerm& bias_term) {
  bias_term = !p.bias ? BiasTerm::none : p.bias_stride[2] == 0 ? BiasTerm::key : BiasTerm::tile;
  return (!p.mask || p.mask_tiled) && (bias_term != BiasTerm::tile || p.bias_tiled);  // a tile has a query dim
}

}  // namespace fdma::cuda
