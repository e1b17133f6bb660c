// Split-K attention of a few queries over a row's kept keys (docs/decode.md). Grid (splits,
// B * Hk, m-tiles): a CTA takes one KV head's 16 (group head, query) rows, so the G query heads
// of the head share every K/V row read, and one contiguous share of the row's kept-key list
// (or, dense, of its cached positions). Its 4 warps each walk 16 keys of every 64-key block,
// with an online softmax of their own (mma.sync m16n8k16, fp32 accumulation); the warps'
// results merge in shared memory at the end, and the splits' in decode_combine.cu.
//
// Memory-bound by design: each kept K/V row is read once per m-tile (once in all when
// G * Sq <= 16), gathered with cp.async into a buffer of kStages blocks (two at three CTAs an
// SM, or three at two: kvcache_cuda.cu picks per grid).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/decode/cache_view.cuh"
#include "cuda/decode/decode_params.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"

namespace fdma::cuda {

// Up to head dim 128 the Q fragments live in registers: Q passes through the last stage's
// buffer before the loop, and the 4 KB it would hold for good is what lets three CTAs share an
// H100 SM instead of two (76 KB a CTA before). Wider heads keep Q in shared memory (their
// accumulators fill the registers, and one CTA an SM is all their buffers allow either way).
template <class T, int kHeadDim, int kStages_>
struct DecodeTile {
  static constexpr int kWarps = 4, kThreads = 128, kBlockN = 64, kRows = 16, kStages = kStages_;
  static constexpr int kRowBytes = padded_row_bytes(kHeadDim);
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr bool kQInRegisters = kHeadDim <= 128;
  static constexpr int kQBytes = kQInRegisters ? 0 : kRows * kRowBytes;  // shared memory kept for Q
  static constexpr int kKvBytes = kBlockN * kRowBytes;  // K or V, one stage
  static constexpr int kStageBytes = 2 * kKvBytes;
  static_assert(kRows * kRowBytes <= kKvBytes, "Q passes through a K buffer");
  static constexpr int kMergeBytes = kWarps * kRows * kHeadDim * 4;  // the warps' O, after the loop
  static_assert(kMergeBytes <= kStages * kStageBytes, "the merge reuses the K/V buffers");
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  // Caps registers so that the CTAs the shared memory allows fit (170 a thread at three).
  static constexpr int kMinCtasPerSm = !kQInRegisters ? 1 : kStages == 2 ? 3 : 2;
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Per stage, per key of the block: its queries, score and the K/V row offsets.
struct BlockKeys {
  int64_t k_off[64], v_off[64];
  uint32_t queries[64];
  float score[64];
};

template <class T, int kHeadDim, int kStages>
__global__ void __launch_bounds__(128, (DecodeTile<T, kHeadDim, kStages>::kMinCtasPerSm))
    decode_attention_kernel(DecodeAttentionArgs a) {
  using Tile = DecodeTile<T, kHeadDim, kStages>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ BlockKeys keys[Tile::kStages];
  __shared__ float warp_m[Tile::kWarps][16], warp_l[Tile::kWarps][16];
  __shared__ int warp_nan[Tile::kWarps][16];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int split = blockIdx.x, row = blockIdx.y, mtile = blockIdx.z;
  const CacheView& c = a.cache;
  const int b = row / c.Hk, hk = row - b * c.Hk;
  const int L = cache_length(c, b);
  const int rows_total = a.G * a.Sq;

  const uint32_t kv_smem = ptx::smem_addr(smem) + Tile::kQBytes;
  // Q's rows: for good before the K/V stages, or for now in the last stage's K buffer (which
  // the pipeline's first fills leave alone).
  const uint32_t q_smem =
      Tile::kQInRegisters ? kv_smem + (kStages - 1) * Tile::kStageBytes : ptx::smem_addr(smem);

  // Q: rows (group head gh, query i) = (r / Sq, r % Sq) of this m-tile.
  {
    const T* q = static_cast<const T*>(a.q);
    for (int e = tid; e < 16 * Tile::kChunks; e += 128) {
      const int r = e / Tile::kChunks, ch = e % Tile::kChunks, rr = mtile * 16 + r;
      const bool ok = rr < rows_total && ch * 8 < a.D;
      const int gh = ok ? rr / a.Sq : 0, i = ok ? rr - gh * a.Sq : 0;
      const T* src = q + b * a.q_stride[0] + i * a.q_stride[1] + (hk * a.G + gh) * a.q_stride[2] + ch * 8;
      ptx::cp_async_16(q_smem + r * Tile::kRowBytes + ch * 16, ok ? src : q, ok ? 16 : 0);
    }
    ptx::cp_async_commit();
  }
  // Launched overlapping the selection (or the append), the kernel has read only what
  // predates the call so far: q and the lengths. The kept list and appended rows come after.
  ptx::griddep_wait();
  const int n = a.list || a.kept_state ? min(a.state[row].listed, a.list_cap) : L;
  const int k_begin = split * a.split_keys, k_end = min(n, k_begin + a.split_keys);
  // The queries of this thread's two accumulator rows (g, g + 8); -1 for padding rows.
  int qi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rr = mtile * 16 + g + 8 * h;
    qi[h] = rr < rows_total ? rr % a.Sq : -1;
  }

  // Block blk's key records (threads < 64, one key each): the kept list's entry, the state's,
  // or dense, the position itself. They are fetched one block ahead of their K/V rows, into
  // registers, so that a block's K/V loads never wait on its records' latency.
  const T* kc = static_cast<const T*>(c.k);
  const T* vc = static_cast<const T*>(c.v);
  auto fetch_record = [&](int blk) {
    KeptKey rec{0, 0, 0u, 0.f};
    const int idx = k_begin + blk * 64 + tid;
    if (tid < 64 && idx < k_end) {
      if (a.list) {
        rec = a.list[size_t(row) * a.list_cap + idx];
      } else if (a.kept_state) {  // one query, which keeps every key of the set
        const int32_t* st = a.kept_state + b * a.kept_state_stride[0] + hk * a.kept_state_stride[1];
        const int pos = st[1 + idx];
        const float score = __int_as_float(st[1 + a.kept_state_slots + idx]);
        int outer, inner;
        if (locate(c, b, pos, outer, inner)) rec = KeptKey{pos, outer, 1u << 16, score};
      } else {
        int outer, inner;
        if (locate(c, b, idx, outer, inner)) {
          const int first = a.causal ? max(0, idx - (L - a.Sq)) : 0;
          rec = KeptKey{idx, outer, uint32_t(first) | (uint32_t(a.Sq) << 16), 0.f};
        }
      }
    }
    return rec;
  };
  KeptKey pending = fetch_record(0);
  // Block blk's records into keys[stage] and its K/V rows on their way into `stage`.
  auto prefetch = [&](int blk, int stage) {
    if (tid < 64) {
      const KeptKey rec = pending;
      pending = fetch_record(blk + 1);
      const int outer = rec.page;  // the page, or the batch of a contiguous cache
      const int inner = c.block_table ? rec.pos - c.page_size.div(rec.pos) * c.page_size.divisor : rec.pos;
      keys[stage].queries[tid] = rec.queries;
      keys[stage].score[tid] = rec.score;
      keys[stage].k_off[tid] = rec.queries ? outer * c.k_stride[0] + inner * c.k_stride[1] + hk * c.k_stride[2] : -1;
      keys[stage].v_off[tid] = rec.queries ? outer * c.v_stride[0] + inner * c.v_stride[1] + hk * c.v_stride[2] : -1;
    }
    __syncthreads();
    const uint32_t base = kv_smem + stage * Tile::kStageBytes;
    for (int e = tid; e < 64 * Tile::kChunks; e += 128) {
      const int r = e / Tile::kChunks, ch = e % Tile::kChunks;
      const int64_t ko = keys[stage].k_off[r], vo = keys[stage].v_off[r];
      const bool ok = ko >= 0 && ch * 8 < a.D;
      ptx::cp_async_16(base + r * Tile::kRowBytes + ch * 16, ok ? kc + ko + ch * 8 : kc, ok ? 16 : 0);
      ptx::cp_async_16(base + Tile::kKvBytes + r * Tile::kRowBytes + ch * 16, ok ? vc + vo + ch * 8 : vc, ok ? 16 : 0);
    }
    ptx::cp_async_commit();
  };

  constexpr int kDTiles = kHeadDim / 8;
  float o[kDTiles][4];
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  bool nan_row[2] = {false, false};

  const int nblk = k_end > k_begin ? (k_end - k_begin + 63) / 64 : 0;
  // The pipeline's first kStages - 1 blocks (empty groups past the last, so that the group
  // count is the same for every split).
#pragma unroll
  for (int blk = 0; blk < kStages - 1; ++blk) {
    if (blk < nblk) prefetch(blk, blk);
    else ptx::cp_async_commit();
  }
  // Q's A fragments, one per 16 columns (registers, or read from shared memory per block).
  constexpr int kQFrags = Tile::kQInRegisters ? kHeadDim / 16 : 1;
  uint32_t q_frag[kQFrags][4];
  const int q_mat = lane / 8, q_r8 = lane % 8;
  auto q_fragment = [&](int kk, uint32_t (&qa)[4]) {
    ptx::ldmatrix_x4(qa, q_smem + ((q_mat % 2) * 8 + q_r8) * Tile::kRowBytes + (kk * 16 + (q_mat / 2) * 8) * 2);
  };
  if constexpr (Tile::kQInRegisters) {
    ptx::cp_async_wait<kStages - 1>();  // Q's group, committed before the blocks'
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kQFrags; ++kk) q_fragment(kk, q_frag[kk]);
    __syncthreads();  // every warp has its fragments before the last stage is filled
  }
  for (int blk = 0; blk < nblk; ++blk) {
    const int stage = blk % kStages;
    // The block kStages - 1 ahead goes into the stage computed last iteration.
    const int ahead = blk + kStages - 1;
    if (ahead < nblk) prefetch(ahead, ahead % kStages);
    else ptx::cp_async_commit();
    ptx::cp_async_wait<kStages - 1>();
    __syncthreads();
    const uint32_t k_tile = kv_smem + stage * Tile::kStageBytes + warp * 16 * Tile::kRowBytes;
    const uint32_t v_tile = k_tile + Tile::kKvBytes;

    // S = Q K^T for the warp's 16 keys: two n-tiles of 8.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t kb[4];
      const int mat = lane / 8, r8 = lane % 8;
      ptx::ldmatrix_x4(kb, k_tile + ((mat / 2) * 8 + r8) * Tile::kRowBytes + (kk * 16 + (mat % 2) * 8) * 2);
      if constexpr (Tile::kQInRegisters) {
        ptx::mma_16816<T>(s[0], q_frag[kk], kb[0], kb[1]);
        ptx::mma_16816<T>(s[1], q_frag[kk], kb[2], kb[3]);
      } else {
        uint32_t qa[4];
        q_fragment(kk, qa);
        ptx::mma_16816<T>(s[0], qa, kb[0], kb[1]);
        ptx::mma_16816<T>(s[1], qa, kb[2], kb[3]);
      }
    }

    // Scores masked by each key's query interval; the online softmax, whose exponents take the
    // log2 factor after the subtraction: a score near -FLT_MAX (a key's term as a sentinel) times
    // log2(e) would overflow to -inf and hide a row that sees only such keys.
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = warp * 16 + nt * 8 + 2 * t + (e & 1), h = e >> 1;
        const uint32_t qs = keys[stage].queries[key];
        const bool visible = qi[h] >= int(qs & 0xffffu) && qi[h] < int(qs >> 16);
        float x = s[nt][e] * a.scale;
        if (a.softcap > 0.f) x = a.softcap * tanhf(x / a.softcap);
        if (a.add_scores) x += keys[stage].score[key];
        if (visible && isnan(x)) nan_row[h] = true;
        x = visible && !isnan(x) ? x : -INFINITY;
        s[nt][e] = x;
        row_max[h] = fmaxf(row_max[h], x);
      }
    float corr[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 2));
      const float m_new = fmaxf(m[h], row_max[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      corr[h] = ptx::exp2_approx((m[h] - m_use[h]) * kLog2e);
      m[h] = m_new;
      l[h] *= corr[h];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = ptx::exp2_approx((s[nt][e] - m_use[e >> 1]) * kLog2e);
        l[e >> 1] += s[nt][e];
      }
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      o[d][0] *= corr[0], o[d][1] *= corr[0], o[d][2] *= corr[1], o[d][3] *= corr[1];
    }
    // O += P V: P from the accumulators (keys 0-7 in s[0], 8-15 in s[1]); V through ldmatrix.trans.
    uint32_t pa[4];
    ptx::pack_a_frag<T>(pa, s[0], s[1]);
#pragma unroll
    for (int d = 0; d < kDTiles; d += 2) {
      uint32_t vb[4];
      const int mat = lane / 8, r8 = lane % 8;
      ptx::ldmatrix_x4_trans(vb, v_tile + ((mat % 2) * 8 + r8) * Tile::kRowBytes + ((d + mat / 2) * 8) * 2);
      ptx::mma_16816<T>(o[d], pa, vb[0], vb[1]);
      ptx::mma_16816<T>(o[d + 1], pa, vb[2], vb[3]);
    }
    __syncthreads();  // the stage is refilled next iteration
  }
  ptx::cp_async_wait<0>();
  ptx::griddep_launch_dependents();  // the split merge may get its CTAs placed
  __syncthreads();

  // Merge the warps: m, l, NaN flags per row, O through shared memory (over the K/V buffers).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    int any_nan = nan_row[h];  // over the row's quad
    any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, 1);
    any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, 2);
    if (t == 0) {
      warp_m[warp][g + 8 * h] = m[h];
      warp_l[warp][g + 8 * h] = l[h];
      warp_nan[warp][g + 8 * h] = any_nan;
    }
  }
  float* merge = reinterpret_cast<float*>(smem + Tile::kQBytes);  // [warp][16][kHeadDim]
#pragma unroll
  for (int d = 0; d < kDTiles; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      merge[(warp * 16 + g + 8 * (e >> 1)) * kHeadDim + d * 8 + 2 * t + (e & 1)] = o[d][e];
  __syncthreads();

  const int qrow_base = (b * a.H + hk * a.G) * a.Sq;  // ((b * H + h) * Sq + i) = base + rr
  for (int e = tid; e < 16 * a.D; e += 128) {
    const int r = e / a.D, col = e - r * a.D, rr = mtile * 16 + r;
    if (rr >= rows_total) continue;
    float M = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) M = fmaxf(M, warp_m[w][r]), nan |= warp_nan[w][r] != 0;
    float Lsum = 0.f, Osum = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < Tile::kWarps; ++w) {
        const float f = ptx::exp2_approx((warp_m[w][r] - M) * kLog2e);
        Lsum += warp_l[w][r] * f;
        Osum += merge[(w * 16 + r) * kHeadDim + col] * f;
      }
    }
    const float out = nan ? NAN : Lsum > 0.f ? Osum / Lsum : 0.f;
    const float lse = nan ? NAN : Lsum > 0.f ? M + log2f(Lsum) * kLn2 : -INFINITY;
    const int gh = rr / a.Sq, i = rr - gh * a.Sq, h = hk * a.G + gh;
    if (a.splits == 1) {
      T* dst = static_cast<T*>(a.out) + b * a.out_stride[0] + i * a.out_stride[1] + h * a.out_stride[2];
      dst[col] = T(out);
      if (a.lse && col == 0) a.lse[b * a.lse_stride[0] + h * a.lse_stride[1] + i * a.lse_stride[2]] = lse;
    } else {
      const size_t qrow = size_t(qrow_base + rr);
      a.part_out[(qrow * a.splits + split) * a.D + col] = out;
      if (col == 0) a.part_lse[qrow * a.splits + split] = lse;
    }
  }
}

template <class T, int kHeadDim, int kStages>
cudaError_t launch_decode_attention_stages(const DecodeAttentionArgs& a, dim3 grid, cudaStream_t stream, bool overlap) {
  using Tile = DecodeTile<T, kHeadDim, kStages>;
  auto kernel = decode_attention_kernel<T, kHeadDim, kStages>;
  static std::atomic<int> granted[kMaxDevices] = {};
  if (const cudaError_t err = grant_smem_once(kernel, Tile::kSmemBytes, granted); err != cudaSuccess) return err;
  return launch_kernel(overlap, kernel, grid, dim3(Tile::kThreads), Tile::kSmemBytes, stream, a);
}

template <class T, int kHeadDim>
cudaError_t launch_decode_attention(const DecodeAttentionArgs& a, int stages, dim3 grid, cudaStream_t stream,
                                    bool overlap) {
  return stages == 3 ? launch_decode_attention_stages<T, kHeadDim, 3>(a, grid, stream, overlap)
                     : launch_decode_attention_stages<T, kHeadDim, 2>(a, grid, stream, overlap);
}

// CTAs of the kernel one SM holds at once on the current device (0 if the query fails),
// queried once per device and depth.
template <class T, int kHeadDim, int kStages>
int decode_attention_ctas_per_sm_stages() {
  using Tile = DecodeTile<T, kHeadDim, kStages>;
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] {
    auto kernel = decode_attention_kernel<T, kHeadDim, kStages>;
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Tile::kThreads, Tile::kSmemBytes) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  });
}

template <class T, int kHeadDim>
int decode_attention_ctas_per_sm(int stages) {
  return stages == 3 ? decode_attention_ctas_per_sm_stages<T, kHeadDim, 3>()
                     : decode_attention_ctas_per_sm_stages<T, kHeadDim, 2>();
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_DECODE_ATTENTION(T, HD)                                                                     \
  template cudaError_t fdma::cuda::launch_decode_attention<T, HD>(const fdma::cuda::DecodeAttentionArgs&, int, dim3, \
                                                                  cudaStream_t, bool);                             \
  template int fdma::cuda::decode_attention_ctas_per_sm<T, HD>(int);
