// attention forward (FlashAttention-2 class), one kernel for every path, with the matmuls
// as a policy: FwdMmaSm80 (mma.sync, any sm80+ GPU) or FwdMmaSm90 (wgmma, Hopper, D = 64 and
// 128), chosen per launch. On Hopper the warp-specialized forward (attention_fwd_ws.cuh)
// takes the calls it applies to first (launch_attention_fwd_path, below).
//
// One CTA = kBlockM query rows of one (batch, head). Key tiles of kBlockN stream through
// shared memory, double-buffered with cp.async: the next tile loads while this one computes,
// and tiles the mask rules out (mask_tile_summary.cu) are never loaded. With wgmma the
// softmax of one tile also overlaps the previous tile's P V (kOverlapSoftmax). Each warp owns
// 16 * kMTiles rows; P goes from the S accumulators straight into A fragments, never through
// shared memory.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "cuda/primitives/arch_dispatch.cuh"
#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/attention_fwd_ws.cuh"
#include "cuda/attention/cta_order.cuh"
#include "cuda/attention/fwd_epilogue.cuh"
#include "cuda/attention/fwd_mma_sm80.cuh"
#include "cuda/attention/fwd_mma_sm90.cuh"
#include "cuda/attention/kernel_table.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/attention/next_active.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

// Shared memory of one CTA: Q, K x2, V x2 in the policy's layout, then the optional
// mask/bias tiles (two buffers each, sized at launch from what the call uses so unmasked calls
// keep their occupancy; rows padded by 16 bytes against bank conflicts), the gathered keys'
// KeyInfo records (dynamic-mask mode, two buffers), the staged key list and the next-active
// table (next_active.cuh).
template <class Mma>
struct FwdTile {
  static constexpr int kBlockM = Mma::kBlockM, kBlockN = Mma::kBlockN;
  static constexpr int kTilesBytes = Mma::kQBytes + 4 * Mma::kKVBytes;

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
  __host__ __device__ static int info_tile_bytes(const AttentionFwdParams& p) { return p.lists.keys ? kBlockN * 16 : 0; }
  __host__ __device__ static int smem_bytes(const AttentionFwdParams& p) {
    return align_slack<Mma::kTileAlign>() + kTilesBytes + 2 * (mask_tile_bytes(p) + bias_tile_bytes(p) + info_tile_bytes(p)) +
           staged_list_bytes(p.lists) + next_active_bytes(p, kBlockN);
  }
};

// kGather: dynamic-mask mode (p.lists), an instantiation of its own so that each kernel's
// unrolled loop holds only its own path (one kernel with both stalled on the instruction
// cache; docs/performance.md, "key lists").
template <class T, int kHeadDim, bool kGather, class Mma>
__device__ __forceinline__ void attention_fwd_body(const AttentionFwdParams& p) {
  using Tile = FwdTile<Mma>;
  constexpr int kM = Mma::kMTiles, kN = Mma::kTilesN, kDT = Mma::kTilesD, kThreads = Mma::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<Mma::kTileAlign>(smem_raw);
  ptx::griddep_wait();  // launched overlapping the list kernels: their lists (launch.cuh)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Causal blocks near the end see the most keys: every head's start first (cta_order.cuh).
  // Gathered CTAs keep grid order: the same order for the longest lists measured within noise
  // (docs/performance.md, "key lists").
  const QueryTileCta cta = query_tile_cta(!kGather && p.causal);
  const int m_block = cta.m_block;
  const int h = cta.y, b = blockIdx.z, hk = h / p.G;
  const int row0 = m_block * Tile::kBlockM;
  const int warp_row0 = row0 + Mma::warp_row_offset(warp);

  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[2];

  // Dynamic-mask mode: this tile's list of kept keys replaces 0..Sk-1.
  constexpr bool gather = kGather;
  int n_listed = 0;
  const int32_t* list = gather ? tile_key_list(p.lists, int64_t(b) * p.Hk + hk, row0, n_listed) : nullptr;
  const KeyInfo* info = gather ? p.lists.info + (int64_t(b) * p.Hk + hk) * p.Sk : nullptr;
  // Keys this block may see: causality bounds the last one by its last row.
  const int key_end = gather ? n_listed : p.causal ? min(p.Sk, row0 + Tile::kBlockM + p.Sk - p.Sq) : p.Sk;
  const int n_blocks = key_end > 0 ? (key_end + Tile::kBlockN - 1) / Tile::kBlockN : 0;

  const uint32_t s_q = ptx::smem_addr(smem);
  const uint32_t s_k = s_q + Mma::kQBytes, s_v = s_k + 2 * Mma::kKVBytes;
  const int mask_bytes = Tile::mask_tile_bytes(p), bias_bytes = Tile::bias_tile_bytes(p);
  unsigned char* mask_tiles = smem + Tile::kTilesBytes;
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
  // Key tiles the mask rules out entirely are skipped: no K, V or bias loads, no math. The
  // summary's key tiles are fwd_block_n wide; a kernel tile may span several.
  const uint8_t* active = active_row(p, b, h, m_block);
  constexpr int kSummaryTiles = Tile::kBlockN / fwd_block_n(kHeadDim);
  static_assert(kSummaryTiles >= 1 && Tile::kBlockN % fwd_block_n(kHeadDim) == 0, "kernel tiles cover summary tiles");
  auto tile_active = [&](int nb) {
    if (p.active_k_tiles == 1) return active[0] != 0;
    bool any = false;
#pragma unroll
    for (int i = 0; i < kSummaryTiles; ++i) {
      const int st = nb * kSummaryTiles + i;
      any |= st < p.active_k_tiles && active[st];
    }
    return any;
  };
  // The table's place and presence come from the params each time: a pointer held across the
  // loop made ptxas spill in the wgmma kernel.
  auto next_table = [&] {
    return reinterpret_cast<int16_t*>(smem + Tile::kTilesBytes + 2 * (mask_bytes + bias_bytes + info_bytes) +
                                      staged_list_bytes(p.lists));
  };
  // (Not in dynamic-mask mode, which has no mask summary.)
  auto tabled = [&] { return !gather && active && next_active_bytes(p, Tile::kBlockN); };
  if (tabled()) build_next_active(next_table(), n_blocks, tile_active, tid, kThreads);
  auto next_active = [&](int nb) {
    if (tabled()) return nb < n_blocks ? int(next_table()[nb]) : nb;
    if (active)
      while (nb < n_blocks && !tile_active(nb)) ++nb;
    return nb;
  };
  // Whether the mask keeps every key of key tile nb: it then needs no mask tile nor test.
  auto mask_keeps_tile = [&](int nb) {
    if (!active) return false;
    if (p.active_k_tiles == 1) return (active[0] & kTileAll) != 0;
    bool all = true;
#pragma unroll
    for (int i = 0; i < kSummaryTiles; ++i) {
      const int st = nb * kSummaryTiles + i;
      all &= st >= p.active_k_tiles || (active[st] & kTileAll);
    }
    return all;
  };
  // Mask and bias tiles for key tile `nb` join the same cp.async group as its K and V.
  auto load_score_tiles = [&](int nb, int buf) {
    const int key0 = nb * Tile::kBlockN, keys = min(Tile::kBlockN, p.Sk - key0);
    if (p.mask_tiled && !mask_keeps_tile(nb))
      load_bytes_tile_async<kThreads>(ptx::smem_addr(mask_tiles + buf * mask_bytes), Tile::mask_pitch(),
                                      mask_src + key0, p.mask_stride[2], Tile::mask_rows(p), Tile::kBlockN,
                                      mask_bcast ? 1 : tile_rows_valid, keys, tid);
    if (p.bias_tiled)
      load_bytes_tile_async<kThreads>(ptx::smem_addr(bias_tiles + buf * bias_bytes), Tile::bias_pitch(p),
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


  // K and the tile's mask/bias (or gathered key records) for key tile nb; V apart, as the
  // overlapped loop loads it one tile later than K.
  auto load_k = [&](int nb, int buf) {
    const int key0 = nb * Tile::kBlockN;
    const uint32_t sk = s_k + buf * Mma::kKVBytes;
    if (gather) {
      const int n = n_listed - key0;
      Mma::template load_rows_gather<Tile::kBlockN>(sk, k, p.k_stride[1], list + key0, n, p.D, tid);
      load_key_records_async(ptx::smem_addr(info_tiles + buf * info_bytes), info, list + key0, n, Tile::kBlockN, tid);
    } else {
      Mma::template load_rows<Tile::kBlockN>(sk, k, p.k_stride[1], key0, p.Sk, p.D, tid);
      load_score_tiles(nb, buf);
    }
  };
  auto load_v = [&](int nb, int buf) {
    const int key0 = nb * Tile::kBlockN;
    const uint32_t sv = s_v + buf * Mma::kKVBytes;
    if (gather)
      Mma::template load_rows_gather<Tile::kBlockN>(sv, v, p.v_stride[1], list + key0, n_listed - key0, p.D, tid);
    else
      Mma::template load_rows<Tile::kBlockN>(sv, v, p.v_stride[1], key0, p.Sk, p.D, tid);
  };
  // Causality, mask, bias, softcap (or the gathered keys' intervals) on S of key tile nb; s
  // is kM x (kN or fewer, on a narrow last tile) x 4.
  auto modify_scores = [&](auto& s, int nb, int buf) {
    if constexpr (kGather) {
      const KeyInfo* key_info = reinterpret_cast<const KeyInfo*>(info_tiles + buf * info_bytes);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) apply_interval_mod(s[mt], p, warp_row0 + mt * 16, key_info, lane);
    } else {
      const ScoreTiles tiles{p.mask_tiled ? mask_tiles + buf * mask_bytes : nullptr,
                             p.bias_tiled ? bias_tiles + buf * bias_bytes : nullptr,
                             Tile::mask_pitch(),
                             Tile::bias_pitch(p) / bias_esize,
                             row0,
                             mask_bcast,
                             bias_bcast,
                             mask_keeps_tile(nb)};
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
        apply_score_mod<T, Mma::kGlobalScoreTerms, kN>(s[mt], p, b, h, warp_row0 + mt * 16, nb * Tile::kBlockN, lane, tiles);
    }
  };

  int nb = next_active(0);
  if (nb < n_blocks) {
    Mma::template load_rows<Tile::kBlockM>(s_q, q, p.q_stride[1], row0, p.Sq, p.D, tid);
    if (gather && n_listed * 4 <= staged_list_bytes(p.lists)) {  // stage the list (see kMaxStagedKeys)
      int32_t* s_list = reinterpret_cast<int32_t*>(info_tiles + 2 * info_bytes);
      for (int i = tid; i < n_listed; i += kThreads) s_list[i] = list[i];
      __syncthreads();
      list = s_list;
    }
    load_k(nb, 0);
    if (!Mma::kOverlapSoftmax) load_v(nb, 0);
    ptx::cp_async_commit();
  }

  if constexpr (Mma::kOverlapSoftmax) {
    // Key tile j: S(j) = Q K(j)^T and O += P(j-1) V(j-1) are issued back to back; the softmax
    // of S(j) runs while the tensor core does P V, and O is rescaled once P V is done. The
    // cp.async group issued at tile j holds K(j+1) (and its mask/bias or key records) and V(j):
    // each lands during a whole tile's work, behind one barrier per tile.
    // The first tile is peeled, and a narrow last tile runs in a branch that waits for all it
    // issues, so that no wgmma group is in flight across a branch (ptxas then serialises every
    // wgmma of the kernel).
    auto begin_tile = [&](int nb, int buf) {
      ptx::cp_async_wait<0>();  // K(j), V(j-1) landed
      Mma::tile_landed();
      __syncthreads();  // ... for every thread, and tile j-1's reads of the buffers refilled here are done
      const int nb_next = next_active(nb + 1);
      if (nb_next < n_blocks) load_k(nb_next, buf ^ 1);
      load_v(nb, buf);
      ptx::cp_async_commit();
      return nb_next;
    };
    // A gathered list's last tile holds n_listed mod kBlockN keys: in a causal top-w forward
    // mostly a few dozen, the keys whose intervals begin or end among the tile's rows
    // (dma_lists.cu). With p.narrow_last_tile it runs on 32 or 64 keys instead of 128; its K
    // and V rows past the list are zero either way. The first tile stays full width.
    int last_keys = Tile::kBlockN;
    if constexpr (kGather && Mma::kNarrowLastTile) {
      const int tail = n_listed - (n_blocks - 1) * Tile::kBlockN;
      if (p.narrow_last_tile && n_blocks >= 2) last_keys = tail <= 32 ? 32 : tail <= 64 ? 64 : Tile::kBlockN;
    }
    const int full_end = last_keys < Tile::kBlockN ? n_blocks - 1 : n_blocks;
    typename Mma::PFrag pf;
    // Key tile j after the first, kKeys wide: S(j) and P(j-1) V(j-1) issued back to back.
    // (The scores' softmax is written out in each step: a generic lambda calling another on
    // the score array crashed nvcc 13.0's front end.)
    auto tile_step = [&](auto keys_tag, int& buf) {
      constexpr int kKeys = decltype(keys_tag)::value;
      const int nb_next = begin_tile(nb, buf);
      float s[kM][kKeys / 8][4], alpha[kM][2];
      Mma::template qk_issue<kKeys>(s, s_q, s_k + buf * Mma::kKVBytes, warp);
      Mma::pv_issue(o, pf, s_v + (buf ^ 1) * Mma::kKVBytes);
      Mma::template wait_qk<true>(s);
      modify_scores(s, nb, buf);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) softmax[mt].scale_scores(s[mt], alpha[mt]);
      Mma::wait_pv(o, pf);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) softmax[mt].rescale(o[mt], alpha[mt]);
      Mma::pack_p(pf, s);
      nb = nb_next;
      buf ^= 1;
    };
    // The last tile's P V, over its kKeys keys.
    auto last_pv = [&](auto keys_tag, int buf) {
      constexpr int kKeys = decltype(keys_tag)::value;
      ptx::cp_async_wait<0>();  // the last tile's V
      Mma::tile_landed();
      __syncthreads();
      Mma::template pv_issue<kKeys>(o, pf, s_v + (buf ^ 1) * Mma::kKVBytes);
      Mma::wait_pv(o, pf);
    };
    using FullTile = std::integral_constant<int, Tile::kBlockN>;
    if (nb < n_blocks) {
      int buf = 0;
      {
        const int nb_next = begin_tile(nb, buf);
        float s[kM][kN][4], alpha[kM][2];
        Mma::qk_issue(s, s_q, s_k, warp);
        Mma::template wait_qk<false>(s);
        modify_scores(s, nb, buf);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) softmax[mt].scale_scores(s[mt], alpha[mt]);  // O is zero: no rescale
        Mma::pack_p(pf, s);
        nb = nb_next;
        buf = 1;
      }
      while (nb < full_end) tile_step(FullTile{}, buf);
      if constexpr (kGather && Mma::kNarrowLastTile) {
        if (last_keys == 32) {
          tile_step(std::integral_constant<int, 32>{}, buf);
          last_pv(std::integral_constant<int, 32>{}, buf);
        } else if (last_keys == 64) {
          tile_step(std::integral_constant<int, 64>{}, buf);
          last_pv(std::integral_constant<int, 64>{}, buf);
        } else {
          last_pv(FullTile{}, buf);
        }
      } else {
        last_pv(FullTile{}, buf);
      }
    }
  } else {
    for (int buf = 0; nb < n_blocks; buf ^= 1) {
      const int nb_next = next_active(nb + 1);
      if (nb_next < n_blocks) {
        load_k(nb_next, buf ^ 1);
        load_v(nb_next, buf ^ 1);
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();  // this tile (and Q) landed; the next may still be in flight
      Mma::tile_landed();
      __syncthreads();

      float s[kM][kN][4];
      Mma::qk(s, s_q, s_k + buf * Mma::kKVBytes, warp, lane);
      modify_scores(s, nb, buf);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) softmax[mt].update(s[mt], o[mt]);
      Mma::pv(o, s, s_v + buf * Mma::kKVBytes, warp, lane);
      __syncthreads();  // everyone is done with this buffer before it is refilled
      nb = nb_next;
    }
  }

  // Epilogue: normalise, store O and lse.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    softmax[mt].finish();
    store_output_rows<T>(o[mt], softmax[mt], p, b, h, warp_row0 + mt * 16, g, t);
  }
}

// The kernel. Hopper-only policies compile to a trap on other targets, where dispatch never
// launches them (arch_dispatch.cuh): that keeps their code and build time out of those targets.
template <class T, int kHeadDim, bool kGather, class Mma>
__global__ void __launch_bounds__(Mma::kThreads) attention_fwd_kernel(const AttentionFwdParams p) {
  if constexpr (Mma::kHopperOnly && !FDMA_SM90_ENABLED)
    __trap();
  else
    attention_fwd_body<T, kHeadDim, kGather, Mma>(p);
}

template <class T, int kHeadDim, bool kGather, class Mma>
cudaError_t launch_attention_fwd_kernel(const AttentionFwdParams& params, int device, cudaStream_t stream) {
  using Tile = FwdTile<Mma>;
  auto kernel = attention_fwd_kernel<T, kHeadDim, kGather, Mma>;
  AttentionFwdParams p = params;
  // A CTA reads the list of the lists' tile holding its rows (tile_key_list): its tile must lie in one.
  if (kGather && p.lists.count_tiles > 1 && (1 << p.lists.tile_rows_log2) % Tile::kBlockM != 0) return cudaErrorInvalidValue;
  if (next_active_bytes(p, Tile::kBlockN)) {  // only where it fits beside everything else
    int max_smem = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    if (Tile::smem_bytes(p) > max_smem) p.next_active_table = false;
  }
  const int smem = Tile::smem_bytes(p);
  static std::atomic<int> granted[kMaxDevices] = {};
  cudaError_t err = grant_smem_once(kernel, smem, device < kMaxDevices ? granted : nullptr, device);
  if (err != cudaSuccess) return err;
  dim3 grid((p.Sq + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  return launch_kernel(p.overlap_previous, kernel, grid, Mma::kThreads, smem, stream, p);
}

template <class T, int kHeadDim, bool kGather>
cudaError_t launch_attention_fwd_path(const AttentionFwdParams& p, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
    // The warp-specialized kernel of the call's kind where it applies (attention_fwd_ws.cuh).
    FwdTensorMaps maps{};
    auto try_kind = [&](auto kind_tag, cudaError_t& err) {
      constexpr FwdWsKind kKind = decltype(kind_tag)::value;
      if (!wgmma_path_available(attention_fwd_ws_kernel<T, kHeadDim, kKind>, device) ||
          !attention_fwd_ws_applies<T, kHeadDim, kKind>(p, maps))
        return false;
      err = launch_attention_fwd_ws<T, kHeadDim, kKind>(p, maps, device, stream);
      return true;
    };
    using Gathered = std::integral_constant<FwdWsKind, FwdWsKind::gathered>;
    using Scored = std::integral_constant<FwdWsKind, FwdWsKind::scored>;
    using ScoredNarrow = std::integral_constant<FwdWsKind, FwdWsKind::scored_narrow>;
    using MaskedBiased = std::integral_constant<FwdWsKind, FwdWsKind::masked_biased>;
    using Dense = std::integral_constant<FwdWsKind, FwdWsKind::dense>;
    cudaError_t ws_err = cudaSuccess;
    if constexpr (kGather) {
      if (try_kind(Gathered{}, ws_err)) return ws_err;
    } else if (fwd_ws_kind(p) == FwdWsKind::scored) {
      if (try_kind(Scored{}, ws_err)) return ws_err;
      // A mask tile and a bias tile together where both do not fit: at D = 128 64-key tiles; at
      // D = 256 the mask laid over the bias tile (at D = 128 that ran 3x slower than the narrow
      // tiles: the helper warps' 16 KB of mask a tile outlast a step, docs/performance.md).
      if constexpr (kHeadDim == 128)
        if (try_kind(ScoredNarrow{}, ws_err)) return ws_err;
      if constexpr (kHeadDim == 256)
        if (try_kind(MaskedBiased{}, ws_err)) return ws_err;
    } else if (try_kind(Dense{}, ws_err)) {
      return ws_err;
    }
  }
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    using Sm90 = FwdMmaSm90<T, kHeadDim>;
    // The wgmma tiles are larger: a call whose mask/bias tiles would not fit takes the sm80 path,
    // and so does one whose mask or bias cannot be tiled (kGlobalScoreTerms).
    // (The next-active table does not decide it: it is dropped where it would not fit.)
    constexpr int kMaxSmem = 227 * 1024;
    const bool terms_tiled = (!p.mask || p.mask_tiled) && (!p.bias || p.bias_tiled);
    AttentionFwdParams untabled = p;
    untabled.next_active_table = false;
    if (terms_tiled && FwdTile<Sm90>::smem_bytes(untabled) <= kMaxSmem &&
        wgmma_path_available(attention_fwd_kernel<T, kHeadDim, kGather, Sm90>, device))
      return launch_attention_fwd_kernel<T, kHeadDim, kGather, Sm90>(p, device, stream);
  }
  return launch_attention_fwd_kernel<T, kHeadDim, kGather, FwdMmaSm80<T, kHeadDim>>(p, device, stream);
}

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  return p.lists.keys ? launch_attention_fwd_path<T, kHeadDim, true>(p, stream)
                      : launch_attention_fwd_path<T, kHeadDim, false>(p, stream);
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_ATTENTION_FWD(T, HD) \
  template cudaError_t fdma::cuda::launch_attention_fwd<T, HD>(const fdma::cuda::AttentionFwdParams&, cudaStream_t);
