// Cached scores as the decode selection ranks them: one unsigned integer per key whose order
// is the scores' order (NaN lowest, -0.0 as +0.0, 0 for an absent key), read a chunk at a time.
// Shared by the radix selection (decode_select.cu) and the kept-set update (select_state.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/decode/cache_view.cuh"

namespace fdma::cuda {

// A 16-bit float's order bits in the high half, the low half all ones: every key of a bucket
// settled on the high 16 bits is then equal, so two radix passes finish 16-bit scores (the
// threshold's low digits are all ones too). Taken from the 16-bit pattern: as a float, a
// half's mantissa reaches down to bit 13, below the high half. inf_bits: the format's
// +infinity (0x7c00 half, 0x7f80 bfloat16); above it, magnitudes are NaN.
__device__ __forceinline__ uint32_t order_bits16(uint16_t h, uint16_t inf_bits) {
  const uint16_t mag = h & 0x7fffu;
  uint32_t o;
  if (mag > inf_bits) o = 0u;              // NaN: below every number
  else if (mag == 0) o = 0x8000u;          // -0.0 as +0.0
  else if (h & 0x8000u) o = uint16_t(~h);  // negative: larger magnitude ranks lower
  else o = h | 0x8000u;
  return (o << 16) | 0xffffu;
}

template <class S>
__device__ __forceinline__ uint32_t order_bits_of(S s) {
  if constexpr (sizeof(S) == 4) return score_order_bits(s);
  else if constexpr (std::is_same_v<S, __half>) return order_bits16(__half_as_ushort(s), 0x7c00u);
  else return order_bits16(__bfloat16_as_ushort(s), 0x7f80u);
}

// The same from a score held as a float (exact for the 16-bit dtypes, which it came from).
__device__ __forceinline__ uint32_t order_bits(const CacheView& c, float score) {
  switch (c.score_dtype) {
    case 2: return order_bits_of(__float2half_rn(score));
    case 3: return order_bits_of(__float2bfloat16_rn(score));
    default: return score_order_bits(score);
  }
}

// A cached key's score, order bits (0: absent) and where it lives.
struct KeyRead {
  uint32_t bits;
  int outer;
  float score;
};
__device__ __forceinline__ KeyRead read_key(const CacheView& c, int b, int hk, int pos) {
  KeyRead k{0u, 0, 0.f};
  int inner;
  if (!locate(c, b, pos, k.outer, inner)) return k;
  k.score = load_cached_score(c, k.outer, inner, hk);
  k.bits = order_bits(c, k.score);
  return k;
}

// Keys [j0, j1) of row (b, hk), thread t taking keys j0 + i * kThreads + t: every load is
// issued before any is used (one at a time, a CTA waited out its memory latencies in turn).
// The score dtype and the cache layout are fixed at compile time: the row's base pointer is
// computed once, and each key costs a load and a few integer operations (a per-key dtype
// switch and stride products dominated the radix passes).
template <class S, bool kPaged, int kThreads, int N>
__device__ __forceinline__ void load_score_bits_as(const CacheView& c, int b, int hk, int j0, int j1,
                                                   uint32_t (&bits)[N]) {
  const S* row = static_cast<const S*>(c.scores) + (kPaged ? 0 : b * c.score_stride[0]) + hk * c.score_stride[2];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int j = j0 + i * kThreads + int(threadIdx.x);
    bits[i] = 0u;
    if (j < j1) {
      int64_t off;
      if constexpr (kPaged) {
        const int page_index = c.page_size.div(j);
        const int page = c.block_table[b * c.table_stride[0] + page_index * c.table_stride[1]];
        if (page < 0 || page >= c.num_pages) continue;
        off = page * c.score_stride[0] + (j - page_index * c.page_size.divisor) * c.score_stride[1];
      } else {
        off = int64_t(j) * c.score_stride[1];
      }
      bits[i] = order_bits_of(row[off]);
    }
  }
}

template <int kThreads, int N>
__device__ __forceinline__ void load_score_bits(const CacheView& c, int b, int hk, int j0, int j1,
                                                uint32_t (&bits)[N]) {
  const bool paged = c.block_table != nullptr;
  switch (c.score_dtype) {
    case 2:
      paged ? load_score_bits_as<__half, true, kThreads>(c, b, hk, j0, j1, bits)
            : load_score_bits_as<__half, false, kThreads>(c, b, hk, j0, j1, bits);
      break;
    case 3:
      paged ? load_score_bits_as<__nv_bfloat16, true, kThreads>(c, b, hk, j0, j1, bits)
            : load_score_bits_as<__nv_bfloat16, false, kThreads>(c, b, hk, j0, j1, bits);
      break;
    default:
      paged ? load_score_bits_as<float, true, kThreads>(c, b, hk, j0, j1, bits)
            : load_score_bits_as<float, false, kThreads>(c, b, hk, j0, j1, bits);
  }
}

// The radix selection's digits over order bits: 11, 11 and 10 bits from the top.
template <int kPass>
struct Digit {
  static constexpr int kShift = kPass == 0 ? 21 : kPass == 1 ? 10 : 0;
  static constexpr int kWidth = kPass == 2 ? 10 : 11;
  static constexpr int kBins = 1 << kWidth;
  // Whether bits lie in the bucket the earlier passes chose.
  __device__ static bool in_bucket(uint32_t bits, uint32_t prefix) {
    if constexpr (kPass == 0) return true;
    else return (bits >> (kShift + kWidth)) == (prefix >> (kShift + kWidth));
  }
  __device__ static uint32_t of(uint32_t bits) { return (bits >> kShift) & (kBins - 1); }
};

// The digit holding the need-th key from the top of a pass's histogram (kBins = kThreads x 2,
// 4 or 8), by a CTA of kThreads: part is kThreads words of shared memory. One lane of warp 0
// adds the digit to t.prefix and leaves in t.need the keys still to keep inside its bin (and,
// on the final pass, the bin's count in t.count_eq); on pass 0, at most `need` keys in all
// sets t.keep_all instead. No barrier after: callers sync as they need.
template <int kPass, int kThreads>
__device__ void resolve_digit(const uint32_t* hist, uint32_t* part, uint32_t need, bool final_pass,
                              RadixThreshold& t) {
  using Dg = Digit<kPass>;
  constexpr int kPer = Dg::kBins / kThreads;  // bins a thread sums
  constexpr int kParts = kThreads / 32;       // parts a lane sums
  const int tid = threadIdx.x;
  uint32_t s = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) s += hist[tid * kPer + k];
  part[tid] = s;
  __syncthreads();
  if (tid >= 32) return;
  const int lane = tid;
  uint32_t group = 0;
#pragma unroll
  for (int k = 0; k < kParts; ++k) group += part[lane * kParts + k];
  uint32_t incl = group;  // keys in this lane's bins and above
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t v = __shfl_down_sync(0xffffffffu, incl, off);
    if (lane + off < 32) incl += v;
  }
  const uint32_t total = __shfl_sync(0xffffffffu, incl, 0);
  if (kPass == 0 && total <= need) {  // at most w candidates: keep them all
    if (lane == 0) t.keep_all = 1;
    return;
  }
  uint32_t above = incl - group;
  if (above < need && need <= incl) {  // exactly one lane
    int p = lane * kParts + kParts - 1;
    while (above + part[p] < need) above += part[p--];
    int bin = p * kPer + kPer - 1;
    while (above + hist[bin] < need) above += hist[bin--];
    t.prefix |= uint32_t(bin) << Dg::kShift;
    if (final_pass && kPass == 1) t.prefix |= 0x3ffu;  // 16-bit scores: order_bits16's low ones
    t.need = int(need - above);
    if (final_pass) t.count_eq = int(hist[bin]);
  }
}

}  // namespace fdma::cuda
