// The selection by a cluster of CTAs per (batch, KV head) row, on sm_90. A CTA per row
// (select_rows.cuh) leaves all but B * Hk SMs idle: at 16K keys and 4 rows, 4 SMs spent 73 us
// on the rank sort and 70 us on the 14 wavelet levels, latency-bound on barriers. Here each row
// is cut into C segments (C <= 8, a portable cluster, up to 32K keys; 16 above, where the GPU
// can place such a cluster, and past 16K keys where the rows are few), one per CTA, and the
// CTAs exchange data through distributed shared memory:
//   - the rank sort is a least-significant-digit radix sort over the 32 inverted score bits,
//     8 bits per pass, less the low digits that 16-bit scores leave decided (select_topw.cuh:
//     two passes for bfloat16, three for float16). Each pass ranks the CTA's keys by digit
//     (stable), reads the peers' digit counts, and stores every key straight into the CTA
//     that holds its destination. The input is in index order and every pass is stable, so
//     ties go to the lower index;
//   - each wavelet level counts its segment's zeros, places them after the zeros of the
//     segments before (the row's total is known in closed form, zeros_of_bit), partitions the
//     segment locally and copies its zeros and its ones as two runs into the peers, 16 bytes
//     a store (a level 5.6K -> 5.1K cycles at 16K against a 4-byte store per key). The next
//     level's zero counts per segment travel with that copy (a C x C table of counts per
//     destination), so a level costs one cluster barrier.
// Rows up to kClusterRowMaxKeys keys; the results are the ones the other paths write
// (docs/performance.md, "selection").
#pragma once

#include <cooperative_groups.h>

#include <cub/block/block_radix_rank.cuh>

#include <cstddef>
#include <cstdint>

#include "cuda/primitives/ptx.cuh"
#include "cuda/select/rank_key.cuh"
#include "cuda/select/select_rows.cuh"
#include "cuda/primitives/warp_scan.cuh"

namespace fdma::cuda {

// CTA shapes (threads x keys per thread): 256 x 8 for segments up to 2048 keys, 512 x 8 up to
// 4096, 512 x 16 up to 8192 (fewer warps where they suffice: shorter block scans, and two CTAs
// fit an SM).
constexpr int kClusterPortableCtas = 8, kClusterMaxCtas = 16;
constexpr int kClusterPortableRowKeys = 512 * 8 * kClusterPortableCtas;
// Rows past this many keys take sixteen CTAs where few rows leave SMs idle (select_topw.cu,
// cluster_wide): segments of more than 1024 keys (at 16K keys sixteen CTAs were slower than
// eight, at 32K faster: docs/performance.md, "selection").
constexpr int kClusterWideRowKeys = 1024 * kClusterMaxCtas;
constexpr int kClusterRowMaxKeys = 512 * 16 * kClusterMaxCtas;
constexpr int kDigitBits = 8, kDigits = 1 << kDigitBits;

template <int kThreads, int kItems>
struct ClusterConfig {
  static constexpr int kWarps = kThreads / 32, kSegMax = kThreads * kItems;
  static_assert(kThreads >= kDigits && kThreads >= kClusterMaxCtas * kClusterMaxCtas,
                "a thread per digit and per count of the C x C table");
  static_assert(kItems % 4 == 0 && kItems <= 32 && kItems * kWarps % 32 == 0, "item bytes, bits and scan lanes");
  using Rank = cub::BlockRadixRankMatch<kThreads, kDigitBits, false>;
  struct Smem {
    uint2 kv[2][kSegMax];          // (inverted score bits, key index) by sort pass parity: one 8-byte store
    int32_t seq[2][kSegMax];       // the wavelet sequence by level parity
    int32_t digit_count[kDigits];  // this CTA's keys per digit in the current pass
    int32_t digit_base[kDigits];   // destination of the digit's first key, less its local start
    int32_t digit_scan[kWarps];
    int32_t sent[2][kClusterMaxCtas][kClusterMaxCtas];  // [level parity][from][to]: next level's zeros
    int32_t sent_here[kClusterMaxCtas];                 // this CTA's row of that table, being counted
    int32_t counts[kItems * kWarps];                    // zeros per (item, warp), then their prefix
    int32_t zeros_before, zeros_here;  // the level's zeros in the segments before, in this one
    typename Rank::TempStorage rank;
  };
};

// Bytes of dynamic shared memory the kernel needs.
template <int kThreads, int kItems>
constexpr size_t select_cluster_smem() {
  return sizeof(typename ClusterConfig<kThreads, kItems>::Smem);
}

struct DigitOf {
  int shift;
  __device__ __forceinline__ uint32_t Digit(uint32_t key) const { return (key >> shift) & (kDigits - 1); }
};

namespace cluster_detail {

// Per-thread counts of flagged items per destination CTA, 16 bits each (to < 16).
struct SentCounts {
  uint64_t q[kClusterMaxCtas / 4] = {};  // destinations 4k .. 4k + 3
  __device__ __forceinline__ void add(int to, bool flag) {
    const uint64_t one = uint64_t(flag) << (16 * (to & 3));
#pragma unroll
    for (int k = 0; k < kClusterMaxCtas / 4; ++k)
      if (to >> 2 == k) q[k] += one;
  }
};

// Adds the warp's counts into sent_here (a shared atomic per destination with any).
__device__ __forceinline__ void flush_sent(const SentCounts& s, int32_t* sent_here, int C) {
#pragma unroll
  for (int k = 0; k < kClusterMaxCtas / 4; ++k) {
    if (4 * k >= C) break;  // uniform
    const uint32_t lo = __reduce_add_sync(0xffffffffu, uint32_t(s.q[k])),
                   hi = __reduce_add_sync(0xffffffffu, uint32_t(s.q[k] >> 32));
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (const uint32_t n = ((e < 2 ? lo : hi) >> (16 * (e % 2))) & 0xffffu) atomicAdd(&sent_here[4 * k + e], int32_t(n));
  }
}

// Exclusive prefix of v over threads 0 .. kDigits - 1 (the others pass 0 and get junk);
// ends on a barrier.
__device__ __forceinline__ int32_t digit_exclusive_scan(int32_t v, int32_t* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t inclusive = warp_inclusive_sum(v);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int32_t before = inclusive - v;
#pragma unroll
  for (int k = 0; k < kDigits / 32; ++k) before += k < warp ? warp_sums[k] : 0;
  __syncthreads();
  return before;
}


// Copies stage[s .. s + len) to the row positions [g0, g0 + len) of the peers' `seq` (the
// CTA holding position g at g - (g / seg) * seg): 16-byte stores where the positions are
// aligned (s = g0 mod 4, seg % 4 == 0), single ones at the run's ends. Counts the values
// whose bit `next_bit` is 0 per destination (next_bit < 0: none).
template <int kThreads, class Cluster>
__device__ __forceinline__ void copy_run(const Cluster& cluster, const int32_t* stage, int s, int g0, int len,
                                         int32_t* seq, int seg, int next_bit, SentCounts& sent) {
  const int head = min(len, (4 - (g0 & 3)) & 3), body = (len - head) / 4, tail = len - head - 4 * body;
  const int tid = threadIdx.x;
  if (tid < head + tail) {
    const int e = tid < head ? tid : head + 4 * body + (tid - head);
    const int g = g0 + e, to = g / seg;
    const int32_t v = stage[s + e];
    cluster.map_shared_rank(seq, to)[g - to * seg] = v;
    if (next_bit >= 0) sent.add(to, ((v >> next_bit) & 1) == 0);
  }
  for (int q = tid; q < body; q += kThreads) {
    const int e = head + 4 * q, g = g0 + e, to = g / seg;
    const int4 v = *reinterpret_cast<const int4*>(stage + s + e);
    *reinterpret_cast<int4*>(cluster.map_shared_rank(seq, to) + (g - to * seg)) = v;
    if (next_bit >= 0) {
      sent.add(to, ((v.x >> next_bit) & 1) == 0);
      sent.add(to, ((v.y >> next_bit) & 1) == 0);
      sent.add(to, ((v.z >> next_bit) & 1) == 0);
      sent.add(to, ((v.w >> next_bit) & 1) == 0);
    }
  }
}

}  // namespace cluster_detail

// Grid (C, B * Hk) in clusters of (C, 1, 1); CTA c holds positions [c * seg, c * seg + seg) of
// its row (index order before the sort, rank order after), seg % 4 == 0. Writes keys_out /
// idx_out as the device-wide sort does and, given rank0 (causal), the row's wavelet levels as
// select_rows.cuh. (Walking the levels for the intervals here too, with a thread per 8 keys,
// took longer than the separate kernel with a thread per key: 93 against 69 + 8 us at 16K.)
template <int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads)
    select_cluster_kernel(TopwInputs in, int seg, int levels, uint64_t* keys_out, int32_t* idx_out, int32_t* rank0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using namespace cluster_detail;
  using Config = ClusterConfig<kThreads, kItems>;
  using Rank = typename Config::Rank;
  constexpr int kWarps = Config::kWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<typename Config::Smem*>(smem_raw);
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = int(cluster.num_blocks()), c = int(cluster.block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.y, Sk = in.Sk, first = c * seg, mine = min(seg, Sk - first);
  const int64_t row0 = int64_t(row) * Sk, n = int64_t(in.B) * in.Hk * Sk;
  const bool causal = rank0 != nullptr;
  ptx::griddep_launch_dependents();  // the intervals kernel may take the idle SMs now (launch.cuh)

  // The rank sort. Items are warp-striped (item i of lane l of warp w at position
  // w * 32 * kItems + 32 * i + l), the order in which the match-based rank is stable.
  uint32_t key[kItems];
  int32_t idx[kItems];
  constexpr int kPasses = 32 / kDigitBits;
  const int first_pass = score_decided_low_bits(in.score_dtype) / kDigitBits;
  for (int pass = first_pass; pass < kPasses; ++pass) {
    const int cur = (pass - first_pass) & 1, next = cur ^ 1;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = warp * 32 * kItems + 32 * i + lane;
      if (pass == first_pass) {
        idx[i] = first + p;  // past the segment: ~0u, ranked after every real key
        key[i] = p < mine ? ~score_bits(in, row / in.Hk, row % in.Hk, idx[i]) : ~0u;
      } else {
        const uint2 kv = p < mine ? sm.kv[cur][p] : make_uint2(~0u, 0);
        key[i] = kv.x, idx[i] = int32_t(kv.y);
      }
    }
    int rank[kItems], digit_start[Rank::BINS_TRACKED_PER_THREAD];
    Rank(sm.rank).RankKeys(key, rank, DigitOf{pass * kDigitBits}, digit_start);
    if (tid < kDigits) sm.digit_base[tid] = digit_start[0];  // this CTA's start of each digit
    __syncthreads();
    if (tid < kDigits)  // the padding past the segment has the top digit: counted out there
      sm.digit_count[tid] = (tid + 1 < kDigits ? sm.digit_base[tid + 1] : mine) - digit_start[0];
    cluster.sync();  // every CTA's digit counts are ready
    int32_t total = 0, before = 0;
    if (tid < kDigits) {
      int32_t k[kClusterMaxCtas];
#pragma unroll
      for (int r = 0; r < kClusterMaxCtas; ++r) k[r] = r < C ? cluster.map_shared_rank(sm.digit_count, r)[tid] : 0;
#pragma unroll
      for (int r = 0; r < kClusterMaxCtas; ++r) total += k[r], before += r < c ? k[r] : 0;
    }
    const int32_t start = digit_exclusive_scan(tid < kDigits ? total : 0, sm.digit_scan);
    if (tid < kDigits) sm.digit_base[tid] = start + before - digit_start[0];
    const bool last_pass = pass + 1 == kPasses;
    if (last_pass && causal && tid < C) sm.sent_here[tid] = 0;
    __syncthreads();
    SentCounts sent;  // the last pass also counts, per destination, the first level's zeros
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = warp * 32 * kItems + 32 * i + lane;
      if (p >= mine) continue;
      const int dest = sm.digit_base[DigitOf{pass * kDigitBits}.Digit(key[i])] + rank[i];
      const int to = dest / seg, at = dest - to * seg;
      cluster.map_shared_rank(sm.kv[next], to)[at] = make_uint2(key[i], uint32_t(idx[i]));
      if (last_pass && causal) sent.add(to, ((idx[i] >> (levels - 1)) & 1) == 0);
    }
    if (last_pass && causal) {
      flush_sent(sent, sm.sent_here, C);
      __syncthreads();
      if (tid < C * C) cluster.map_shared_rank(&sm.sent[0][c][0], tid / C)[tid % C] = sm.sent_here[tid % C];
    }
    cluster.sync();  // the pass's keys are in place
  }

  // Ranked: this CTA holds ranks [first, first + mine) in kv[sorted]; the other buffer is free
  // and stages each level's partition.
  const int sorted = (kPasses - first_pass) & 1;
  const uint2* ranked = sm.kv[sorted];
  int32_t* stage = reinterpret_cast<int32_t*>(sm.kv[sorted ^ 1]);  // mine + 9 ints at most
  for (int p = tid; p < mine; p += kThreads) {
    const uint2 kv = ranked[p];
    idx_out[row0 + first + p] = int32_t(kv.y);
    keys_out[row0 + first + p] = rank_key(in, row, ~kv.x, int(kv.y));
    if (causal) sm.seq[0][p] = int32_t(kv.y);
  }
  if (!causal) return;  // no peer touches this CTA's memory after the last barrier
  __syncthreads();

  // The wavelet levels. Level l reads the sequence from seq[l & 1]; its zeros and its ones are
  // staged in order here, then copied as two runs into the peers' other buffer. Positions are
  // striped (item i of thread t at i * kThreads + t).
  for (int l = 0; l < levels; ++l) {
    const int bit = levels - 1 - l, par = l & 1;
    const bool last = l + 1 == levels;
    const int32_t zeros = zeros_of_bit(Sk, bit);
    const int32_t* src = sm.seq[par];
    int32_t v[kItems];
    uint32_t zero_items = 0, below[kItems / 4] = {};  // zeros of lower lanes per item, a byte each
    int32_t own = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = i * kThreads + tid;
      v[i] = p < mine ? src[p] : 0;
      const bool zero = p < mine && ((v[i] >> bit) & 1) == 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, zero);
      zero_items |= uint32_t(zero) << i;
      if (lane == i) own = __popc(ballot);
      below[i / 4] |= uint32_t(__popc(ballot & ((1u << lane) - 1))) << (8 * (i % 4));
    }
    if (lane < kItems) sm.counts[lane * kWarps + warp] = own;
    if (tid < C) sm.sent_here[tid] = 0;
    __syncthreads();
    if (warp == 0) {
      // The zeros in the segments before this one, from the table the peers sent.
      int32_t zb = 0;
#pragma unroll
      for (int e = lane; e < kClusterMaxCtas * kClusterMaxCtas; e += 32)
        if (e < C * C && e % C < c) zb += sm.sent[par][e / C][e % C];
      zb = __reduce_add_sync(0xffffffffu, zb);
      // (item, warp) counts in position order.
      constexpr int kPer = kItems * kWarps / 32;
      int32_t k[kPer], sum = 0;
#pragma unroll
      for (int e = 0; e < kPer; ++e) k[e] = sm.counts[lane * kPer + e], sum += k[e];
      const int32_t inclusive = warp_inclusive_sum(sum);
      int32_t run = inclusive - sum;
#pragma unroll
      for (int e = 0; e < kPer; ++e) sm.counts[lane * kPer + e] = run, run += k[e];
      if (lane == 31) sm.zeros_before = zb, sm.zeros_here = inclusive;
    }
    __syncthreads();
    const int32_t zb_seg = sm.zeros_before, z_here = sm.zeros_here;
    const int ones_at = zeros + first - zb_seg;  // row position of this segment's first one
    const int s0 = zb_seg & 3, s1 = ((s0 + z_here + 3) & ~3) + (ones_at & 3);
    int32_t* r = rank0 + int64_t(l) * (n + 1) + row0;
    const int32_t offset = int32_t(row) * zeros;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = i * kThreads + tid;
      if (p >= mine) continue;
      const int32_t lz = sm.counts[i * kWarps + warp] + int32_t((below[i / 4] >> (8 * (i % 4))) & 0xff);
      r[first + p] = offset + zb_seg + lz;
      if (!last) stage[(zero_items >> i) & 1 ? s0 + lz : s1 + (p - lz)] = v[i];
    }
    if (row == int(gridDim.y) - 1 && c == C - 1 && tid == 0) r[Sk] = int32_t(gridDim.y) * zeros;  // the scan's entry n
    if (last) break;
    __syncthreads();
    SentCounts sent;
    copy_run<kThreads>(cluster, stage, s0, zb_seg, z_here, sm.seq[par ^ 1], seg, bit - 1, sent);
    copy_run<kThreads>(cluster, stage, s1, ones_at, mine - z_here, sm.seq[par ^ 1], seg, bit - 1, sent);
    flush_sent(sent, sm.sent_here, C);
    __syncthreads();
    if (tid < C * C) cluster.map_shared_rank(&sm.sent[par ^ 1][c][0], tid / C)[tid % C] = sm.sent_here[tid % C];
    cluster.sync();  // the next level's sequence and counts are in place
  }
#else
  __trap();  // launched only where the device runs sm_90 code (select_topw.cu checks)
#endif
}

}  // namespace fdma::cuda
