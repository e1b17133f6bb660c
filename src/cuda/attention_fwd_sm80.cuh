// attention forward, portable sm80+ path (FlashAttention-2 class).
//
// One CTA = kBlockM query rows of one (batch, head), 4 warps; tile shapes come from
// kernel_table.hpp. Key tiles of kBlockN stream through shared memory, double-buffered with
// cp.async: the next tile loads while this one computes, and tiles the mask rules out
// (mask_tile_summary.cu) are never loaded. S = Q K^T and O += P V are mma.sync m16n8k16 with fp32 accumulators;
// P goes from the S accumulators straight into A fragments, never through shared memory.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cuda/attention_fwd_params.hpp"
#include "cuda/kernel_table.hpp"
#include "cuda/ptx.cuh"
#include "cuda/score_mod_sm80.cuh"
#include "cuda/softmax_sm80.cuh"
#include "cuda/tile_io_sm80.cuh"

namespace fdma::cuda {

template <int kHeadDim>
struct FwdTile {
  // Each warp owns kMTiles m16 row tiles: every K/V fragment read from shared memory then
  // feeds kMTiles mmas. Two tiles for D <= 128; above that the O accumulators alone would
  // need 2 * D / 2 registers per thread and spill.
  static constexpr int kMTiles = fwd_m_tiles_per_warp(kHeadDim);
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBlockM = fwd_block_m(kHeadDim);
  // Keys per tile. D = 128 with two m-tiles sits at the register limit: 32-key tiles halve
  // the S registers and measured 10-18% faster than 64 (docs/perf-notes.md).
  static constexpr int kBlockN = fwd_block_n(kHeadDim);
  static_assert(kBlockM == 16 * kMTiles * kWarps, "tile table and kernel agree");
  static constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  static constexpr int kQBytes = kBlockM * kRowBytes, kKVBytes = kBlockN * kRowBytes;
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;  // Q, K x2, V x2
  static constexpr int kTilesN = kBlockN / 8;                // n-tiles of S per m-tile
  static constexpr int kTilesD = kHeadDim / 8;               // n-tiles of O per m-tile
  static_assert(kHeadDim % 16 == 0, "head dim tiles are k16 steps");

  // Optional mask/bias tiles (two buffers each), sized at launch from what the call uses so
  // unmasked calls keep their occupancy. Rows are padded by 16 bytes against bank conflicts.
  __host__ __device__ static int mask_pitch() { return kBlockN + 16; }
  __host__ __device__ static int bias_pitch(const AttentionFwdParams& p) { return kBlockN * (p.bias_f32 ? 4 : 2) + 16; }
  __host__ __device__ static int mask_rows(const AttentionFwdParams& p) { return p.mask_stride[2] == 0 ? 1 : kBlockM; }
  __host__ __device__ static int bias_rows(const AttentionFwdParams& p) { return p.bias_stride[2] == 0 ? 1 : kBlockM; }
  __host__ __device__ static int mask_tile_bytes(const AttentionFwdParams& p) {
    return p.mask_tiled ? mask_rows(p) * mask_pitch() : 0;
  }
  __host__ __device__ static int bias_tile_bytes(const AttentionFwdParams& p) {
    return p.bias_tiled ? bias_rows(p) * bias_pitch(p) : 0;
  }
  // Dynamic-mask mode: the gathered keys' KeyInfo records, two buffers.
  __host__ __device__ static int info_tile_bytes(const AttentionFwdParams& p) { return p.lists.keys ? kBlockN * 16 : 0; }
  __host__ __device__ static int smem_bytes(const AttentionFwdParams& p) {
    return kSmemBytes + 2 * (mask_tile_bytes(p) + bias_tile_bytes(p) + info_tile_bytes(p)) + staged_list_bytes(p.lists);
  }
};

// kGather: dynamic-mask mode (p.lists), an instantiation of its own so that each kernel's
// unrolled loop holds only its own path (one kernel with both stalled on the instruction
// cache; docs/perf-notes.md).
template <class T, int kHeadDim, bool kGather>
__global__ void __launch_bounds__(FwdTile<kHeadDim>::kThreads)
    attention_fwd_kernel(const AttentionFwdParams p) {
  using Tile = FwdTile<kHeadDim>;
  constexpr int kM = Tile::kMTiles, kN = Tile::kTilesN, kDT = Tile::kTilesD;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Causal blocks near the end see the most keys: launch them first so the tail is short.
  const int m_block = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const int row0 = m_block * Tile::kBlockM;
  const int warp_row0 = row0 + warp * 16 * kM;

  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[2];

  // Dynamic-mask mode: this tile's list of kept keys replaces 0..Sk-1.
  constexpr bool gather = kGather;
  const int32_t* list = nullptr;
  int n_listed = 0;
  if (gather) {
    const int64_t bh = int64_t(b) * p.Hk + hk;
    const int tile = p.lists.count_tiles == 1 ? 0 : m_block;
    list = p.lists.keys + bh * p.lists.keys_bh_stride + tile * p.lists.keys_tile_stride;
    n_listed = p.lists.counts[bh * p.lists.count_tiles + tile];
  }
  const KeyInfo* info = gather ? p.lists.info + (int64_t(b) * p.Hk + hk) * p.Sk : nullptr;
  // Keys this block may see: causality bounds the last one by its last row.
  const int key_end = gather ? n_listed : p.causal ? min(p.Sk, row0 + Tile::kBlockM + p.Sk - p.Sq) : p.Sk;
  const int n_blocks = key_end > 0 ? (key_end + Tile::kBlockN - 1) / Tile::kBlockN : 0;

  const uint32_t s_q = ptx::smem_addr(smem);
  const uint32_t s_k = s_q + Tile::kQBytes, s_v = s_k + 2 * Tile::kKVBytes;
  const int mask_bytes = Tile::mask_tile_bytes(p), bias_bytes = Tile::bias_tile_bytes(p);
  unsigned char* mask_tiles = smem + Tile::kSmemBytes;
  unsigned char* bias_tiles = mask_tiles + 2 * mask_bytes;
  const int info_bytes = Tile::info_tile_bytes(p);
  unsigned char* info_tiles = bias_tiles + 2 * bias_bytes;
  const int bias_esize = p.bias_f32 ? 4 : 2;
  const bool mask_bcast = p.mask_stride[2] == 0, bias_bcast = p.bias_stride[2] == 0;
  const char* mask_src = p.mask_tiled ? reinterpret_cast<const char*>(p.mask) + b * p.mask_stride[0] +
                                            head_index(p.mask_head_mode, h, p.G) * p.mask_stride[1] +
                                            (mask_bcast ? 0 : row0 * p.mask_stride[2])
                                      : nullptr;
  const char* bias_src = p.bias_tiled ? static_cast<const char*>(p.bias) +
                                            (b * p.bias_stride[0] + head_index(p.bias_head_mode, h, p.G) * p.bias_stride[1] +
                                             (bias_bcast ? 0 : row0 * p.bias_stride[2])) * bias_esize
                                      : nullptr;
  const int tile_rows_valid = min(Tile::kBlockM, p.Sq - row0);
  // Mask and bias tiles for key tile `nb` join the same cp.async group as its K and V.
  auto load_score_tiles = [&](int nb, int buf) {
    const int key0 = nb * Tile::kBlockN, keys = min(Tile::kBlockN, p.Sk - key0);
    if (p.mask_tiled)
      load_bytes_tile_async<Tile::kThreads>(ptx::smem_addr(mask_tiles + buf * mask_bytes), Tile::mask_pitch(),
                                            mask_src + key0, p.mask_stride[2], Tile::mask_rows(p), Tile::kBlockN,
                                            mask_bcast ? 1 : tile_rows_valid, keys, tid);
    if (p.bias_tiled)
      load_bytes_tile_async<Tile::kThreads>(ptx::smem_addr(bias_tiles + buf * bias_bytes), Tile::bias_pitch(p),
                                            bias_src + int64_t(key0) * bias_esize, p.bias_stride[2] * bias_esize,
                                            Tile::bias_rows(p), Tile::kBlockN * bias_esize,
                                            bias_bcast ? 1 : tile_rows_valid, keys * bias_esize, tid);
  };

  float o[kM][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
  OnlineSoftmax<kN, kDT> softmax[kM];

  // Key tiles the mask rules out entirely are skipped: no K, V or bias loads, no math.
  const uint8_t* active = nullptr;
  if (p.tile_active) {
    const int mb = p.active_batches == 1 ? 0 : b, mh = int(head_index(p.mask_head_mode, h, p.G));
    const int qt = p.active_q_tiles == 1 ? 0 : m_block;
    active = p.tile_active + ((int64_t(mb) * p.active_heads + mh) * p.active_q_tiles + qt) * p.active_k_tiles;
  }
  auto next_active = [&](int nb) {
    if (active)
      while (nb < n_blocks && !active[p.active_k_tiles == 1 ? 0 : nb]) ++nb;
    return nb;
  };

  // K, V and the tile's mask/bias (or gathered key records) for key tile nb, one cp.async group.
  auto load_kv = [&](int nb, int buf) {
    const int key0 = nb * Tile::kBlockN;
    const uint32_t sk = s_k + buf * Tile::kKVBytes, sv = s_v + buf * Tile::kKVBytes;
    if (gather) {
      const int n = n_listed - key0;
      load_rows_gather_async<Tile::kThreads, kHeadDim, Tile::kBlockN>(sk, k, p.k_stride[1], list + key0, n, p.D, tid);
      load_rows_gather_async<Tile::kThreads, kHeadDim, Tile::kBlockN>(sv, v, p.v_stride[1], list + key0, n, p.D, tid);
      load_key_records_async(ptx::smem_addr(info_tiles + buf * info_bytes), info, list + key0, n, Tile::kBlockN, tid);
    } else {
      load_rows_async<Tile::kThreads, kHeadDim, Tile::kBlockN>(sk, k, p.k_stride[1], key0, p.Sk, p.D, tid);
      load_rows_async<Tile::kThreads, kHeadDim, Tile::kBlockN>(sv, v, p.v_stride[1], key0, p.Sk, p.D, tid);
      load_score_tiles(nb, buf);
    }
  };

  int nb = next_active(0);
  if (nb < n_blocks) {
    load_rows_async<Tile::kThreads, kHeadDim, Tile::kBlockM>(s_q, q, p.q_stride[1], row0, p.Sq, p.D, tid);
    if (gather && n_listed * 4 <= staged_list_bytes(p.lists)) {  // stage the list (see kMaxStagedKeys)
      int32_t* s_list = reinterpret_cast<int32_t*>(info_tiles + 2 * info_bytes);
      for (int i = tid; i < n_listed; i += Tile::kThreads) s_list[i] = list[i];
      __syncthreads();
      list = s_list;
    }
    load_kv(nb, 0);
    ptx::cp_async_commit();
  }

  // Lane addresses for ldmatrix (see ptx.cuh for the fragment layouts).
  const uint32_t q_lane = s_q + (warp * 16 * kM + lane % 16) * Tile::kRowBytes + (lane / 16) * 16;
  const uint32_t k_lane = (lane % 8 + (lane / 16) * 8) * Tile::kRowBytes + ((lane / 8) % 2) * 16;
  const uint32_t v_lane = (lane % 8 + ((lane / 8) % 2) * 8) * Tile::kRowBytes + (lane / 16) * 16;

  for (int buf = 0; nb < n_blocks; buf ^= 1) {
    const int nb_next = next_active(nb + 1);
    if (nb_next < n_blocks) {
      load_kv(nb_next, buf ^ 1);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // this tile (and Q) landed; the next may still be in flight
    __syncthreads();

    // S = Q K^T for this warp's 16 * kM rows x kBlockN keys.
    float s[kM][kN][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
    const uint32_t k_tile = s_k + buf * Tile::kKVBytes + k_lane;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) ptx::ldmatrix_x4(a[mt], q_lane + mt * 16 * Tile::kRowBytes + kk * 32);
#pragma unroll
      for (int np = 0; np < kN / 2; ++np) {
        uint32_t bk[4];
        ptx::ldmatrix_x4(bk, k_tile + np * 16 * Tile::kRowBytes + kk * 32);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          ptx::mma_16816<T>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          ptx::mma_16816<T>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    const ScoreTiles tiles{p.mask_tiled ? mask_tiles + buf * mask_bytes : nullptr,
                           p.bias_tiled ? bias_tiles + buf * bias_bytes : nullptr,
                           Tile::mask_pitch(),
                           Tile::bias_pitch(p) / bias_esize,
                           row0,
                           mask_bcast,
                           bias_bcast};
    const KeyInfo* key_info = reinterpret_cast<const KeyInfo*>(info_tiles + buf * info_bytes);
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      if (gather)
        apply_interval_mod<kN>(s[mt], p, warp_row0 + mt * 16, key_info, lane);
      else
        apply_score_mod<T, kN>(s[mt], p, b, h, warp_row0 + mt * 16, nb * Tile::kBlockN, lane, tiles);
      softmax[mt].update(s[mt], o[mt]);
    }

    // O += P V: P (16 x kBlockN keys per m-tile) from registers, V^T by transposing ldmatrix.
    const uint32_t v_tile = s_v + buf * Tile::kKVBytes + v_lane;
#pragma unroll
    for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        a[mt][0] = ptx::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = ptx::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = ptx::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = ptx::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, v_tile + kk * 16 * Tile::kRowBytes + dp * 32);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          ptx::mma_16816<T>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          ptx::mma_16816<T>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
    nb = nb_next;
  }

  // Epilogue: normalise, store O (two elements per store) and lse.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    softmax[mt].finish();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = warp_row0 + mt * 16 + g + 8 * r;
      if (i >= p.Sq) continue;
      const float l = softmax[mt].l[r];
      const float inv = l == 0.f ? 0.f : 1.f / l;  // a NaN l stays NaN
      T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const int d = dt * 8 + 2 * t;
        if (d < p.D)
          *reinterpret_cast<uint32_t*>(out + d) = ptx::pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      }
      if (p.lse && t == 0)
        p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
            l == 0.f ? -INFINITY : softmax[mt].m[r] + logf(l);
    }
  }
}

template <class T, int kHeadDim, bool kGather>
cudaError_t launch_attention_fwd_kernel(const AttentionFwdParams& p, cudaStream_t stream) {
  using Tile = FwdTile<kHeadDim>;
  auto kernel = attention_fwd_kernel<T, kHeadDim, kGather>;
  const int smem = Tile::smem_bytes(p);
  // Raise the kernel's shared-memory limit once per device and size, not per call (the
  // attribute is per device; the caller's device guard has made the tensors' device current).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> granted[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::atomic<int>* seen_for_device = device < kMaxDevices ? &granted[device] : nullptr;
  if (!seen_for_device || smem > seen_for_device->load(std::memory_order_relaxed)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    if (seen_for_device) {
      int seen = seen_for_device->load(std::memory_order_relaxed);
      while (smem > seen && !seen_for_device->compare_exchange_weak(seen, smem)) {
      }
    }
  }
  dim3 grid((p.Sq + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  return p.lists.keys ? launch_attention_fwd_kernel<T, kHeadDim, true>(p, stream)
                      : launch_attention_fwd_kernel<T, kHeadDim, false>(p, stream);
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_ATTENTION_FWD(T, HD) \
  template cudaError_t fdma::cuda::launch_attention_fwd<T, HD>(const fdma::cuda::AttentionFwdParams&, cudaStream_t);
