// The selection one CTA per (batch, KV head) row: the wavelet matrix of the causal selection
// (select_topw.cuh) built level after level inside the CTA, and for short rows the rank sort
// too. The device-wide path launches a flags kernel, a scan (two launches) and a partition
// per level: at 16K keys about 40 launches of a few microseconds each, and its sort another
// eight. Here a row costs one launch.
#pragma once

#include <cub/block/block_radix_sort.cuh>

#include <cstddef>
#include <cstdint>

#include "cuda/select/rank_key.cuh"
#include "cuda/primitives/warp_scan.cuh"

namespace fdma::cuda {

// Zeros of bit `bit` among 0 .. Sk-1. Each row of ranked indices is a permutation of them,
// so every level's zero count is the same for all rows and known without counting. The
// device-wide scan's value at a row's start is then row * zeros at every level.
__host__ __device__ inline int32_t zeros_of_bit(int Sk, int bit) {
  const int64_t half = int64_t(1) << bit, period = half * 2;
  const int64_t rest = Sk % period;
  return int32_t(Sk / period * half + (rest < half ? rest : half));
}

constexpr int kRowThreads = 1024, kRowItems = 16, kRowChunk = kRowThreads * kRowItems;
constexpr int kRowWarps = kRowThreads / 32;
// Zero counts per (warp, item), a row of kRowCountStride per warp: 16-byte aligned rows for
// the threads' vector reads, and the scanning warp's lane pairs 2-way on a bank at most.
constexpr int kRowCountStride = 20;
constexpr int kRowCountSlots = kRowWarps * kRowCountStride + 1;  // the chunk's total last
constexpr size_t kRowCountBytes = (kRowCountSlots * 4 + 15) / 16 * 16;

// One chunk of kRowChunk positions of wavelet_level; kFull: the chunk lies inside the row, so
// no position needs a bound check.
template <bool kFull, class T>
__device__ __forceinline__ void wavelet_chunk(const T* src, T* dst, int Sk, int bit, bool last, int32_t offset,
                                              int32_t* r, int32_t* counts, int base, int32_t zeros, int32_t& carry) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t lanes_below = (1u << lane) - 1;
  const T* s = src + base + tid;
  uint32_t v[kRowItems];
#pragma unroll
  for (int i = 0; i < kRowItems; ++i)  // every load before the first ballot: one round trip
    v[i] = kFull || base + i * kRowThreads + tid < Sk ? uint32_t(s[i * kRowThreads]) : 0u;
  uint32_t below[kRowItems / 4] = {};  // zeros of lower lanes per item, a byte each
  uint32_t zero_items = 0;
  int32_t own_count = 0;  // lane i keeps item i's warp count: one store per lane below
#pragma unroll
  for (int i = 0; i < kRowItems; ++i) {
    const bool zero = (kFull || base + i * kRowThreads + tid < Sk) && ((v[i] >> bit) & 1) == 0;
    const uint32_t ballot = __ballot_sync(0xffffffffu, zero);
    below[i / 4] |= uint32_t(__popc(ballot & lanes_below)) << (8 * (i % 4));
    zero_items |= uint32_t(zero) << i;
    if (lane == i) own_count = __popc(ballot);
  }
  if (lane < kRowItems) counts[warp * kRowCountStride + lane] = own_count;
  __syncthreads();
  if (warp == 0) {  // position order is item-major: lane L scans item L / 2, warps 16 (L % 2) + k
    constexpr int kPerLane = kRowItems * kRowWarps / 32;
    static_assert(kPerLane * 2 == kRowWarps, "a lane pair covers one item's warps");
    const int item = lane / 2, warp0 = (lane % 2) * kPerLane;
    int32_t c[kPerLane], sum = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) c[k] = counts[(warp0 + k) * kRowCountStride + item], sum += c[k];
    const int32_t inclusive = warp_inclusive_sum(sum);
    int32_t run = inclusive - sum;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) counts[(warp0 + k) * kRowCountStride + item] = run, run += c[k];
    if (lane == 31) counts[kRowWarps * kRowCountStride] = inclusive;
  }
  __syncthreads();
  int32_t* rp = r + base + tid;
  const int4* before = reinterpret_cast<const int4*>(counts + warp * kRowCountStride);
#pragma unroll
  for (int q = 0; q < kRowItems / 4; ++q) {
    const int4 b4 = before[q];  // the same address for the whole warp: a broadcast
    const int32_t warp_before[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = q * 4 + e, p = base + i * kRowThreads + tid;
      if (!kFull && p >= Sk) continue;
      const int32_t zb = carry + warp_before[e] + int32_t((below[q] >> (8 * e)) & 0xff);
      rp[i * kRowThreads] = offset + zb;
      if (!last) dst[(zero_items >> i) & 1 ? zb : zeros + (p - zb)] = T(v[i]);
    }
  }
  carry += counts[kRowWarps * kRowCountStride];
  __syncthreads();  // the counts are rewritten by the next chunk; dst is read by the next level
}

// One level of one row's wavelet matrix by the whole CTA: r[p] = offset + zeros (bit clear)
// before position p, and unless `last`, the row stably partitioned by the bit from src into
// dst. Positions are striped over each chunk (item i of thread t is base + i * kRowThreads +
// t), so a warp's zeros, and its ones, land contiguous in dst and global accesses coalesce;
// ballots count each warp's zeros per item and one warp scans the counts in position order.
// (Runs of 16 consecutive positions per thread cut the instructions by a third but scattered
// the partition's stores: twice the time, docs/performance.md, "selection".) Ends on a barrier.
template <class T>
__device__ void wavelet_level(const T* src, T* dst, int Sk, int bit, bool last, int32_t offset, int32_t* r,
                              int32_t* counts) {
  const int32_t zeros = zeros_of_bit(Sk, bit);
  int32_t carry = 0;  // zeros before the chunk
  for (int base = 0; base < Sk; base += kRowChunk) {
    if (base + kRowChunk <= Sk)
      wavelet_chunk<true>(src, dst, Sk, bit, last, offset, r, counts, base, zeros, carry);
    else
      wavelet_chunk<false>(src, dst, Sk, bit, last, offset, r, counts, base, zeros, carry);
  }
}

// All levels of each row's wavelet matrix, a CTA per row, through global buffers a and b
// (any row length). rank0 as the device-wide path writes it: [levels][n + 1].
__global__ void __launch_bounds__(kRowThreads)
    wavelet_rows_kernel(const int32_t* ranked, int rows, int Sk, int levels, int32_t* rank0, int32_t* buf_a,
                        int32_t* buf_b) {
  __shared__ __align__(16) int32_t counts[kRowCountSlots];
  const int row = blockIdx.x;
  const int64_t n = int64_t(rows) * Sk, row0 = int64_t(row) * Sk;
  const int32_t* src = ranked + row0;
  for (int l = 0; l < levels; ++l) {
    const int bit = levels - 1 - l;
    const int32_t zeros = zeros_of_bit(Sk, bit);
    int32_t* r = rank0 + int64_t(l) * (n + 1) + row0;
    int32_t* dst = (l % 2 == 0 ? buf_a : buf_b) + row0;
    wavelet_level(src, dst, Sk, bit, l + 1 == levels, int32_t(row) * zeros, r, counts);
    if (row == rows - 1 && threadIdx.x == 0) r[Sk] = int32_t(rows) * zeros;  // the scan's entry n
    src = dst;
  }
}

// Rows up to this many keys keep their wavelet sequence in shared memory (two uint16 buffers).
constexpr int kSharedRowMaxKeys = 32768;

// Dynamic shared memory of select_row_kernel<kSortItems>: the counts, then the sequence
// buffers, which alias the sort's storage once the sort is done.
template <int kSortItems>
constexpr size_t select_row_smem() {
  constexpr size_t seq = size_t(2) * (kSortItems ? kRowThreads * kSortItems : kSharedRowMaxKeys) * 2;
  if constexpr (kSortItems > 0) {
    using Sort = cub::BlockRadixSort<uint32_t, kRowThreads, kSortItems, uint16_t>;
    constexpr size_t sort = sizeof(typename Sort::TempStorage);
    return kRowCountBytes + (sort > seq ? sort : seq);
  } else {
    return kRowCountBytes + seq;
  }
}

// One row per CTA. kSortItems > 0: ranks the row here (Sk <= kRowThreads * kSortItems) and
// writes keys_out/idx_out as the device-wide sort would, on the score bits above kSkipBits
// (score_decided_low_bits of the scores' dtype: a constant, as a run-time one made cub's sort
// spill more); 0: the row comes ranked in idx_out. Then, given rank0 (causal), builds the
// row's wavelet matrix with the sequence in shared memory.
template <int kSortItems, int kSkipBits = 0>
__global__ void __launch_bounds__(kRowThreads)
    select_row_kernel(TopwInputs in, int levels, uint64_t* keys_out, int32_t* idx_out, int32_t* rank0) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kCap = kSortItems ? kRowThreads * kSortItems : kSharedRowMaxKeys;
  auto* counts = reinterpret_cast<int32_t*>(smem);
  auto* seq = reinterpret_cast<uint16_t*>(smem + kRowCountBytes);  // [2][kCap]
  const int row = blockIdx.x, tid = threadIdx.x, rows = in.B * in.Hk, Sk = in.Sk;
  const int64_t n = int64_t(rows) * Sk, row0 = int64_t(row) * Sk;
  if constexpr (kSortItems > 0) {
    // Ascending order of the inverted score bits, stable over index order: higher scores
    // first, ties to the lower index, padding (score bits 0) and the tail past Sk last.
    using Sort = cub::BlockRadixSort<uint32_t, kRowThreads, kSortItems, uint16_t>;
    uint32_t key[kSortItems];
    uint16_t val[kSortItems];
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const int j = tid * kSortItems + i;  // blocked: index order
      key[i] = j < Sk ? ~score_bits(in, row / in.Hk, row % in.Hk, j) : ~0u;
      val[i] = uint16_t(j);
    }
    Sort(*reinterpret_cast<typename Sort::TempStorage*>(seq))
        .SortBlockedToStriped(key, val, kSkipBits, 32);
    __syncthreads();  // the sort's storage becomes the sequence
#pragma unroll
    for (int i = 0; i < kSortItems; ++i) {
      const int p = i * kRowThreads + tid;
      if (p >= Sk) continue;
      idx_out[row0 + p] = val[i];
      keys_out[row0 + p] = rank_key(in, row, ~key[i], val[i]);
      seq[p] = val[i];
    }
  } else {
    for (int p = tid; p < Sk; p += kRowThreads) seq[p] = uint16_t(idx_out[row0 + p]);
  }
  if (rank0 == nullptr) return;  // not causal: the ranks are all it needs
  __syncthreads();
  for (int l = 0; l < levels; ++l) {
    const int bit = levels - 1 - l;
    const int32_t zeros = zeros_of_bit(Sk, bit);
    int32_t* r = rank0 + int64_t(l) * (n + 1) + row0;
    wavelet_level(seq + (l % 2) * kCap, seq + ((l + 1) % 2) * kCap, Sk, bit, l + 1 == levels, int32_t(row) * zeros,
                  r, counts);
    if (row == rows - 1 && tid == 0) r[Sk] = int32_t(rows) * zeros;
  }
}

}  // namespace fdma::cuda
