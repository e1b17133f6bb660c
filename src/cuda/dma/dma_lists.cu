// Kernels behind dma_lists.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include <cub/block/block_scan.cuh>

#include "cuda/dma/dma_lists.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/packed_batch.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/warp_scan.cuh"
#include "fdma/fdma.h"

namespace fdma::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// The kept list without a device-wide scan: each CTA of the records kernel takes
// kListBlockKeys consecutive keys of one row and counts the kept ones; each CTA of the kept-list
// kernel sums its row's earlier blocks' counts itself and places its kept keys after them. Two
// launches, each overlapping its predecessor, where cub's exclusive sum took two more that could
// not (docs/performance.md, "the kept list's scan"). A row's last block reads Sk / 1024 counts.
// Where the selection's walk has counted the blocks (DmaListInputs::counted), one launch does
// both (records_and_kept_kernel).
constexpr int kListThreads = 256, kListKeysPerThread = 4;
static_assert(kListBlockKeys == kListThreads * kListKeysPerThread, "a list block: a CTA's keys");
using ListScan = cub::BlockScan<int, kListThreads, cub::BLOCK_SCAN_WARP_SCANS>;  // 64 bytes of shared memory

__device__ float load_score(const DmaListInputs& in, int64_t off) {
  switch (in.score_dtype) {
    case FDMA_FLOAT16: return __half2float(static_cast<const __half*>(in.scores)[off]);
    case FDMA_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(in.scores)[off]);
    default: return static_cast<const float*>(in.scores)[off];
  }
}

// A key's term / scale as the folded chunk (KeyLists::bias_chunks): three bf16 whose sum is x
// to float precision (each the rounding of what the ones before leave). An infinite term stays
// whole in hi; false where x is finite but beyond 2^100 (or the scale makes it so), which the
// kernel does not fold (fold_off).
constexpr float kMostFolded = 1.2676506e30f;  // 2^100
__device__ bool fold_chunk(float term, float scale, BiasChunk& chunk) {
  const float x = term / scale;
  __nv_bfloat16 t[3];
  t[0] = __float2bfloat16_rn(x);
  const bool finite = fabsf(x) <= kMostFolded;
  const float r1 = finite ? x - __bfloat162float(t[0]) : 0.f;
  t[1] = __float2bfloat16_rn(r1);
  t[2] = __float2bfloat16_rn(r1 - __bfloat162float(t[1]));
  chunk.words[0] = uint32_t(__bfloat16_as_ushort(t[0])) | uint32_t(__bfloat16_as_ushort(t[1])) << 16;
  chunk.words[1] = uint32_t(__bfloat16_as_ushort(t[2]));
  chunk.words[2] = chunk.words[3] = 0;
  return finite || isinf(term) || isnan(term);
}

// The list kernels may be launched overlapping their predecessors (launch.cuh): each waits for
// them first thing and lets its successor in early.
// Key j of row bh = b * Hk + hk as the caller (or the selection) gave it: its interval and,
// where scores are added, its score. Loaded apart from key_record, so that a thread's keys'
// loads are all in flight at once: issued key by key, each key's loads waited behind the
// stores of the one before (the compiler cannot move a load above a store that may alias it).
struct KeyInput {
  int32_t begin, end;
  float score;
};
__device__ KeyInput key_input(const DmaListShape& s, const DmaListInputs& in, int64_t bh, int j) {
  const int hk = int(bh % s.Hk), b = int(bh / s.Hk);
  KeyInput k;
  k.begin = in.begin[b * in.begin_stride[0] + hk * in.begin_stride[1] + j * in.begin_stride[2]];
  k.end = in.end[b * in.end_stride[0] + hk * in.end_stride[1] + j * in.end_stride[2]];
  k.score = in.add_scores ? load_score(in, b * in.score_stride[0] + hk * in.score_stride[1] + j * in.score_stride[2]) : 0.f;
  return k;
}

// Key j's record (and folded term) from its input, as stored; kept where end > begin.
__device__ KeyInfo key_record(const DmaListShape& s, const DmaListInputs& in, KeyInfo* info, BiasChunk* chunks,
                           int64_t bh, int j, const KeyInput& k) {
  const int64_t e = bh * s.Sk + j;
  // Clamped to the queries that exist: a caller's intervals that are not a selection's give
  // wrong results, never a query row out of bounds in the kernels. A packed sequence's
  // intervals count from its first query: clamped to its queries, then moved there.
  int q0 = 0, nq = s.Sq;
  if (s.cu_k) {
    const int seq = sequence_of(s.cu_k, s.num_seqs, j);
    q0 = min(max(s.cu_q[seq], 0), s.Sq);
    nq = min(max(s.cu_q[seq + 1], q0), s.Sq) - q0;
  }
  const int32_t begin = min(max(k.begin, 0), nq);
  const int32_t end = min(max(k.end, begin), nq);
  const float bias = end > begin ? k.score : 0.f;
  int32_t unfolded = 0;  // KeyInfo::pad bit 0: the term does not fold (the kept-list launch reports it)
  if (chunks && end > begin) {
    BiasChunk chunk;
    unfolded = !fold_chunk(bias, in.scale, chunk);
    chunks[e] = chunk;
  }
  const KeyInfo r{q0 + begin, q0 + end, bias, unfolded};
  info[e] = r;
  return r;
}

// This lane's rank among the set lanes of a ballot below it.
__device__ __forceinline__ int lanes_below(uint32_t ballot) {
  return __popc(ballot & ((1u << (threadIdx.x % 32)) - 1u));
}

// A CTA per block of kListBlockKeys keys of a row (list_blocks_per_row blocks a row): the
// records, and the block's kept count.
__global__ void __launch_bounds__(kListThreads) key_records_kernel(DmaListShape s, DmaListInputs in, KeyInfo* info,
                                                                   int32_t* block_counts, BiasChunk* chunks,
                                                                   int32_t* fold_off) {
  __shared__ typename ListScan::TempStorage scan;
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int blocks = list_blocks_per_row(s.Sk);
  const int64_t bh = blockIdx.x / blocks;
  const int j0 = int(blockIdx.x % blocks) * kListBlockKeys;
  if (blockIdx.x == 0 && threadIdx.x == 0 && fold_off) *fold_off = 0;  // kept_list_kernel, after this one, sets it
  KeyInput k[kListKeysPerThread];
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    const int j = j0 + i * kListThreads + int(threadIdx.x);
    if (j < s.Sk) k[i] = key_input(s, in, bh, j);
  }
  int kept_here = 0;
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    const int j = j0 + i * kListThreads + int(threadIdx.x);
    if (j < s.Sk) {
      const KeyInfo r = key_record(s, in, info, chunks, bh, j, k[i]);
      kept_here += r.end > r.begin;
    }
  }
  int unused, total;
  ListScan(scan).ExclusiveSum(kept_here, unused, total);
  if (threadIdx.x == 0) block_counts[blockIdx.x] = total;
}

// The same blocks: the kept keys of the block, in index order, after those of the row's earlier
// blocks; a thread takes kListKeysPerThread consecutive keys. The row's last block writes its count.
__global__ void __launch_bounds__(kListThreads) kept_list_kernel(DmaListShape s, const KeyInfo* info,
                                                                 const int32_t* block_counts, int32_t* kept,
                                                                 int2* kept_span, int32_t* kept_count,
                                                                 int32_t* fold_off) {
  __shared__ typename ListScan::TempStorage scan;
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int blocks = list_blocks_per_row(s.Sk);
  const int64_t bh = blockIdx.x / blocks, row0 = bh * s.Sk;
  const int block = int(blockIdx.x % blocks);
  int partial = 0, unused, before;
  for (int i = threadIdx.x; i < block; i += kListThreads) partial += block_counts[bh * blocks + i];
  ListScan(scan).ExclusiveSum(partial, unused, before);  // before: the row's kept keys in earlier blocks
  __syncthreads();  // (the scan's storage, again below)
  const int j0 = block * kListBlockKeys + int(threadIdx.x) * kListKeysPerThread;
  // Whole records (begin, end, bias, pad): the pad's unfolded bit comes with the interval rather
  // than by a load after the scan.
  static_assert(sizeof(KeyInfo) == sizeof(int4), "a record is one 16-byte load");
  int4 rec[kListKeysPerThread];
  int mine = 0;
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    rec[i] = j0 + i < s.Sk ? *reinterpret_cast<const int4*>(&info[row0 + j0 + i]) : make_int4(0, 0, 0, 0);
    mine += rec[i].y > rec[i].x;
  }
  int at, total;
  ListScan(scan).ExclusiveSum(mine, at, total);
  at += before;
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    if (rec[i].y <= rec[i].x) continue;
    kept[row0 + at] = j0 + i;
    if (kept_span) kept_span[row0 + at] = make_int2(rec[i].x, rec[i].y);
    if (fold_off && (rec[i].w & 1)) atomicOr(fold_off, 1);
    ++at;
  }
  if (block == blocks - 1 && threadIdx.x == 0) kept_count[bh] = before + total;
}

// The records kernel and the kept-list kernel in one, for blocks whose kept keys the selection
// has counted (and fold_off zeroed): a block's kept keys go after the counts of the row's
// earlier blocks. Keys are striped (item i of thread t: key i * kListThreads + t of the block),
// as in the records kernel; in index order, item i's keys follow those of items below it, and
// within an item the warps' and lanes' in order (a ballot a warp, totals in shared memory).
__global__ void __launch_bounds__(kListThreads)
    records_and_kept_kernel(DmaListShape s, DmaListInputs in, KeyInfo* info, BiasChunk* chunks,
                            const int32_t* block_counts, int32_t* kept, int2* kept_span, int32_t* kept_count,
                            int32_t* fold_off) {
  constexpr int kWarps = kListThreads / 32;
  __shared__ typename ListScan::TempStorage scan;
  __shared__ int warp_kept[kListKeysPerThread][kWarps];
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int blocks = list_blocks_per_row(s.Sk);
  const int64_t bh = blockIdx.x / blocks, row0 = bh * s.Sk;
  const int block = int(blockIdx.x % blocks), j0 = block * kListBlockKeys;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  KeyInput k[kListKeysPerThread];
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    const int j = j0 + i * kListThreads + int(threadIdx.x);
    if (j < s.Sk) k[i] = key_input(s, in, bh, j);
  }
  int partial = 0, unused, before;
  for (int i = threadIdx.x; i < block; i += kListThreads) partial += block_counts[bh * blocks + i];
  uint32_t ballot[kListKeysPerThread];
  int2 span[kListKeysPerThread];
  int unfolded = 0;
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    const int j = j0 + i * kListThreads + int(threadIdx.x);
    KeyInfo r{0, 0, 0.f, 0};
    if (j < s.Sk) r = key_record(s, in, info, chunks, bh, j, k[i]);
    span[i] = make_int2(r.begin, r.end);
    unfolded |= r.pad & 1;  // set for kept keys only
    ballot[i] = __ballot_sync(0xffffffffu, r.end > r.begin);
    if (lane == 0) warp_kept[i][warp] = __popc(ballot[i]);
  }
  if (fold_off && unfolded) atomicOr(fold_off, 1);
  ListScan(scan).ExclusiveSum(partial, unused, before);  // before: the row's kept keys in earlier blocks (syncs)
  int at = before;
#pragma unroll
  for (int i = 0; i < kListKeysPerThread; ++i) {
    int item_total = 0, warps_before = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      item_total += warp_kept[i][w];
      warps_before += w < warp ? warp_kept[i][w] : 0;
    }
    if (ballot[i] >> lane & 1) {
      const int pos = at + warps_before + lanes_below(ballot[i]);
      kept[row0 + pos] = j0 + i * kListThreads + int(threadIdx.x);
      if (kept_span) kept_span[row0 + pos] = span[i];
    }
    at += item_total;
  }
  if (block == blocks - 1 && threadIdx.x == 0) kept_count[bh] = at;
}

// The first position of a kept list (index order) holding a key >= key.
__device__ int first_kept_at_or_after(const int32_t* keys, int n, int key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Candidates a list kernel scans: keys in index order, each with its (begin, end).
struct Candidates {
  const int32_t* keys;
  const int2* spans;
  int n;
};

// A CTA scans its candidates a step of kScanStep at a time: warp w takes the step's positions
// [w * kWarpStep, (w + 1) * kWarpStep), kScanPer rounds of 32 consecutive ones (coalesced
// loads, kScanPer in flight a thread; the scan was latency-bound at one). Order-preserving
// placement then needs no scan: within a warp a ballot per round ranks its lanes and counts the
// round, across warps one barrier exchanges the warps' totals. The next step's candidates and
// its first key (the uniform exit test) are loaded before a step's placement and stores, under
// them (docs/performance.md, "key lists").
constexpr int kTileThreads = 256, kTileWarps = kTileThreads / 32;
constexpr int kScanPer = 4, kWarpStep = kScanPer * 32, kScanStep = kWarpStep * kTileWarps;
struct ScanStep {
  int head;  // the step's first key (INT_MAX past the candidates): every later key is past it too
  int j[kScanPer];
  int2 span[kScanPer];
};
__device__ __forceinline__ void load_step(const Candidates& c, int base, ScanStep& x) {
  x.head = base < c.n ? c.keys[base] : INT_MAX;
  const int first = base + int(threadIdx.x / 32) * kWarpStep + int(threadIdx.x % 32);
#pragma unroll
  for (int u = 0; u < kScanPer; ++u) {
    const int i = first + 32 * u;
    x.j[u] = i < c.n ? c.keys[i] : INT_MAX;
    x.span[u] = i < c.n ? c.spans[i] : make_int2(0, 0);
  }
}
// A step's two classes of taken candidates (ballots a round: a[u], b[u]): the positions before
// this warp's in the step (.x) and the step's totals (.y), each as two 16-bit counts (a low, b
// high; a step's stay below 2^16). The caller syncs before the next step.
__device__ __forceinline__ int2 step_offsets(const uint32_t (&a)[kScanPer], const uint32_t (&b)[kScanPer],
                                             int* warp_totals) {
  int mine = 0;
#pragma unroll
  for (int u = 0; u < kScanPer; ++u) mine += __popc(a[u]) + (__popc(b[u]) << 16);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) warp_totals[warp] = mine;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kTileWarps; ++w) {
    const int v = warp_totals[w];
    before += w < warp ? v : 0;
    total += v;
  }
  return make_int2(before, total);
}

// One CTA per (checkpoint, batch * KV head): checkpoint k's row c is the first of its tiles,
// k * checkpoint_tiles * block_m; its list holds the kept keys below c's causal limit (in index
// order) whose interval ends past c, which every later row's list draws from for such keys.
// meta: (the list's keys, or -1 where they pass checkpoint_cap; the kept keys below the limit,
// where its tiles resume the kept list).
__global__ void __launch_bounds__(kTileThreads)
    tile_checkpoints_kernel(DmaListShape s, const int32_t* kept, const int2* kept_span, const int32_t* kept_count,
                            int32_t* ck_keys, int2* ck_spans, int2* ck_meta) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int k = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int c = k * s.checkpoint_tiles * s.block_m;
  const int64_t limit = int64_t(c) + (s.Sk - s.Sq);
  const int bound = int(limit < 0 ? 0 : limit < s.Sk ? limit : s.Sk);  // keys below it: the list's part
  const Candidates src{kept + bh * s.Sk, kept_span + bh * s.Sk, kept_count[bh]};
  const int64_t cap = s.checkpoint_cap(), at = bh * s.checkpoints() + k;
  int32_t* out = ck_keys + at * cap;
  int2* out_span = ck_spans + at * cap;
  __shared__ int warp_totals[kTileWarps];
  int alive = 0, below = 0;
  ScanStep x, next;
  load_step(src, 0, x);
  for (int base = 0; x.head < bound; base += kScanStep) {  // uniform
    load_step(src, base + kScanStep, next);
    uint32_t keep[kScanPer], under[kScanPer];  // alive at c; below the limit
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      keep[u] = __ballot_sync(0xffffffffu, x.j[u] < bound && x.span[u].y > c);
      under[u] = __ballot_sync(0xffffffffu, x.j[u] < bound);
    }
    const int2 p = step_offsets(keep, under, warp_totals);
    int pos = alive + (p.x & 0xffff);
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      const int at = pos + lanes_below(keep[u]);
      if ((keep[u] >> (threadIdx.x % 32) & 1) && at < cap) out[at] = x.j[u], out_span[at] = x.span[u];
      pos += __popc(keep[u]);
    }
    alive += p.y & 0xffff;
    below += p.y >> 16;
    __syncthreads();
    x = next;
  }
  if (threadIdx.x == 0) ck_meta[at] = make_int2(alive <= cap ? alive : -1, below);
}

// One CTA per (query tile, batch * KV head): the kept keys whose interval meets the tile's
// rows. Kept keys start their interval at their own causal position, so the candidates are a
// prefix of the kept list (with checkpoints: the checkpoint's list, then the kept keys from its
// limit on); an order-preserving compaction keeps those still alive at the tile's first row.
//
// The keys that cover every row of the tile come first, then the partial ones (an interval
// that begins or ends among the rows), each part in index order. The attention kernels skip
// the per-score interval test on a key tile whose keys all cover the warp's rows
// (keys_cover_rows); in index order the partial keys were spread over the list and made 61% of
// the (warp, key tile) pairs of a 16K causal forward take the test (24% at 128K), now only the
// list's last tile or two do. Each query row adds one visible key and drops at most one, so a
// tile has fewer than 2 * block_m partial keys: they wait in shared memory.
// kCheckpointed: the lists are built with checkpoints. A template flag, not a runtime one: the
// second part's state takes 48 registers a thread against 40 (five CTAs an SM rather than six),
// and lists built without checkpoints (packed batches, calls of a wave or less) should not pay
// for it: one kernel for both at 56 registers took them from 128 to 156 us at 128K.
constexpr int kMaxPartialKeys = 2 * 128;  // 2 * the largest block_m of the kernels (128)
template <bool kCheckpointed>
__global__ void __launch_bounds__(kTileThreads)
    tile_lists_kernel(DmaListShape s, const int32_t* kept, const int2* kept_span, const int32_t* kept_count,
                      const int32_t* ck_keys, const int2* ck_spans, const int2* ck_meta, int32_t* tile_keys,
                      int32_t* tile_count) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int t = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int row_lo = t * s.block_m, row_hi = min(s.Sq, row_lo + s.block_m);
  int64_t last_key = int64_t(row_hi) - 1 + (s.Sk - s.Sq);  // causal limit of the tile's last row
  const int32_t* keys = kept + bh * s.Sk;
  const int2* spans = kept_span + bh * s.Sk;  // (begin, end) in kept order: coalesced, no record lookup
  const int n = kept_count[bh];
  int first = 0;  // the kept list's first candidate
  if (s.cu_k) {   // a packed batch: the keys of the sequences the tile's rows belong to
    const int s_lo = sequence_of(s.cu_q, s.num_seqs, row_lo), s_hi = sequence_of(s.cu_q, s.num_seqs, row_hi - 1);
    const int key_lo = min(max(s.cu_k[s_lo], 0), s.Sk);
    last_key = min(max(s.cu_k[s_hi + 1], key_lo), s.Sk) - 1;
    first = first_kept_at_or_after(keys, n, key_lo);
  }
  // The candidates in two parts, each scanned in whole steps: the checkpoint's list (none where
  // it overflowed), then the kept list from `first`.
  Candidates checkpoint{nullptr, nullptr, 0};
  if constexpr (kCheckpointed) {
    const int64_t at = bh * s.checkpoints() + t / s.checkpoint_tiles;
    const int2 meta = ck_meta[at];
    if (meta.x >= 0)
      checkpoint = {ck_keys + at * s.checkpoint_cap(), ck_spans + at * s.checkpoint_cap(), meta.x}, first = meta.y;
  }
  const Candidates kept_keys{keys, spans, n};
  const int64_t cap = s.cap();
  int32_t* out = tile_keys + (bh * s.q_tiles() + t) * cap;
  __shared__ int warp_totals[kTileWarps];
  __shared__ int32_t partial[kMaxPartialKeys];
  // One pass; with split, partial keys go to shared memory. The two classes' counts cross the
  // warps packed in one word.
  auto scan = [&](const Candidates& src, int from, bool split, int& n_cover, int& n_partial) {
    ScanStep x, next;
    load_step(src, from, x);
    for (int base = from; x.head <= last_key; base += kScanStep) {  // uniform
      load_step(src, base + kScanStep, next);
      uint32_t cover[kScanPer], part[kScanPer];  // ballots: taken and covering the tile (all taken
                                                 // without split); taken, partial
#pragma unroll
      for (int u = 0; u < kScanPer; ++u) {
        const int2 span = x.span[u];
        const bool taken = x.j[u] <= last_key && span.x < row_hi && span.y > row_lo;
        const bool covers = !split || (span.x <= row_lo && span.y >= row_hi);
        cover[u] = __ballot_sync(0xffffffffu, taken && covers);
        part[u] = __ballot_sync(0xffffffffu, taken && !covers);
      }
      const int2 p = step_offsets(cover, part, warp_totals);
      int pos_cover = n_cover + (p.x & 0xffff), pos_part = n_partial + (p.x >> 16);
      const int lane = threadIdx.x % 32;
#pragma unroll
      for (int u = 0; u < kScanPer; ++u) {
        const int at_cover = pos_cover + lanes_below(cover[u]), at_part = pos_part + lanes_below(part[u]);
        if ((cover[u] >> lane & 1) && at_cover < cap) out[at_cover] = x.j[u];
        if ((part[u] >> lane & 1) && at_part < kMaxPartialKeys) partial[at_part] = x.j[u];
        pos_cover += __popc(cover[u]);
        pos_part += __popc(part[u]);
      }
      n_cover += p.y & 0xffff;
      n_partial += p.y >> 16;
      __syncthreads();
      x = next;
    }
  };
  auto compact = [&](bool split, int& n_cover, int& n_partial) {
    n_cover = n_partial = 0;
    if (kCheckpointed && checkpoint.n > 0) scan(checkpoint, 0, split, n_cover, n_partial);  // uniform
    scan(kept_keys, first, split, n_cover, n_partial);
  };
  int n_cover = 0, n_partial = 0;
  compact(true, n_cover, n_partial);
  if (n_partial > kMaxPartialKeys)  // not for causal lists (see above); an index-ordered list is still right
    compact(false, n_cover, n_partial);
  for (int k = threadIdx.x; k < n_partial; k += kTileThreads)
    if (n_cover + k < cap) out[n_cover + k] = partial[k];
  const int written = n_cover + n_partial;
  if (threadIdx.x == 0) tile_count[bh * s.q_tiles() + t] = int32_t(written < cap ? written : cap);
}

// Tile ranges (dense packed batches): one thread per (query tile, batch * KV head). The tile's
// rows belong to sequences s_lo..s_hi; every key of s_lo..s_hi-1 is visible to their last
// rows, and of s_hi those up to the causal limit of the tile's last row (all, non-causal). The
// kept list is in index order, so those keys are one slice of it, found by two binary
// searches; other sequences' keys in the slice are hidden by their intervals.
__global__ void tile_ranges_kernel(DmaListShape s, const int32_t* kept, const int32_t* kept_count, int32_t* tile_first,
                                   int32_t* tile_count) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int tiles = s.q_tiles();
  if (e >= int64_t(s.B) * s.Hk * tiles) return;
  const int t = int(e % tiles);
  const int64_t bh = e / tiles;
  const int row_lo = t * s.block_m, row_hi = min(s.Sq, row_lo + s.block_m);
  const int s_lo = sequence_of(s.cu_q, s.num_seqs, row_lo), s_hi = sequence_of(s.cu_q, s.num_seqs, row_hi - 1);
  // Offsets are clamped as the records clamp them: bad ones give wrong slices, never a read
  // outside the kept list.
  const int key_lo = min(max(s.cu_k[s_lo], 0), s.Sk);
  const int last_k0 = min(max(s.cu_k[s_hi], key_lo), s.Sk);
  int key_hi = min(max(s.cu_k[s_hi + 1], last_k0), s.Sk);
  if (s.causal) {
    const int64_t q0 = s.cu_q[s_hi], nq = s.cu_q[s_hi + 1] - q0, nk = key_hi - last_k0;
    const int64_t visible = row_hi - 1 - q0 + nk - nq + 1;  // keys its last row sees
    key_hi = last_k0 + int(visible < 0 ? 0 : visible < nk ? visible : nk);
  }
  const int32_t* keys = kept + bh * s.Sk;
  const int n = kept_count[bh];
  const int first = first_kept_at_or_after(keys, n, key_lo);
  tile_first[e] = first;
  tile_count[e] = first_kept_at_or_after(keys, n, key_hi) - first;
}

}  // namespace

constexpr int kCheckpointTiles = 8;

// Tile lists of fewer tiles take one wave of the tile-list kernel, as long as its longest
// tile's scan, which a checkpoint kernel's longest scan (as long) only delays.
constexpr int64_t kCheckpointMinTiles = 1024;

int tile_checkpoints(const DmaListShape& s) {
  if (!s.tile_lists || s.cu_k) return 0;
  const int forced = forced_tile_checkpoints();
  if (forced == 0 || s.q_tiles() <= (forced > 0 ? forced : kCheckpointTiles)) return 0;
  if (forced > 0) return forced;
  return int64_t(s.B) * s.Hk * s.q_tiles() >= kCheckpointMinTiles ? kCheckpointTiles : 0;
}

size_t dma_lists_workspace(const DmaListShape& s) {
  const int64_t n = s.keys(), bh = int64_t(s.B) * s.Hk;
  size_t bytes = align_up(n * sizeof(KeyInfo)) + align_up(bh * list_blocks_per_row(s.Sk) * 4) + align_up(n * 4) +
                 align_up(bh * 4);
  if (s.tile_lists) bytes += align_up(n * 8) + align_up(bh * s.q_tiles() * s.cap() * 4) + align_up(bh * s.q_tiles() * 4);
  if (s.tile_lists && s.checkpoint_tiles > 0) {
    const int64_t lists = bh * s.checkpoints();
    bytes += align_up(lists * s.checkpoint_cap() * 4) + align_up(lists * s.checkpoint_cap() * 8) + align_up(lists * 8);
  }
  if (s.tile_ranges) bytes += 2 * align_up(bh * s.q_tiles() * 4);
  if (s.fold_bias) bytes += align_up(n * sizeof(BiasChunk)) + align_up(4);
  if (s.by_end) bytes += align_up(n * 4);
  return bytes;
}

DmaListScratch carve_dma_lists(void* base, const DmaListShape& s) {
  const int64_t n = s.keys(), bh = int64_t(s.B) * s.Hk;
  char* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += align_up(bytes);
    return r;
  };
  DmaListScratch c{};
  c.info = reinterpret_cast<KeyInfo*>(take(n * sizeof(KeyInfo)));
  c.block_counts = reinterpret_cast<int32_t*>(take(bh * list_blocks_per_row(s.Sk) * 4));
  c.kept = reinterpret_cast<int32_t*>(take(n * 4));
  c.kept_count = reinterpret_cast<int32_t*>(take(bh * 4));
  if (s.tile_lists) {
    c.kept_span = reinterpret_cast<int2*>(take(n * 8));
    c.tile_keys = reinterpret_cast<int32_t*>(take(bh * s.q_tiles() * s.cap() * 4));
    c.tile_count = reinterpret_cast<int32_t*>(take(bh * s.q_tiles() * 4));
  }
  if (s.tile_lists && s.checkpoint_tiles > 0) {
    const int64_t lists = bh * s.checkpoints();
    c.checkpoint_keys = reinterpret_cast<int32_t*>(take(lists * s.checkpoint_cap() * 4));
    c.checkpoint_spans = reinterpret_cast<int2*>(take(lists * s.checkpoint_cap() * 8));
    c.checkpoint_meta = reinterpret_cast<int2*>(take(lists * 8));
  }
  if (s.tile_ranges) {
    c.tile_first = reinterpret_cast<int32_t*>(take(bh * s.q_tiles() * 4));
    c.tile_count = reinterpret_cast<int32_t*>(take(bh * s.q_tiles() * 4));
  }
  if (s.fold_bias) {
    c.bias_chunks = reinterpret_cast<BiasChunk*>(take(n * sizeof(BiasChunk)));
    c.fold_off = reinterpret_cast<int32_t*>(take(4));
  }
  if (s.by_end) c.kept_by_end = reinterpret_cast<int32_t*>(take(n * 4));
  return c;
}

cudaError_t build_dma_lists(const DmaListShape& s, const DmaListInputs& in, const DmaListScratch& c, KeyLists& lists,
                            cudaStream_t stream, bool overlap) {
  lists.tile_rows_log2 = 0;
  while ((1 << lists.tile_rows_log2) < s.block_m) ++lists.tile_rows_log2;
  if (s.block_m <= 0 || 1 << lists.tile_rows_log2 != s.block_m) return cudaErrorInvalidValue;  // tiles of 2^k rows
  const int64_t blocks = int64_t(s.B) * s.Hk * list_blocks_per_row(s.Sk);  // 0 only without rows
  cudaError_t err = cudaSuccess;
  if (blocks > 0 && in.counted) {
    err = launch_kernel(overlap, records_and_kept_kernel, unsigned(blocks), kListThreads, 0, stream, s, in, c.info,
                        c.bias_chunks, c.block_counts, c.kept, s.tile_lists ? c.kept_span : nullptr, c.kept_count,
                        c.fold_off);
    if (err != cudaSuccess) return err;
  } else if (blocks > 0) {
    err = launch_kernel(overlap, key_records_kernel, unsigned(blocks), kListThreads, 0, stream, s, in, c.info,
                        c.block_counts, c.bias_chunks, c.fold_off);  // null without fold_bias (carve_dma_lists)
    if (err != cudaSuccess) return err;
    err = launch_kernel(overlap, kept_list_kernel, unsigned(blocks), kListThreads, 0, stream, s, c.info, c.block_counts,
                        c.kept, s.tile_lists ? c.kept_span : nullptr, c.kept_count, c.fold_off);
    if (err != cudaSuccess) return err;
  }
  lists.info = c.info;
  lists.bias_chunks = c.bias_chunks;
  lists.fold_off = c.fold_off;
  lists.kept = c.kept;
  lists.kept_count = c.kept_count;
  lists.kept_by_end = c.kept_by_end;  // by_end: filled by bwd_setup (bwd_setup.hpp)
  if (s.tile_lists) {
    if (s.checkpoint_tiles > 0) {
      err = launch_kernel(overlap, tile_checkpoints_kernel, dim3(s.checkpoints(), s.B * s.Hk), kTileThreads, 0, stream,
                          s, c.kept, c.kept_span, c.kept_count, c.checkpoint_keys, c.checkpoint_spans,
                          c.checkpoint_meta);
      if (err != cudaSuccess) return err;
    }
    const dim3 grid(s.q_tiles(), s.B * s.Hk);
    err = launch_kernel(overlap, s.checkpoint_tiles > 0 ? tile_lists_kernel<true> : tile_lists_kernel<false>, grid,
                        kTileThreads, 0, stream, s, c.kept, c.kept_span, c.kept_count, c.checkpoint_keys,
                        c.checkpoint_spans, c.checkpoint_meta, c.tile_keys, c.tile_count);
    if (err != cudaSuccess) return err;
    lists.keys = c.tile_keys;
    lists.keys_bh_stride = int64_t(s.q_tiles()) * s.cap();
    lists.keys_tile_stride = s.cap();
    lists.counts = c.tile_count;
    lists.count_tiles = s.q_tiles();
    // The kernels stage a list in shared memory when it fits what they reserve for max_listed.
    // A packed batch's bound covers tiles that meet many sequences; a tile inside one sequence
    // holds at most min(w, max_k) + block_m keys, so that much is reserved and longer lists are
    // read from global memory (the kernels check each list's count).
    const int64_t one_seq = (s.window < s.max_k ? s.window : s.max_k) + s.block_m;
    lists.max_listed = int(s.cu_k && one_seq < s.cap() ? one_seq : s.cap());
  } else if (s.tile_ranges) {
    const int64_t ranges = int64_t(s.B) * s.Hk * s.q_tiles();
    err = launch_kernel(overlap, tile_ranges_kernel, blocks_for(ranges, 256), 256, 0, stream, s, c.kept, c.kept_count,
                        c.tile_first, c.tile_count);
    if (err != cudaSuccess) return err;
    lists.keys = c.kept;
    lists.keys_bh_stride = s.Sk;
    lists.keys_tile_stride = 0;
    lists.tile_first = c.tile_first;
    lists.counts = c.tile_count;
    lists.count_tiles = s.q_tiles();
    lists.max_listed = 0;  // slices of a sequence's keys run long: read from global memory, not staged
  } else {
    lists.keys = c.kept;
    lists.keys_bh_stride = s.Sk;
    lists.keys_tile_stride = 0;
    lists.counts = c.kept_count;
    lists.count_tiles = 1;
  }
  return cudaSuccess;
}

// One thread per 16-byte chunk of a gathered K/V row; the row's first chunk also writes its bias.
__global__ void gather_kept_kernel(DmaListShape s, KeyLists lists, KeptGatherArgs g) {
  const int chunks = g.D * g.elem_bytes / 16;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = int64_t(s.B) * s.Hk * g.W;
  if (e >= rows * chunks) return;
  const int64_t row = e / chunks;
  const int c = int(e % chunks), slot = int(row % g.W);
  const int64_t bh = row / g.W;
  const int b = int(bh / s.Hk), hk = int(bh % s.Hk);
  const bool kept = slot < lists.kept_count[bh];
  const int j = kept ? lists.kept[bh * s.Sk + slot] : 0;
  uint4 kc = {0, 0, 0, 0}, vc = {0, 0, 0, 0};
  if (kept) {
    const char* k = static_cast<const char*>(g.k) + (b * g.k_stride[0] + j * g.k_stride[1] + hk * g.k_stride[2]) * g.elem_bytes;
    const char* v = static_cast<const char*>(g.v) + (b * g.v_stride[0] + j * g.v_stride[1] + hk * g.v_stride[2]) * g.elem_bytes;
    kc = reinterpret_cast<const uint4*>(k)[c];
    vc = reinterpret_cast<const uint4*>(v)[c];
  }
  reinterpret_cast<uint4*>(g.k_out)[e] = kc;
  reinterpret_cast<uint4*>(g.v_out)[e] = vc;
  if (c == 0) g.bias_out[row] = kept ? lists.info[bh * s.Sk + j].bias : -INFINITY;
}

cudaError_t gather_kept_keys(const DmaListShape& s, const KeyLists& lists, const KeptGatherArgs& g,
                             cudaStream_t stream) {
  const int64_t n = int64_t(s.B) * s.Hk * g.W * (g.D * g.elem_bytes / 16);
  gather_kept_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(s, lists, g);
  return cudaGetLastError();
}

}  // namespace fdma::cuda
