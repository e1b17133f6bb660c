// Causal interval ends by a walk down the rank order, the alternative to the wavelet matrix
// (select_topw.cuh) for rows of up to kWalkMaxKeys keys (select_topw.cu).
//
// Once a row is ranked, key t of the rank order (index j_t) is kept up to x_t, the w-th
// smallest index among the keys ranked above it. x_t only falls as t grows, and one step is
// cheap: with S the indices of the first t ranked keys and x_t the w-th smallest of them,
//   j_t > x_t:  x_{t+1} = x_t,
//   j_t < x_t:  x_{t+1} = max(j_t, largest index of S below x_t)   (j_t itself if w = 1),
// so a bitmap of S carries the walk, and a warp takes 32 positions a step (walk_step). For
// random scores a key falls below x ("a hit") with probability about w / t: most steps are one
// ballot.
//
// The row's rank order is cut into pieces, a CTA each. A piece's CTA needs the bitmap of every
// key ranked before it: it copies the prefix bitmap of the whole spans before it (spans of many
// pieces, built by two small kernels: each span's bits, then an OR over the spans) and adds the
// keys of its own span before it with shared-memory atomics. Then it finds the w-th smallest
// index of that set (popcounts and a block scan), and one warp walks the piece. The result is
// bitwise the wavelet's; the cost is O(Sk / 32) a piece instead of O(log Sk) dependent levels.
#pragma once

#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "cuda/primitives/ptx.cuh"
#include "cuda/select/rank_key.cuh"
#include "cuda/select/walk_pieces.cuh"

namespace fdma::cuda {

constexpr int kWalkThreads = 256;
constexpr int kWalkMaxSpans = 16;
static_assert(kWalkNarrowPiece <= kWalkThreads, "a piece's keys: a thread each");

// Span k's bits (keys ranked span * k .. span * (k + 1) - 1) of each row, for k < spans - 1.
// With counts, it zeroes them for the walk (a row's by its first span's CTA).
__global__ void __launch_bounds__(kWalkThreads)
    walk_span_bits_kernel(int Sk, WalkShape sh, const int32_t* idx_out, uint32_t* prefix, KeptCounts counts) {
  extern __shared__ uint32_t bits[];
  ptx::griddep_wait();  // the ranks
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x, k = blockIdx.y;
  if (counts.counts && k == 0) {
    for (int i = threadIdx.x; i < counts.blocks; i += kWalkThreads) counts.counts[int64_t(row) * counts.blocks + i] = 0;
    if (row == 0 && threadIdx.x == 0 && counts.flag) *counts.flag = 0;
  }
  for (int i = threadIdx.x; i < sh.words; i += kWalkThreads) bits[i] = 0;
  __syncthreads();
  const int32_t* idx = idx_out + int64_t(row) * Sk;
  for (int t = k * sh.span + threadIdx.x; t < (k + 1) * sh.span; t += kWalkThreads) {
    const int j = idx[t];
    atomicOr(&bits[j >> 5], 1u << (j & 31));
  }
  __syncthreads();
  uint32_t* out = prefix + (int64_t(row) * (sh.spans - 1) + k) * sh.words;
  for (int i = threadIdx.x; i < sh.words; i += kWalkThreads) out[i] = bits[i];
}

// The spans' bits ORed over k in place: word i of slot k becomes the OR of slots 0..k.
__global__ void __launch_bounds__(kWalkThreads) walk_prefix_or_kernel(WalkShape sh, uint32_t* prefix) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x, i = blockIdx.y * kWalkThreads + threadIdx.x;
  if (i >= sh.words) return;
  uint32_t* p = prefix + int64_t(row) * (sh.spans - 1) * sh.words + i;
  uint32_t v[kWalkMaxSpans - 1];  // every load issued before the first store
#pragma unroll
  for (int k = 0; k < kWalkMaxSpans - 1; ++k) v[k] = k < sh.spans - 1 ? p[int64_t(k) * sh.words] : 0u;
#pragma unroll
  for (int k = 1; k < kWalkMaxSpans - 1; ++k) v[k] |= v[k - 1];
#pragma unroll
  for (int k = 0; k < kWalkMaxSpans - 1; ++k)
    if (k < sh.spans - 1) p[int64_t(k) * sh.words] = v[k];
}

// Lane k of the warp gets the k-th largest index (0-based) below x in `bits`, for k < n (-1 for
// the other lanes); `bits` holds at least n indices below x. A round reads 32 words downward
// from x's, one a lane; a prefix sum of their popcounts tells each lane which word holds its
// index, and it strips that word's higher bits.
__device__ __forceinline__ int walk_largest_below(const uint32_t* bits, int x, int n, int lane) {
  int mine = -1;
  const int top = x >> 5;
  for (int got = 0, r = 0; got < n; ++r) {
    const int wi = top - (r * 32 + lane);
    uint32_t word = wi >= 0 ? bits[wi] : 0u;
    if (wi == top) word &= (1u << (x & 31)) - 1u;
    const int c = __popc(word);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31), e = lane - got;
    int at = 0;  // the first lane whose inclusive count exceeds e
#pragma unroll
    for (int step = 16; step > 0; step >>= 1)
      if (__shfl_sync(0xffffffffu, incl, at + step - 1) <= e) at += step;
    const uint32_t w_at = __shfl_sync(0xffffffffu, word, at);
    const int skip = e - (__shfl_sync(0xffffffffu, incl, at) - __shfl_sync(0xffffffffu, c, at));
    if (e >= 0 && e < total && lane < n) {
      uint32_t m = w_at;
      for (int q = 0; q < skip; ++q) m &= ~(0x80000000u >> __clz(m));  // drop the higher bits
      mine = (top - (r * 32 + at)) * 32 + 31 - __clz(m);
    }
    got += total;
    if (top - (r * 32 + 31) <= 0) break;  // word 0 read: nothing lies lower
  }
  return mine;
}

// One warp's step over 32 consecutive rank positions (lane l: key index j, INT_MAX past the
// piece) with x the w-th smallest index ranked before them, `bits` holding at least every such
// index below x. Returns lane l's own end (x before its key joins) and advances x past the 32.
// Lane l's answer is the w-th smallest of the set and the keys of lanes < l: if m of those
// keys lie below x ("hits"), the m-th largest of (the set below x) and those m keys. So each
// lane's answer, and the next x, are among the set's nh largest indices below x (nh: the
// step's hits) and the hits themselves; each of these candidates is ranked against the others
// with one ballot, for every lane at once. Independent of how many hits a step has (keys in
// rising score order hit every time), unlike taking the hits one by one.
__device__ __forceinline__ int walk_step(uint32_t* bits, int& x, int j, int64_t w, int lane) {
  const bool hit = j < x;
  const uint32_t hits = __ballot_sync(0xffffffffu, hit);
  if (hits == 0) return x;
  const uint32_t before = (1u << lane) - 1u;
  const int nh = __popc(hits), m = __popc(hits & before);
  const int nd = int(w - 1 < nh ? w - 1 : nh);  // the set has exactly w - 1 indices below x
  const int d = walk_largest_below(bits, x, nd, lane);  // lane k: the k-th largest
  int mine = x, next = x;
  for (int k = 0; k < nd; ++k) {  // candidate d_k: k candidates of the set lie above it
    const int v = __shfl_sync(0xffffffffu, d, k);
    const uint32_t above = __ballot_sync(0xffffffffu, hit && j > v);
    if (m > 0 && k + __popc(above & before) == m - 1) mine = v;
    if (k + __popc(above) == nh - 1) next = v;
  }
  for (uint32_t rest = hits; rest; rest &= rest - 1) {  // candidate: the hit of lane f
    const int f = __ffs(int(rest)) - 1, v = __shfl_sync(0xffffffffu, j, f);
    const int set_above = __popc(__ballot_sync(0xffffffffu, lane < nd && d > v));
    const uint32_t above = __ballot_sync(0xffffffffu, hit && j > v);
    if (lane > f && set_above + __popc(above & before) == m - 1) mine = v;
    if (set_above + __popc(above) == nh - 1) next = v;
  }
  if (hit) atomicOr(&bits[j >> 5], 1u << (j & 31));  // below x: later steps may need them
  __syncwarp();
  x = next;
  return mine;
}

// Piece blockIdx.y of row blockIdx.x (walk_piece): every key's interval, as causal_intervals_kernel writes it,
// and, with counts (zeroed by the span kernel), the kept ones added to their blocks' counts.
__global__ void __launch_bounds__(kWalkThreads)
    walk_intervals_kernel(TopwInputs in, WalkShape sh, const uint64_t* keys, const int32_t* idx_out,
                          const uint32_t* prefix, int64_t w, int Sq, int32_t* begin, int64_t b0, int64_t b1, int64_t b2,
                          int32_t* end, int64_t e0, int64_t e1, int64_t e2, KeptCounts counts) {
  extern __shared__ uint32_t bits[];
  using Scan = cub::BlockScan<int, kWalkThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int x_first;
  ptx::griddep_wait();  // the ranks and the prefix bitmaps
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x, hk = row % in.Hk, b = row / in.Hk, Sk = in.Sk;
  const WalkPiece my_piece = walk_piece(sh, Sk, int(blockIdx.y));
  const int t0 = my_piece.first, t_end = my_piece.last;
  const int walk0 = int(w < t0 ? t0 : w < t_end ? w : t_end);  // positions before it are kept to the end
  const int64_t base = int64_t(row) * Sk;
  const IntervalRow r = interval_row(in, b, Sq);  // a packed sequence's own Sq and offset
  // x < 0: kept to the end.
  auto write = [&](int j, bool exists, int x) {
    const int64_t at_b = interval_at(in, r, b, hk, j, b0, b1, b2), at_e = interval_at(in, r, b, hk, j, e0, e1, e2);
    if (at_b < 0) return;  // past a packed sequence's keys
    const KeyInterval kept = causal_interval(r, j, exists, x);
    begin[at_b] = kept.begin;
    end[at_e] = kept.end;
    if (counts.counts && kept.end > kept.begin)
      atomicAdd(&counts.counts[int64_t(row) * counts.blocks + (j >> counts.block_log2)], 1);
  };
  for (int t = t0 + threadIdx.x; t < walk0; t += kWalkThreads)
    write(idx_out[base + t], rank_key_exists(keys[base + t], in), -1);
  if (walk0 == t_end) return;  // the same for the whole CTA

  // Every global read the walk needs, at once (the kernel is a chain of latencies): the piece's
  // keys, a thread each (piece <= kWalkThreads), and the bitmap of the first walk0 ranked keys,
  // from the prefix of the whole spans before and the keys of this span before walk0, ORed in
  // by shared-memory atomics in batches of loads.
  __shared__ int32_t piece_index[kWalkThreads];
  __shared__ bool piece_exists[kWalkThreads];
  const int tp = walk0 + threadIdx.x;
  int my_index = 0;
  bool my_exists = false;
  if (tp < t_end) my_index = idx_out[base + tp], my_exists = rank_key_exists(keys[base + tp], in);
  for (int i = threadIdx.x; i < sh.words; i += kWalkThreads) bits[i] = 0u;
  __syncthreads();
  const int k = walk0 / sh.span;
  const uint32_t* pre = prefix + (int64_t(row) * (sh.spans - 1) + k - 1) * sh.words;
  const int32_t* span_index = idx_out + base + int64_t(k) * sh.span;
  const int n_words = k > 0 ? sh.words : 0, n_items = n_words + walk0 - k * sh.span;
  constexpr int kBatch = 8;
  for (int i0 = threadIdx.x; i0 < n_items; i0 += kBatch * kWalkThreads) {
    uint32_t v[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int i = i0 + q * kWalkThreads;
      v[q] = i < n_words ? pre[i] : i < n_items ? uint32_t(span_index[i - n_words]) : 0u;
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int i = i0 + q * kWalkThreads;
      if (i < n_words) {
        if (v[q]) atomicOr(&bits[i], v[q]);
      } else if (i < n_items) {
        atomicOr(&bits[v[q] >> 5], 1u << (v[q] & 31));
      }
    }
  }
  if (tp < t_end) piece_index[threadIdx.x] = my_index, piece_exists[threadIdx.x] = my_exists;
  __syncthreads();

  // x_walk0: the w-th smallest index among them (walk0 >= w of them). Each thread counts a run
  // of words; the thread whose run holds it finds the bit.
  const int per = (sh.words + kWalkThreads - 1) / kWalkThreads;
  const int i0 = min(sh.words, int(threadIdx.x) * per), i1 = min(sh.words, i0 + per);
  int count = 0;
  for (int i = i0; i < i1; ++i) count += __popc(bits[i]);
  int before = 0;
  Scan(scan).ExclusiveSum(count, before);
  const int kth = int(w - 1);
  if (before <= kth && kth < before + count) {
    int need = kth - before, i = i0;
    for (; need >= __popc(bits[i]); ++i) need -= __popc(bits[i]);
    uint32_t m = bits[i];
    for (; need > 0; --need) m &= m - 1;  // drop the lower set bits
    x_first = i * 32 + __ffs(int(m)) - 1;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;

  // One warp walks the piece, 32 keys a step.
  const int lane = threadIdx.x;
  int x = x_first;
  for (int c = 0; c < t_end - walk0; c += 32) {  // the same trip count in every lane
    const int q = c + lane;
    const bool in_piece = walk0 + q < t_end;
    const int j = in_piece ? piece_index[q] : INT_MAX;
    const int mine = walk_step(bits, x, j, w, lane);
    if (in_piece) write(j, piece_exists[q], mine);
  }
}

}  // namespace fdma::cuda
