// attention forward, portable sm80+ path (FlashAttention-2 class).
//
// One CTA = 64 query rows of one (batch, head); 4 warps of 16 rows each. Key tiles of 64
// stream through shared memory, double-buffered with cp.async: the next tile loads while
// this one computes. S = Q K^T and O += P V are mma.sync m16n8k16 with fp32 accumulators;
// P goes from the S accumulators straight into A fragments, never through shared memory.
// Shared-memory rows are padded by 16 bytes so that ldmatrix's eight row reads hit eight
// different bank groups.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention_fwd_params.hpp"
#include "cuda/ptx.cuh"
#include "cuda/score_mod_sm80.cuh"
#include "cuda/softmax_sm80.cuh"

namespace fdma::cuda {

template <int kHeadDim>
struct FwdTile {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRowBytes = kHeadDim * 2 + 16;  // padded row
  static constexpr int kTileBytes = 64 * kRowBytes;
  static constexpr int kSmemBytes = 5 * kTileBytes;  // Q, K x2, V x2
  static constexpr int kTilesN = kBlockN / 8;        // n-tiles of S per warp
  static constexpr int kTilesD = kHeadDim / 8;       // n-tiles of O per warp
  static_assert(kHeadDim % 16 == 0, "head dim tiles are k16 steps");
};

// Copies rows [row0, row0 + 64) of a [rows, D] slab (row stride in elements) into a padded
// shared tile. Rows past `nrows` and chunks past D are zero-filled.
template <class T, int kHeadDim>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const T* base, int64_t row_stride, int row0, int nrows,
                                                int D, int tid) {
  using Tile = FwdTile<kHeadDim>;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = tid; c < 64 * kChunks; c += Tile::kThreads) {
    const int r = c / kChunks, ch = c % kChunks, row = row0 + r;
    const bool ok = row < nrows && ch * 8 < D;
    const T* src = ok ? base + row * row_stride + ch * 8 : base;
    ptx::cp_async_16(smem + r * Tile::kRowBytes + ch * 16, src, ok ? 16 : 0);
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(FwdTile<kHeadDim>::kThreads)
    attention_fwd_kernel(const AttentionFwdParams p) {
  using Tile = FwdTile<kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const int row0 = m_block * Tile::kBlockM;

  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[2];

  // Keys this block may see: causality bounds the last one by its last row.
  const int key_end = p.causal ? min(p.Sk, row0 + Tile::kBlockM + p.Sk - p.Sq) : p.Sk;
  const int n_blocks = key_end > 0 ? (key_end + Tile::kBlockN - 1) / Tile::kBlockN : 0;

  const uint32_t s_q = ptx::smem_addr(smem);
  const uint32_t s_k = s_q + Tile::kTileBytes, s_v = s_k + 2 * Tile::kTileBytes;

  float o[Tile::kTilesD][4];
#pragma unroll
  for (int dt = 0; dt < Tile::kTilesD; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  OnlineSoftmax<Tile::kTilesN, Tile::kTilesD> softmax;

  if (n_blocks > 0) {
    load_tile_async<T, kHeadDim>(s_q, q, p.q_stride[1], row0, p.Sq, p.D, tid);
    load_tile_async<T, kHeadDim>(s_k, k, p.k_stride[1], 0, p.Sk, p.D, tid);
    load_tile_async<T, kHeadDim>(s_v, v, p.v_stride[1], 0, p.Sk, p.D, tid);
    ptx::cp_async_commit();
  }

  // Lane addresses for ldmatrix (see ptx.cuh for the fragment layouts).
  const uint32_t q_lane = s_q + (warp * 16 + lane % 16) * Tile::kRowBytes + (lane / 16) * 16;
  const uint32_t k_lane = (lane % 8 + (lane / 16) * 8) * Tile::kRowBytes + ((lane / 8) % 2) * 16;
  const uint32_t v_lane = (lane % 8 + ((lane / 8) % 2) * 8) * Tile::kRowBytes + (lane / 16) * 16;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int buf = nb & 1;
    if (nb + 1 < n_blocks) {
      const int next = (nb + 1) * Tile::kBlockN;
      load_tile_async<T, kHeadDim>(s_k + (buf ^ 1) * Tile::kTileBytes, k, p.k_stride[1], next, p.Sk, p.D, tid);
      load_tile_async<T, kHeadDim>(s_v + (buf ^ 1) * Tile::kTileBytes, v, p.v_stride[1], next, p.Sk, p.D, tid);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // this tile (and Q) landed; the next may still be in flight
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[Tile::kTilesN][4];
#pragma unroll
    for (int nt = 0; nt < Tile::kTilesN; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    const uint32_t k_tile = s_k + buf * Tile::kTileBytes + k_lane;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, q_lane + kk * 32);
#pragma unroll
      for (int np = 0; np < Tile::kTilesN / 2; ++np) {
        uint32_t bk[4];
        ptx::ldmatrix_x4(bk, k_tile + np * 16 * Tile::kRowBytes + kk * 32);
        ptx::mma_16816<T>(s[2 * np], a, bk[0], bk[1]);
        ptx::mma_16816<T>(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }

    apply_score_mod<T, Tile::kTilesN>(s, p, b, h, row0 + warp * 16, nb * Tile::kBlockN, lane);
    softmax.update(s, o);

    // O += P V: P (16 x 64 keys) from registers, V^T fragments by transposing ldmatrix.
    const uint32_t v_tile = s_v + buf * Tile::kTileBytes + v_lane;
#pragma unroll
    for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
      uint32_t a[4] = {ptx::pack2<T>(s[2 * kk][0], s[2 * kk][1]), ptx::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                       ptx::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       ptx::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < Tile::kTilesD / 2; ++dp) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, v_tile + kk * 16 * Tile::kRowBytes + dp * 32);
        ptx::mma_16816<T>(o[2 * dp], a, bv[0], bv[1]);
        ptx::mma_16816<T>(o[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }

  // Epilogue: normalise, store O (two elements per store) and lse.
  softmax.finish();
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + warp * 16 + g + 8 * r;
    if (i >= p.Sq) continue;
    const float l = softmax.l[r];
    const float inv = l == 0.f ? 0.f : 1.f / l;  // a NaN l stays NaN
    T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
#pragma unroll
    for (int dt = 0; dt < Tile::kTilesD; ++dt) {
      const int d = dt * 8 + 2 * t;
      if (d < p.D) *reinterpret_cast<uint32_t*>(out + d) = ptx::pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
    if (p.lse && t == 0)
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
          l == 0.f ? -INFINITY : softmax.m[r] + logf(l);
  }
}

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  using Tile = FwdTile<kHeadDim>;
  auto kernel = attention_fwd_kernel<T, kHeadDim>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid((p.Sq + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_ATTENTION_FWD(T, HD) \
  template cudaError_t fdma::cuda::launch_attention_fwd<T, HD>(const fdma::cuda::AttentionFwdParams&, cudaStream_t);
