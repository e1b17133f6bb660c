// Warp-specialized attention forward for Hopper (sm_90a) at D = 64, 128 and 256: calls whose
// q, k, v, mask and bias the copy engine can read (causal and softcap allowed), and the
// gathered forward of dynamic-mask mode (key lists, attention_fwd_params.hpp) at the same D.
// One kernel per kind of call (FwdWsKind): dense calls (no mask; no bias or a per-key one),
// scored calls (a mask, or a bias with a query dim) and gathered calls.
//
// Three warp groups per CTA of 128 query rows; key tiles of 128 keys for gathered calls (64 at
// D = 256) and wider ones for dense calls (fwd_ws_key_tile). The producer group gives most of its registers
// away (setmaxnreg) and fills rings of K and V buffers (FwdWsShape), each with a "full" mbarrier the
// copies complete and an "empty" one the consumers arrive on. Dense and scored calls: one
// thread issues every copy with the bulk tensor copy engine (TMA), a key tile's bias row, or
// its mask and bias tiles, with its K; scored calls skip the key tiles the mask summary rules
// out (mask_tile_summary.cu), and the mask tiles of those it keeps whole.
// Gathered calls: the group's 128 threads gather the listed keys' rows (and their KeyInfo
// records) with cp.async, each thread arriving on the full barrier when its copies land. The
// two consumer groups own 64 rows each and run the wgmma forward of FwdMmaSm90 (S = Q K^T, the
// softmax, O += P V) with the softmax of tile j under the P V of tile j - 1, never waiting on
// each other: no CTA-wide barrier after the start. A pair of named barriers hands the tensor
// core back and forth (ping-pong): a group issues its step's matmuls only after the other has
// issued its own, so one group's softmax runs under the other's matmuls. At the end each group
// stores its O rows: in scored and gathered calls, and dense ones at D = 64 and 256, through the
// copy engine from shared memory (over its own Q rows), in dense calls at D = 128 from registers.
// A gathered step reads its keys' biases and cover vote while its S is computed (fwd_ws_key_terms).
// In bf16 (no softcap, a positive scale) the keys' terms are folded into S instead: one more
// 16-column slice of the product, Q's ones against each key's term / scale as three bf16
// (KeyLists::bias_chunks), so its scores need the cover vote and the intervals only.
//
// Scored calls with both a mask tile and a bias tile at D = 128 take a kind of their own on
// 64-key tiles (scored_narrow), where two stages of both fit beside K and V; at D = 256 one
// (masked_biased) that copies only the bias tile, the producer group's idle warps laying the
// mask over it as -inf (mask_over_bias_sm90.cuh) before the consumers read it (a per-stage
// "ready" mbarrier).
// Here: the consumers, the kernel and its launch; the kinds, tiles and shared-memory layout are
// in fwd_ws_shape.cuh, the producer group's copies and gathers in fwd_ws_producers.cuh.
// The other forward (attention_fwd.cuh) loads tiles with cp.async from every thread and meets
// at a CTA barrier per key tile; it stays for the other head dims, for masks and biases the
// copy engine cannot read or whose tiles do not fit beside K and V (a float32 bias with a
// query dim).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/cta_order.cuh"
#include "cuda/attention/fwd_epilogue.cuh"
#include "cuda/attention/fwd_mma_sm90.cuh"
#include "cuda/attention/fwd_ws_producers.cuh"
#include "cuda/attention/fwd_ws_shape.cuh"
#include "cuda/attention/mask_over_bias_sm90.cuh"
#include "cuda/attention/next_active.cuh"
#include "cuda/attention/score_mod_sm80.cuh"
#include "cuda/attention/score_tiles_sm90.cuh"
#include "cuda/attention/term_maps.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/softmax_sm80.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tile_io_sm80.cuh"
#include "cuda/primitives/tile_io_sm90.cuh"
#include "cuda/primitives/tma.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// The score modification of the key tile at key0 in stage st: causality, bounds, softcap and
// the bias row from the stage (dense), the stage's mask and bias tiles or rows (scored; none of
// the mask where the summary keeps the tile whole, `mask_all`), or the gathered keys' intervals
// and biases from their KeyInfo records. `raw` (no bias or softcap, scale > 0; gathered calls:
// the terms folded into S): causality, bounds and the mask (the intervals) only, the scores left
// unscaled for the softmax to scale in its exponent;
// with a bias and no softcap, scale and bias in one multiply-add. The K buffer goes back once S
// is done and the stage's terms or records are read. `tile_row`: the thread's first row within
// the CTA's 128 (scored calls).
// Each consumer thread arrives on the stage's empty barrier itself (initialised to 256): no
// thread's reads rely on another's arrival. `key_terms`: what fwd_ws_key_terms read of a
// gathered tile's records while S was computed.
template <class T, FwdWsKind kKind, class Shape, bool kFolded, int kCols, class KeyTerms>
__device__ __forceinline__ void fwd_ws_scores(float (&s)[kCols][4], const AttentionFwdParams& p,
                                              const unsigned char* smem, uint32_t base, int st, int key0, int b, int h,
                                              int warp_row0, int lane, bool raw, int tile_row, bool mask_all,
                                              const KeyTerms& key_terms) {
  if constexpr (kKind == FwdWsKind::gathered) {
    const KeyInfo* keys = reinterpret_cast<const KeyInfo*>(smem + Shape::info_offset(st));
    if constexpr (kFolded)  // the terms folded into S
      apply_interval_select(s, warp_row0, keys, key_terms.covers, lane);
    else
      apply_interval_mod(s, p, warp_row0, keys, key_terms, lane);
    mbar::arrive(Shape::k_empty(base, st));
  } else if constexpr (fwd_ws_scored(kKind)) {
    const FwdWsTerms<Shape> terms(p);  // from the params per tile: uniform arithmetic, no registers held across the loop
    const int t = lane % 4;
    if (terms.bias_tile) {
      const uint32_t tile = base + terms.bias_tile_at(st);
      if (p.softcap == 0.f) {
        add_bias_tile<T, true>(s, tile, tile_row, t, p.scale);
      } else {
        cap_scores(s, p);
        add_bias_tile<T, false>(s, tile, tile_row, t, 1.f);
      }
    } else if (terms.bias_row) {
      const unsigned char* row = smem + terms.bias_row_at(st);
      if (p.softcap == 0.f) {
        if (p.bias_f32)
          scale_add_key_row(s, reinterpret_cast<const float*>(row), t, p.scale);
        else
          scale_add_key_row(s, reinterpret_cast<const T*>(row), t, p.scale);
      } else {
        cap_scores(s, p);
        if (p.bias_f32)
          add_key_row(s, reinterpret_cast<const float*>(row), t);
        else
          add_key_row(s, reinterpret_cast<const T*>(row), t);
      }
    } else if (!raw) {
      cap_scores(s, p);
    }
    if (terms.mask_tile && !mask_all)
      hide_masked_tile<Shape::kBlockN>(s, base + terms.mask_tile_at(st), tile_row, t);
    else if (terms.mask_row && !mask_all)
      hide_masked_keys(s, base + terms.mask_row_at(st), t);
    mbar::arrive(Shape::k_empty(base, st));
    if (!interior_tile<kCols>(p, warp_row0, key0)) {
      const int rows[2] = {warp_row0 + lane / 4, warp_row0 + lane / 4 + 8};
      hide_out_of_range(s, p, rows, key0, t);
    }
  } else if (p.bias && p.softcap == 0.f) {  // scale and bias in one multiply-add a score
    const bool interior = interior_tile<kCols>(p, warp_row0, key0);
    if (p.bias_f32)
      scale_add_key_row(s, reinterpret_cast<const float*>(smem + Shape::bias_offset(st)), lane % 4, p.scale);
    else
      scale_add_key_row(s, reinterpret_cast<const T*>(smem + Shape::bias_offset(st)), lane % 4, p.scale);
    mbar::arrive(Shape::k_empty(base, st));
    if (!interior) {
      const int rows[2] = {warp_row0 + lane / 4, warp_row0 + lane / 4 + 8};
      hide_out_of_range(s, p, rows, key0, lane % 4);
    }
  } else if (p.bias) {
    const ScoreTiles tiles{nullptr, smem + Shape::bias_offset(st), 0, Shape::kBlockN, 0, false, true, false};
    apply_score_mod<T, false, kCols>(s, p, b, h, warp_row0, key0, lane, tiles);
    mbar::arrive(Shape::k_empty(base, st));
  } else if (raw) {
    mbar::arrive(Shape::k_empty(base, st));
    if (!interior_tile<kCols>(p, warp_row0, key0)) {
      const int rows[2] = {warp_row0 + lane / 4, warp_row0 + lane / 4 + 8};
      hide_out_of_range(s, p, rows, key0, lane % 4);
    }
  } else {
    mbar::arrive(Shape::k_empty(base, st));
    apply_score_mod<T, false, kCols>(s, p, b, h, warp_row0, key0, lane, ScoreTiles{});
  }
}

// A gathered key tile's biases and cover vote (load_key_terms), read from stage st's KeyInfo
// records once K's buffer is full, between issuing S and waiting for it: their loads' latency
// hides under the matmul (the cover vote alone where the terms are folded into S). Nothing for
// the other kinds.
struct NoKeyTerms {};
template <FwdWsKind kKind, class Shape, bool kFolded, int kCols>
__device__ __forceinline__ auto fwd_ws_key_terms(const unsigned char* smem, int st, int warp_row0, int lane) {
  if constexpr (kKind == FwdWsKind::gathered)
    return load_key_terms<kCols, !kFolded>(reinterpret_cast<const KeyInfo*>(smem + Shape::info_offset(st)), warp_row0,
                                           lane);
  else
    return NoKeyTerms{};
}

// One consumer warp group: 64 query rows against every key tile of `walk` (every tile below
// n_blocks but for scored calls, which skip those the mask rules out), then the epilogue.
// `warp` counts the consumer warps (0..7): group `group` holds warps 4 * group .. + 3.
// kFolded: a gathered call whose keys' terms are folded into S (KeyLists::bias_chunks), its
// scores unscaled.
template <class T, int kHeadDim, FwdWsKind kKind, bool kFolded, class Shape, class Walk>
__device__ __forceinline__ void fwd_ws_consume(const AttentionFwdParams& p, const FwdTensorMaps& maps, uint32_t base,
                                               unsigned char* smem, int n_listed, const Walk& walk, int first,
                                               int row0, int h, int b, int group, int warp, int lane) {
  constexpr bool kGather = kKind == FwdWsKind::gathered, kScored = fwd_ws_scored(kKind);
  using Mma = typename Shape::Mma;
  constexpr int kN = Mma::kTilesN, kDT = Mma::kTilesD;
  const int n_blocks = walk.n_blocks;
  const int warp_row0 = row0 + Mma::warp_row_offset(warp);
  float o[1][kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
  OnlineSoftmax<kN, kDT> softmax;
  // Unscaled scores where only the scale applies: the exponent's multiply-add scales them.
  const bool raw = kGather ? kFolded : !p.bias && p.softcap == 0.f && p.scale > 0.f;
  const float log2_scale = (raw ? p.scale : 1.f) * 1.4426950408889634f;
  // The tile's terms of a scored call: the summary's "kept whole" bit, the thread's row in them.
  auto mask_all = [&](int nb) {
    if constexpr (kScored)
      return walk.tiles.keeps_all(nb);
    else
      return false;
  };
  const int tile_row = Mma::warp_row_offset(warp) + lane / 4;

  // The ping-pong: barrier 1 + g is group g's turn to issue; it takes 256 threads, its own
  // group waiting and the other arriving. Group 0 starts; each group passes the turn after
  // issuing, except group 1 after its last step, which nobody would take.
  auto take_turn = [&] {
    if (group == 0)
      ptx::named_barrier_sync<1, 256>();
    else
      ptx::named_barrier_sync<2, 256>();
  };
  auto pass_turn = [&](bool last) {
    if (group == 0)
      ptx::named_barrier_arrive<2, 256>();
    else if (!last)
      ptx::named_barrier_arrive<1, 256>();
  };
  // Waits for a filled buffer. cp.async writes through the generic proxy and wgmma reads
  // through the async proxy: gathered tiles need the proxy fence once they are seen.
  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    mbar::wait(bar, parity);
    if constexpr (kGather) wgmma::fence_proxy_async_smem();
  };
  // Every consumer thread hands a V buffer back itself once its P V is done (fwd_ws_scores).
  auto release = [&](uint32_t bar) { mbar::arrive(bar); };

  if (first < n_blocks) {
    const uint32_t s_q = base + Shape::kQ;
    typename Mma::PFrag pf;
    // A gathered list's last tile runs 32 or 64 keys wide (32 on 64-key tiles) where it holds no
    // more, as in the other forward (attention_fwd.cuh); the first tile stays full width.
    int last_keys = Shape::kBlockN;
    if constexpr (kGather) {
      const int tail = n_listed - (n_blocks - 1) * Shape::kBlockN;
      if (p.narrow_last_tile && n_blocks >= 2) last_keys = tail <= 32 ? 32 : tail <= 64 ? 64 : Shape::kBlockN;
    }
    // The first key tile: S only (O is zero, nothing to rescale).
    auto first_step = [&](bool last) {
      float s[1][kN][4], alpha[2];
      wait_full(Shape::k_full(base, 0), 0);
      take_turn();
      Mma::template qk_issue<Shape::kBlockN, kFolded>(s, s_q, Shape::k_tile(base, 0), warp,
                                                           base + Shape::kQTerm, Shape::k_term_tile(base, 0));
      pass_turn(last);
      const auto key_terms = fwd_ws_key_terms<kKind, Shape, kFolded, kN>(smem, 0, warp_row0, lane);
      Mma::template wait_qk<false>(s);
      if constexpr (Shape::kMaskOverBias) mbar::wait(Shape::ready(base, 0), 0);  // the mask laid over the bias
      fwd_ws_scores<T, kKind, Shape, kFolded>(s[0], p, smem, base, 0, first * Shape::kBlockN, b, h, warp_row0, lane, raw,
                                     tile_row, mask_all(first), key_terms);
      softmax.scale_scores_log2(s[0], alpha, log2_scale);
      Mma::pack_p(pf, s);
    };
    // Step j >= 1 (key tile nb), kKeys wide: S(j) and P(j-1) V(j-1) issued together; the
    // softmax of S(j) runs while P V does. Every wgmma a step issues is waited on within it
    // (one in flight across a branch makes ptxas serialise them all, warning C7514).
    auto step = [&](auto keys_tag, int j, int nb, bool last) {
      constexpr int kKeys = decltype(keys_tag)::value;
      const int s_now = j % Shape::kStages, s_prev = (j - 1) % Shape::kVStages;  // K(j)'s, V(j-1)'s
      float s[1][kKeys / 8][4], alpha[2];
      wait_full(Shape::k_full(base, s_now), (j / Shape::kStages) & 1);
      wait_full(Shape::v_full(base, s_prev), ((j - 1) / Shape::kVStages) & 1);
      take_turn();
      Mma::template qk_issue<kKeys, kFolded>(s, s_q, Shape::k_tile(base, s_now), warp, base + Shape::kQTerm,
                                                  Shape::k_term_tile(base, s_now));
      Mma::pv_issue(o, pf, Shape::v_tile(base, s_prev));
      pass_turn(last);
      const auto key_terms = fwd_ws_key_terms<kKind, Shape, kFolded, kKeys / 8>(smem, s_now, warp_row0, lane);
      Mma::template wait_qk<true>(s);
      if constexpr (Shape::kMaskOverBias) mbar::wait(Shape::ready(base, s_now), (j / Shape::kStages) & 1);
      fwd_ws_scores<T, kKind, Shape, kFolded>(s[0], p, smem, base, s_now, nb * Shape::kBlockN, b, h, warp_row0, lane, raw,
                                     tile_row, mask_all(nb), key_terms);
      // With two V buffers gathered steps free V before the softmax: its branches (the exact
      // exponent's vote) kept ptxas from hoisting this wait and release above it as it had, and
      // the later release cost 3-4% at 16K and 32K keys (docs/performance.md). With three, and
      // in the dense kinds, the softmax runs under P V.
      auto free_v = [&] {
        Mma::wait_pv(o, pf);
        release(Shape::v_empty(base, s_prev));
      };
      constexpr bool kFreeVFirst = kGather && Shape::kVStages == 2;
      if constexpr (kFreeVFirst) free_v();
      softmax.scale_scores_log2(s[0], alpha, log2_scale);
      if constexpr (!kFreeVFirst) free_v();
      softmax.rescale(o[0], alpha);
      Mma::pack_p(pf, s);
    };
    // The P V of the last step, `last`, over its kKeys keys.
    auto last_pv = [&](auto keys_tag, int last) {
      constexpr int kKeys = decltype(keys_tag)::value;
      wait_full(Shape::v_full(base, last % Shape::kVStages), (last / Shape::kVStages) & 1);
      Mma::template pv_issue<kKeys>(o, pf, Shape::v_tile(base, last % Shape::kVStages));
      Mma::wait_pv(o, pf);
    };
    using Full = std::integral_constant<int, Shape::kBlockN>;
    if (group == 1) ptx::named_barrier_arrive<1, 256>();
    wait_full(Shape::q_full(base), 0);
    if constexpr (kScored) {
      int j = 0, nb = walk.next(first + 1);
      first_step(nb >= n_blocks);
      while (nb < n_blocks) {
        const int after = walk.next(nb + 1);
        step(Full{}, ++j, nb, after >= n_blocks);
        nb = after;
      }
      last_pv(Full{}, j);
    } else {
      const int full_end = last_keys < Shape::kBlockN ? n_blocks - 1 : n_blocks;
      first_step(n_blocks == 1);
      for (int j = 1; j < full_end; ++j) step(Full{}, j, j, j == n_blocks - 1);
      if constexpr (kGather) {
        if (last_keys == 32) {
          step(std::integral_constant<int, 32>{}, n_blocks - 1, n_blocks - 1, true);
          last_pv(std::integral_constant<int, 32>{}, n_blocks - 1);
        } else if (Shape::kBlockN > 64 && last_keys == 64) {  // (on 64-key tiles that is the full step)
          step(std::integral_constant<int, 64>{}, n_blocks - 1, n_blocks - 1, true);
          last_pv(std::integral_constant<int, 64>{}, n_blocks - 1);
        } else {
          last_pv(Full{}, n_blocks - 1);
        }
      } else {
        last_pv(Full{}, n_blocks - 1);
      }
    }
  }

  // Epilogue: normalise, store O and lse.
  softmax.finish();
  const float m_scale = raw ? p.scale : 1.f;
  if constexpr (!Shape::kStoreThroughCopy) {
    store_output_rows<T, true>(o[0], softmax, p, b, h, warp_row0, lane / 4, lane % 4, m_scale);
  } else {
    // Through the copy engine: the group's O rows laid over its own Q rows, which its last S
    // (waited on) was the last to read (and where no copy was issued: a CTA without key tiles
    // never loads Q). Stored from registers, 4 bytes a thread at a time, O took a D 128 CTA
    // about 2 us; the copy engine's store frees the CTA once it has read shared memory.
    stage_output_rows_sw128<T, true>(o[0], softmax, p, b, h, warp_row0, smem + Shape::kQ, Shape::kBlockM,
                                     Mma::warp_row_offset(warp), lane / 4, lane % 4, m_scale);
    wgmma::fence_proxy_async_smem();  // the generic writes, for the copy engine's (async proxy) reads
    if (group == 0)
      ptx::named_barrier_sync<3, 128>();
    else
      ptx::named_barrier_sync<4, 128>();
    if (warp % 4 == 0 && lane == 0) {
      const int group_row = group * Shape::kGroupRows;
#pragma unroll
      for (int c = 0; c < Shape::kColBlocks; ++c)
        tma::store_4d(&maps.o, base + Shape::kQ + c * Mma::kBlockBytesQ + group_row * wgmma::kSwizzleRowBytes, c * 64,
                      row0 + group_row, h, b);
      tma::bulk_commit_group();
      tma::bulk_wait_group_read<0>();  // shared memory stays the CTA's until the copy has read it
    }
  }
}

// Every tile below n_blocks, in order (dense and gathered calls).
struct FwdWsEveryTile {
  int n_blocks;
  __device__ int next(int nb) const { return nb; }
};

template <class T, int kHeadDim, FwdWsKind kKind>
__global__ void __launch_bounds__(FwdWsShape<T, kHeadDim, kKind>::kThreads, 1)
    attention_fwd_ws_kernel(const AttentionFwdParams p, const __grid_constant__ FwdTensorMaps maps) {
#if FDMA_SM90_ENABLED
  using Shape = FwdWsShape<T, kHeadDim, kKind>;
  constexpr bool kGather = Shape::kGather, kScored = Shape::kScored;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem<1024>(smem_raw);
  const uint32_t base = ptx::smem_addr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar::init(Shape::q_full(base), Shape::kFillArrivals);
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar::init(Shape::k_full(base, s), Shape::kFillArrivals);
      mbar::init(Shape::k_empty(base, s), 128 * Shape::kConsumers);
      if constexpr (Shape::kMaskOverBias) mbar::init(Shape::ready(base, s), kMaskHelperThreads);
    }
    for (int s = 0; s < Shape::kVStages; ++s) {
      mbar::init(Shape::v_full(base, s), Shape::kFillArrivals);
      mbar::init(Shape::v_empty(base, s), 128 * Shape::kConsumers);
    }
    mbar::fence_init();
  }
  if constexpr (Shape::kFold) {
    // The term slices: Q's row r chunk 0 holds (1, 1, 1, 0, ...), everything else zero until the
    // producer copies a key's chunk over its row's chunk 0. Fenced for the tensor core's reads.
    constexpr int kChunks = (1 + Shape::kStages) * Shape::kBlockM * 2;  // two 16-byte chunks a row
    for (int i = tid; i < kChunks; i += Shape::kThreads) {
      const int block = i / (Shape::kBlockM * 2), r = i / 2 % Shape::kBlockM, c = i % 2;
      const uint32_t one = 0x3F80u;  // bf16 1.0
      const uint4 v = block == 0 && c == 0 ? make_uint4(one | one << 16, one, 0u, 0u) : make_uint4(0u, 0u, 0u, 0u);
      ptx::st_shared_v4(base + Shape::kQTerm + block * Shape::kTermBlockBytes + wgmma::sw32_offset(r, c), v);
    }
    wgmma::fence_proxy_async_smem();
  }
  __syncthreads();
  ptx::griddep_wait();  // launched overlapping its predecessor (the list kernels, the mask summary): its writes
  // Gathered bf16 calls: whether the keys' terms are folded into S. The lists carry chunks only
  // for calls that may fold (lists_fold_bias: no softcap, a positive scale); fold_off, where some
  // kept key's term does not fit.
  const bool fold = Shape::kFold && p.lists.bias_chunks && *p.lists.fold_off == 0;

  // Causal: the longest tiles first. Gathered CTAs keep grid order (attention_fwd.cuh).
  const QueryTileCta cta = query_tile_cta(!kGather && p.causal);
  const int h = cta.y, b = blockIdx.z, hk = h / p.G;
  const int row0 = cta.m_block * Shape::kBlockM;
  int n_listed = 0;
  const int32_t* list =
      kGather ? tile_key_list(p.lists, int64_t(b) * p.Hk + hk, row0, n_listed) : nullptr;
  const int key_end = kGather ? n_listed : p.causal ? min(p.Sk, row0 + Shape::kBlockM + p.Sk - p.Sq) : p.Sk;
  const int n_blocks = key_end > 0 ? (key_end + Shape::kBlockN - 1) / Shape::kBlockN : 0;

  // Scored calls walk the tiles the mask summary leaves active, through a table every thread
  // helps build where the call has room for one (FwdWsTerms).
  auto run = [&](const auto& walk, int first) {
    if (warp < 4) {
      wgmma::regs_shrink<Shape::kProducerRegs>();
      if constexpr (kGather)
        fwd_ws_produce_gather<T, kHeadDim, Shape>(p, base, list, n_listed, n_blocks, row0, h, hk, b, tid, fold);
      else if constexpr (kScored) {
        if (warp == 0 && lane == 0) fwd_ws_produce_scored<Shape>(p, maps, base, walk, first, row0, h, hk, b);
        if constexpr (Shape::kMaskOverBias)
          if (warp > 0) fwd_ws_lay_masks<T, Shape>(p, base, walk, first, row0, h, b, tid - 32);
      } else if (warp == 0 && lane == 0)
        fwd_ws_produce_tma<Shape>(maps, base, n_blocks, row0, h, hk, b,
                                  p.bias ? Shape::kBlockN * (p.bias_f32 ? 4 : 2) : 0,
                                  int(head_index(p.bias_head_mode, h, p.G)), p.bias_stride[0] == 0 ? 0 : b);
    } else {
      wgmma::regs_grow<Shape::kConsumerRegs>();
      const int consumer_warp = warp - 4;
      // Both kinds of gathered step as loops of their own: one step with both, chosen per score
      // path, spilled ten times the registers.
      if (fold)
        fwd_ws_consume<T, kHeadDim, kKind, Shape::kFold, Shape>(p, maps, base, smem, n_listed, walk, first, row0, h,
                                                                b, consumer_warp / 4, consumer_warp, lane);
      else
        fwd_ws_consume<T, kHeadDim, kKind, false, Shape>(p, maps, base, smem, n_listed, walk, first, row0, h, b,
                                                         consumer_warp / 4, consumer_warp, lane);
    }
  };
  if constexpr (kScored) {
    using Summary = FwdWsSummary<Shape, kHeadDim>;
    const Summary tiles = Summary::of(p, b, h, cta.m_block);
    const FwdWsTerms<Shape> terms(p);
    int16_t* table = tiles.row && next_active_bytes(p, Shape::kBlockN)
                         ? reinterpret_cast<int16_t*>(smem + terms.table_at())
                         : nullptr;
    if (table) build_next_active(table, n_blocks, [&](int nb) { return tiles.active(nb); }, tid, Shape::kThreads);
    const FwdWsWalk<Summary> walk{tiles, table, n_blocks};
    run(walk, walk.next(0));
  } else {
    run(FwdWsEveryTile{n_blocks}, 0);
  }
#else
  __trap();  // dispatch launches it only on sm_90a code (arch_dispatch.cuh)
#endif
}

// The kind of kernel a call without key lists takes, as far as its terms decide.
inline FwdWsKind fwd_ws_kind(const AttentionFwdParams& p) {
  if (p.lists.keys) return FwdWsKind::gathered;
  return p.mask || (p.bias && p.bias_stride[2] != 0) ? FwdWsKind::scored : FwdWsKind::dense;
}

// Whether the warp-specialized forward of kind kKind takes this call (the caller checks the device
// and that fwd_ws_kind(p) == kKind, or is scored for scored_narrow and masked_biased): the kinds
// that store O through the copy engine (kStoreThroughCopy) where it can describe out; gathered
// calls then where their lists' tiles are the CTA's 128 rows and k's and v's row strides fit 32
// bits; the others at exactly this head dim where
// the copy engine can describe q, k, v, the bias and the mask (maps filled here), and for scored
// calls where their terms fit in shared memory (a mask tile and a bias tile together: at D = 64 on
// 128-key tiles, at D = 128 on the narrow kind's 64-key ones, at D = 256 the mask laid over the
// bias; a bias with a query dim in q's dtype). masked_biased: only a mask with a query dim and
// such a bias.
template <class T, int kHeadDim, FwdWsKind kKind>
bool attention_fwd_ws_applies(const AttentionFwdParams& p, FwdTensorMaps& maps) {
  using Shape = FwdWsShape<T, kHeadDim, kKind>;
  if (!fwd_ws_allowed()) return false;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  // O's store through the copy engine: out's map, its box a consumer group's rows. The backend
  // asks of out what the map needs (16-byte aligned rows), so only a driver without the
  // encoder sends such a call to the other forward.
  if (Shape::kStoreThroughCopy &&
      !encode_rows_map(maps.o, p.out, bf16, p.D, p.Sq, p.H, p.B, p.out_stride, Shape::kGroupRows))
    return false;
  if constexpr (kKind == FwdWsKind::gathered) {  // the gathering producer's row offsets: 32-bit strides
    const int64_t most = int64_t(INT32_MAX) / int64_t(sizeof(T));
    // Lists of the CTA's 128-row query tiles (kFwdListBlockM; one list for every tile is any tile's)
    const bool tiles = p.lists.count_tiles == 1 || 1 << p.lists.tile_rows_log2 == Shape::kBlockM;
    return tiles && p.k_stride[1] <= most && p.v_stride[1] <= most;
  } else {
    if (p.D != kHeadDim || (p.mask && !p.mask_tiled) || (p.bias && !p.bias_tiled)) return false;
    const bool bias_keys = p.bias && p.bias_stride[2] == 0;
    if constexpr (kKind == FwdWsKind::dense) {
      if (p.mask || (p.bias && !bias_keys)) return false;
    } else {
      if (p.bias && !bias_keys && p.bias_f32) return false;
      if (kKind == FwdWsKind::masked_biased && !(p.mask && p.mask_stride[2] != 0 && p.bias && !bias_keys)) return false;
      AttentionFwdParams untabled = p;
      untabled.next_active_table = false;
      if (FwdWsTerms<Shape>(p).smem_bytes(untabled) > 227 * 1024) return false;
    }
    if (p.mask) {
      const bool ok = p.mask_stride[2] == 0
                          ? encode_mask_keys(maps.mask, p, Shape::kBlockN)
                          : encode_mask_tiles(maps.mask, p, Shape::kBlockN, Shape::kBlockM);
      if (!ok) return false;
    }
    if (p.bias) {
      const CUtensorMapDataType dtype = p.bias_f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                        : bf16     ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      const bool ok = bias_keys ? encode_bias_keys(maps.bias, p, dtype, Shape::kBlockN)
                                : encode_bias_tiles(maps.bias, p, dtype, Shape::kBlockM);
      if (!ok) return false;
    }
    return encode_rows_map(maps.q, p.q, bf16, p.D, p.Sq, p.H, p.B, p.q_stride, Shape::kBlockM) &&
           encode_rows_map(maps.k, p.k, bf16, p.D, p.Sk, p.Hk, p.B, p.k_stride, Shape::kBlockN) &&
           encode_rows_map(maps.v, p.v, bf16, p.D, p.Sk, p.Hk, p.B, p.v_stride, Shape::kBlockN);
  }
}

template <class T, int kHeadDim, FwdWsKind kKind>
cudaError_t launch_attention_fwd_ws(const AttentionFwdParams& params, const FwdTensorMaps& maps, int device,
                                    cudaStream_t stream) {
  using Shape = FwdWsShape<T, kHeadDim, kKind>;
  auto kernel = attention_fwd_ws_kernel<T, kHeadDim, kKind>;
  AttentionFwdParams p = params;
  int smem = Shape::kSmemBytes;
  if constexpr (Shape::kScored) {
    // The next-active table only where it fits beside the terms (attention_fwd_ws_applies
    // checked the rest).
    const FwdWsTerms<Shape> terms(p);
    if (terms.smem_bytes(p) > 227 * 1024) p.next_active_table = false;
    smem = terms.smem_bytes(p);
  }
  static std::atomic<int> granted[kMaxDevices] = {};
  cudaError_t err = grant_smem_once(kernel, smem, device < kMaxDevices ? granted : nullptr, device);
  if (err != cudaSuccess) return err;
  dim3 grid((p.Sq + Shape::kBlockM - 1) / Shape::kBlockM, p.H, p.B);
  return launch_kernel(p.overlap_previous, kernel, grid, Shape::kThreads, smem, stream, p, maps);
}

}  // namespace fdma::cuda
