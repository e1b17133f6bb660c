// Top-w selection for the decode path: per (batch, KV head) row, the w best keys among the
// first V0 cached ones (V0 = L - Sq + 1 when causal: what the first new query sees; L when
// not), found by a radix select over the keys' order-preserving score bits instead of a sort,
// and written as a compact list of kept keys. Causal calls with Sq > 1 then let the later
// queries' extra keys arrive one by one (select_arrivals_kernel).
//
// The radix select: three passes over the row's scores, each a histogram of the next digit
// (11, 11, 10 bits) among the keys whose higher bits match the threshold found so far; the
// row's last CTA to finish a pass reads the histogram and picks the digit holding the w-th
// key. 16-bit scores have nothing below bit 16 (as floats), so two passes settle them. Keys
// whose bits equal the threshold are kept lowest position first: when more of them exist than
// are needed, a count per chunk (select_ties_kernel) gives each CTA the rank of its first one.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>

#include "cuda/decode/decode_select.hpp"
#include "cuda/decode/score_bits.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/per_device.cuh"

namespace fdma::cuda {
namespace {

struct Row {
  int row, b, hk, L, V0, chunks;
};

__device__ __forceinline__ Row row_of(const DecodeSelectArgs& a, int row) {
  Row r;
  r.row = row;
  r.b = row / a.cache.Hk;
  r.hk = row - r.b * a.cache.Hk;
  r.L = cache_length(a.cache, r.b);
  r.V0 = a.causal ? max(0, min(r.L, r.L - a.Sq + 1)) : r.L;
  r.chunks = max(1, (r.V0 + kSelectChunk - 1) / kSelectChunk);
  return r;
}

constexpr int kItems = kSelectChunk / kSelectThreads;  // keys per thread and chunk

// A chunk of the row's keys' order bits (score_bits.cuh), thread t taking j0 + i * kThreads + t.
template <int kThreads = kSelectThreads, int N = kItems>
__device__ __forceinline__ void load_chunk_bits(const DecodeSelectArgs& a, const Row& r, int j0, int j1,
                                                uint32_t (&bits)[N]) {
  load_score_bits<kThreads, N>(a.cache, r.b, r.hk, j0, j1, bits);
}

// The first digit's histogram. A float's top 11 bits are its sign, exponent and 2 mantissa
// bits, so scores crowd into a few bins, and shared-memory atomics on one address serialize:
// about 10 us per 4096-key CTA on the H100 with one counter per bin (letting same-bin lanes add
// once through match_any cost more than it saved). Eight replicas of each counter, lane % 8
// choosing one, cut the collisions eightfold; the CTA then sums each bin's eight.
__device__ __forceinline__ void replicated_histogram(const uint32_t (&bits)[kItems], uint32_t* hist) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  uint32_t* rep = reinterpret_cast<uint32_t*>(smem_bytes);  // [kSelectBins][8]
  const int tid = threadIdx.x;
  uint4* zero = reinterpret_cast<uint4*>(rep);
  for (int i = tid; i < kSelectBins * 8 / 4; i += kSelectThreads) zero[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i)
    if (bits[i] != 0) atomicAdd(&rep[Digit<0>::of(bits[i]) * 8 + (tid & 7)], 1u);
  __syncthreads();
  // Thread t sums bins t + 256 k; its 8 words start at a lane-dependent offset so that a
  // warp's 32 reads fall in 32 banks.
  for (int bin = tid; bin < kSelectBins; bin += kSelectThreads) {
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += rep[bin * 8 + ((i + tid / 4) & 7)];
    hist[bin] = sum;
  }
}

template <int kPass>
__global__ void __launch_bounds__(kSelectThreads) select_pass_kernel(DecodeSelectArgs a, int final_pass) {
  using Dg = Digit<kPass>;
  __shared__ uint32_t hist[Dg::kBins], part[kSelectThreads];
  __shared__ int is_last;
  const Row r = row_of(a, blockIdx.y);
  if (int(blockIdx.x) >= r.chunks || kPass > final_pass) return;
  SelectState& st = a.state[r.row];
  if (kPass > 0 && st.t.keep_all) return;
  const uint32_t prefix = kPass > 0 ? st.t.prefix : 0u;
  const int tid = threadIdx.x;
  for (int i = tid; i < Dg::kBins; i += kSelectThreads) hist[i] = 0;
  __syncthreads();
  const int j0 = blockIdx.x * kSelectChunk, j1 = min(r.V0, j0 + kSelectChunk);
  uint32_t bits[kItems];
  load_chunk_bits(a, r, j0, j1, bits);
  if constexpr (kPass == 0) {
    replicated_histogram(bits, hist);
  } else {  // only the keys of one bucket count, spread over its sub-bins: few collide
#pragma unroll
    for (int i = 0; i < kItems; ++i)
      if (bits[i] != 0 && Dg::in_bucket(bits[i], prefix)) atomicAdd(&hist[Dg::of(bits[i])], 1u);
  }
  __syncthreads();
  uint32_t* g = a.hist + size_t(r.row) * kSelectBins;
  for (int i = tid; i < Dg::kBins; i += kSelectThreads)
    if (hist[i]) atomicAdd(&g[i], hist[i]);
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(&st.arrived, 1u) == uint32_t(r.chunks - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // All of this thread's bins in flight at once, then zeroed for the next pass.
  constexpr int kPer = Dg::kBins / kSelectThreads;
  uint32_t v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = __ldcg(&g[tid + k * kSelectThreads]);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    hist[tid + k * kSelectThreads] = v[k];
    g[tid + k * kSelectThreads] = 0;
  }
  __syncthreads();
  // The row's last CTA: the digit, and the pass counter back to zero for the next pass.
  resolve_digit<kPass, kSelectThreads>(hist, part, kPass == 0 ? a.w : st.t.need, kPass == final_pass, st.t);
  if (tid == 0) st.arrived = 0;
}

// Sum over the CTA (every thread gets it).
__device__ __forceinline__ int block_sum(int x) {
  __shared__ int warp_sums[kSelectThreads / 32];
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < kSelectThreads / 32; ++w) total += warp_sums[w];
  return total;
}

__device__ __forceinline__ bool ties_matter(const SelectState& st) { return !st.t.keep_all && st.t.count_eq > st.t.need; }

// Threshold ties: how many keys of each chunk equal the threshold, where more than needed do.
__global__ void __launch_bounds__(kSelectThreads) select_ties_kernel(DecodeSelectArgs a) {
  const Row r = row_of(a, blockIdx.y);
  if (int(blockIdx.x) >= r.chunks) return;
  const SelectState& st = a.state[r.row];
  if (!ties_matter(st)) return;
  const int j0 = blockIdx.x * kSelectChunk, j1 = min(r.V0, j0 + kSelectChunk);
  uint32_t bits[kItems];
  load_chunk_bits(a, r, j0, j1, bits);
  int n = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) n += bits[i] != 0 && bits[i] == st.t.prefix;
  n = block_sum(n);
  if (threadIdx.x == 0) a.eq_count[size_t(r.row) * a.chunks + blockIdx.x] = n;
}

// The kept keys of each chunk into the row's list, kept by queries [0, Sq) for now.
__global__ void __launch_bounds__(kSelectThreads) select_collect_kernel(DecodeSelectArgs a) {
  __shared__ int warp_ties[kSelectThreads / 32];
  const Row r = row_of(a, blockIdx.y);
  if (int(blockIdx.x) >= r.chunks) return;
  SelectState& st = a.state[r.row];
  const bool keep_all = st.t.keep_all != 0, ties = ties_matter(st);
  const uint32_t tau = st.t.prefix;
  const int need = st.t.need;
  // Threshold keys in earlier chunks: this chunk's first one ranks after them.
  int tie_rank = 0;
  if (ties) {
    int before = 0;
    for (int c = threadIdx.x; c < int(blockIdx.x); c += kSelectThreads) before += a.eq_count[size_t(r.row) * a.chunks + c];
    tie_rank = block_sum(before);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  KeptKey* list = a.list + size_t(r.row) * a.list_cap;
  const int j0 = blockIdx.x * kSelectChunk, j1 = min(r.V0, j0 + kSelectChunk);
  uint32_t bits[kItems];
  load_chunk_bits(a, r, j0, j1, bits);
  // Which of this thread's keys are kept. Whole iterations for every thread: the tie ranks
  // need the CTA's barriers.
  uint64_t kept = 0;  // bit i: key j0 + i * kSelectThreads + threadIdx.x
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (j0 + i * kSelectThreads >= j1) break;  // uniform over the CTA
    const uint32_t kb = bits[i];
    bool keep = kb != 0 && (keep_all || kb > tau);
    if (ties) {  // rank among the threshold keys, in position order
      const bool eq = !keep_all && kb != 0 && kb == tau;
      const unsigned mask = __ballot_sync(0xffffffffu, eq);
      __syncthreads();
      if (lane == 0) warp_ties[warp] = __popc(mask);
      __syncthreads();
      int rank = tie_rank + __popc(mask & ((1u << lane) - 1));
      for (int w = 0; w < warp; ++w) rank += warp_ties[w];
      for (int w = 0; w < kSelectThreads / 32; ++w) tie_rank += warp_ties[w];
      keep |= eq && rank < need;
    } else {
      keep |= !keep_all && kb != 0 && kb == tau;
    }
    kept |= uint64_t(keep) << i;
  }
  // Slots: one atomic per CTA (an atomic per warp and iteration waited out 16 latencies).
  __shared__ int warp_base[kSelectThreads / 32];
  __shared__ int cta_base;
  const int mine = __popcll(kept);
  int incl = mine;  // inclusive scan over the warp
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_base[warp] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < kSelectThreads / 32; ++w) {
      const int n = warp_base[w];
      warp_base[w] = total;
      total += n;
    }
    cta_base = total ? atomicAdd(&st.listed, total) : 0;
  }
  __syncthreads();
  int slot = cta_base + warp_base[warp] + incl - mine;
  // Kept keys are few: read again (from L2) for where they live, in a loop over the set bits
  // (an unrolled one costs instruction fetch stalls).
  for (uint64_t m = kept; m; m &= m - 1, ++slot) {
    const int j = j0 + (__ffsll(static_cast<long long>(m)) - 1) * kSelectThreads + int(threadIdx.x);
    const KeyRead key = read_key(a.cache, r.b, r.hk, j);
    if (slot < a.list_cap) list[slot] = KeptKey{j, key.outer, uint32_t(a.Sq) << 16, key.score};
  }
}

// Causal calls with Sq > 1: query t of the new ones also sees keys V0 .. V0 + t - 1 (at most
// Sq - 1 of them). They arrive in position order; one that ranks above the current worst
// kept key takes its place from its first query on. One CTA per row: the worst key is a
// CTA-wide minimum over the list, once per arrival.
__global__ void __launch_bounds__(kSelectThreads) select_arrivals_kernel(DecodeSelectArgs a) {
  __shared__ uint64_t warp_min[kSelectThreads / 32];
  __shared__ int warp_arg[kSelectThreads / 32];
  __shared__ uint64_t worst_rank;
  __shared__ int worst_slot;
  const Row r = row_of(a, blockIdx.x);
  SelectState& st = a.state[r.row];
  KeptKey* list = a.list + size_t(r.row) * a.list_cap;
  const int listed = min(st.listed, a.list_cap);
  const int off = r.L - a.Sq;  // query i sees positions <= i + off
  int size = listed, entered = 0;
  const uint32_t all = uint32_t(a.Sq) << 16;
  for (int j = r.V0; j < r.L; ++j) {
    const KeyRead key = read_key(a.cache, r.b, r.hk, j);
    if (key.bits == 0) continue;  // absent: never kept
    const uint32_t first = uint32_t(j - off);
    const KeptKey arrival{j, key.outer, first | all, key.score};
    if (size < a.w) {  // room left: kept from its first query on
      if (threadIdx.x == 0 && listed + entered < a.list_cap) list[listed + entered] = arrival;
      ++entered, ++size;
      __syncthreads();
      continue;
    }
    // The worst key still kept by the last query: among the listed ones and the arrivals so far.
    uint64_t best = ~uint64_t(0);
    int arg = -1;
    for (int s = threadIdx.x; s < listed + entered; s += kSelectThreads) {
      const KeptKey k = list[s];
      if ((k.queries >> 16) != uint32_t(a.Sq)) continue;  // already evicted
      const uint64_t rk = rank_of(order_bits(a.cache, k.score), k.pos);
      if (rk < best) best = rk, arg = s;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (ob < best) best = ob, arg = oa;
    }
    if (threadIdx.x % 32 == 0) warp_min[threadIdx.x / 32] = best, warp_arg[threadIdx.x / 32] = arg;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t b = ~uint64_t(0);
      int s = -1;
      for (int w = 0; w < kSelectThreads / 32; ++w)
        if (warp_min[w] < b) b = warp_min[w], s = warp_arg[w];
      worst_rank = b, worst_slot = s;
    }
    __syncthreads();
    if (rank_of(key.bits, j) > worst_rank && worst_slot >= 0) {  // the arrival replaces the worst
      if (threadIdx.x == 0) {
        KeptKey& out = list[worst_slot];
        out.queries = (out.queries & 0xffffu) | (first << 16);  // kept until this query
        if (listed + entered < a.list_cap) list[listed + entered] = arrival;
      }
      ++entered;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) st.listed = min(listed + entered, a.list_cap);
}

// ---- Hopper: one kernel, one cluster of CTAs per row ------------------------------------
// The passes above each read every score again and pay a chain of latencies per CTA (load,
// flush, fence, the last CTA's resolve) in every one of their five launches: about 10 us per
// launch even for a 4096-key row. Here one cluster of up to 16 CTAs takes a row: its scores
// are read once into shared memory (8192 or 32768 a CTA), every pass's histograms are summed
// through distributed shared memory, and the cluster's barriers replace the kernel
// boundaries. The keys sit in shared memory rather than registers, and every loop over them
// is a loop: the register version's unrolled code (about 100 KB of it) stalled on
// instruction fetch. It runs where a row fits one CTA (decode_select_cluster_size says why).
constexpr int kClusterThreads = 512;
constexpr int kClusterKeysPerThread = 64;
constexpr int kClusterWarps = kClusterThreads / 32;

// Followed in shared memory by the CTA's keys' order bits, [items][kClusterThreads].
struct ClusterShared {
  uint32_t rep[kSelectBins * 4];  // replicated counters (replicated_histogram's reason)
  uint32_t hist[kSelectBins];     // this CTA's histogram of the pass: the others read it
  uint32_t total[kSelectBins];    // the cluster's
  uint32_t part[kClusterThreads];
  int tie_count[kClusterKeysPerThread * kClusterWarps];  // [item][warp], then its exclusive scan
  int warp_base[kClusterWarps];
  int eq_count, kept_count, cta_base, tie_base;
  RadixThreshold t;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace cg = cooperative_groups;

template <int kPass>
__device__ __forceinline__ void cluster_pass(cg::cluster_group& cluster, ClusterShared& sh, const uint32_t* keys,
                                             int items, bool final_pass) {
  using Dg = Digit<kPass>;
  const int tid = threadIdx.x;
  uint4* zero = reinterpret_cast<uint4*>(sh.rep);
  for (int i = tid; i < Dg::kBins * 4 / 4; i += kClusterThreads) zero[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  const uint32_t prefix = sh.t.prefix;
#pragma unroll 4
  for (int i = 0; i < items; ++i) {
    const uint32_t b = keys[i * kClusterThreads + tid];
    if (b != 0 && Dg::in_bucket(b, prefix)) atomicAdd(&sh.rep[Dg::of(b) * 4 + (tid & 3)], 1u);
  }
  __syncthreads();
  for (int bin = tid; bin < Dg::kBins; bin += kClusterThreads) {
    const uint4 r = *reinterpret_cast<const uint4*>(&sh.rep[bin * 4]);
    sh.hist[bin] = r.x + r.y + r.z + r.w;
  }
  cluster.sync();  // every CTA's histogram is complete
  const int C = int(cluster.num_blocks());
  for (int bin = tid; bin < Dg::kBins; bin += kClusterThreads) {
    uint32_t t = 0;
    for (int c = 0; c < C; ++c) t += cluster.map_shared_rank(sh.hist, c)[bin];
    sh.total[bin] = t;
  }
  __syncthreads();
  // Every CTA finds the same digit from the same totals.
  resolve_digit<kPass, kClusterThreads>(sh.total, sh.part, uint32_t(sh.t.need), final_pass, sh.t);
  cluster.sync();  // the others are done reading this CTA's histogram; sh.* is settled
}
#endif

__global__ void __launch_bounds__(kClusterThreads, 1) select_cluster_kernel(DecodeSelectArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ClusterShared& sh = *reinterpret_cast<ClusterShared*>(smem_raw);
  uint32_t* keys = reinterpret_cast<uint32_t*>(smem_raw + sizeof(ClusterShared));  // [items][threads]
  const int C = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const Row r = row_of(a, blockIdx.y);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int cta_keys = kClusterThreads * a.cluster_items;
  const int j0 = rank * cta_keys, j1 = min(r.V0, j0 + cta_keys);
  // Items this CTA holds (the same for all its threads: the tie ranks take whole warps).
  const int items = max(0, min(a.cluster_items, (j1 - j0 + kClusterThreads - 1) / kClusterThreads));
  for (int i0 = 0; i0 < items; i0 += 16) {  // 16 loads in flight a thread
    uint32_t bits[16];
    load_chunk_bits<kClusterThreads>(a, r, j0 + i0 * kClusterThreads, j1, bits);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (i0 + i < items) keys[(i0 + i) * kClusterThreads + tid] = bits[i];
  }
  if (tid == 0) sh.t = RadixThreshold{0u, a.w, 0, 0}, sh.eq_count = 0;
  __syncthreads();
  const bool f32 = a.cache.score_dtype == 1;
  cluster_pass<0>(cluster, sh, keys, items, false);
  if (!sh.t.keep_all) cluster_pass<1>(cluster, sh, keys, items, !f32);  // the same branch in every CTA
  if (!sh.t.keep_all && f32) cluster_pass<2>(cluster, sh, keys, items, true);

  const bool keep_all = sh.t.keep_all != 0;
  const uint32_t tau = sh.t.prefix;
  const int need = sh.t.need;
  const bool ties = !keep_all && sh.t.count_eq > need;
  uint64_t kept = 0;
  for (int i = 0; i < items; ++i) {
    const uint32_t kb = keys[i * kClusterThreads + tid];
    const bool keep = kb != 0 && (keep_all || kb > tau || (!ties && kb == tau));
    kept |= uint64_t(keep) << i;
  }
  if (ties) {  // the threshold's keys, lowest positions first: ranks over the cluster
    int mine = 0;
    for (int i = 0; i < items; ++i) {
      const uint32_t kb = keys[i * kClusterThreads + tid];
      const bool eq = kb != 0 && kb == tau;
      mine += eq;
      const unsigned m = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) sh.tie_count[i * kClusterWarps + warp] = __popc(m);
    }
    for (int i = items + tid / kClusterWarps; i < kClusterKeysPerThread && tid < kClusterThreads; i += kClusterThreads / kClusterWarps)
      sh.tie_count[i * kClusterWarps + tid % kClusterWarps] = 0;  // items this CTA lacks
    for (int off = 16; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
    if (lane == 0) atomicAdd(&sh.eq_count, mine);
    __syncthreads();
    if (tid < 32) {  // exclusive scan of tie_count in (item, warp) order: 32 entries a lane
      constexpr int kPer = kClusterKeysPerThread * kClusterWarps / 32;
      int sum = 0;
      for (int k = 0; k < kPer; ++k) sum += sh.tie_count[tid * kPer + k];
      int incl = sum;
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (tid >= off) incl += v;
      }
      int run = incl - sum;
      for (int k = 0; k < kPer; ++k) {
        const int n = sh.tie_count[tid * kPer + k];
        sh.tie_count[tid * kPer + k] = run;
        run += n;
      }
    }
    cluster.sync();  // every CTA's eq_count is in
    if (tid == 0) {
      int before = 0;
      for (int c = 0; c < rank; ++c) before += *cluster.map_shared_rank(&sh.eq_count, c);
      sh.tie_base = before;
    }
    __syncthreads();
    for (int i = 0; i < items; ++i) {
      const uint32_t kb = keys[i * kClusterThreads + tid];
      const bool eq = kb != 0 && kb == tau;
      const unsigned m = __ballot_sync(0xffffffffu, eq);
      const int rank_eq = sh.tie_base + sh.tie_count[i * kClusterWarps + warp] + __popc(m & ((1u << lane) - 1));
      if (eq && rank_eq < need) kept |= uint64_t(1) << i;
    }
  }
  // Slots: a scan over the CTA, then the CTAs in rank order.
  const int mine = __popcll(kept);
  int incl = mine;
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) sh.warp_base[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    int total = 0;
    for (int w = 0; w < kClusterWarps; ++w) {
      const int n = sh.warp_base[w];
      sh.warp_base[w] = total;
      total += n;
    }
    sh.kept_count = total;
  }
  cluster.sync();
  if (tid == 0) {
    int base = 0;
    for (int c = 0; c < rank; ++c) base += *cluster.map_shared_rank(&sh.kept_count, c);
    sh.cta_base = base;
    if (rank == C - 1) a.state[r.row].listed = min(base + sh.kept_count, a.list_cap);
  }
  __syncthreads();
  KeptKey* list = a.list + size_t(r.row) * a.list_cap;
  int slot = sh.cta_base + sh.warp_base[warp] + incl - mine;
  for (uint64_t m = kept; m; m &= m - 1, ++slot) {
    const int j = j0 + (__ffsll(static_cast<long long>(m)) - 1) * kClusterThreads + tid;
    const KeyRead key = read_key(a.cache, r.b, r.hk, j);
    if (slot < a.list_cap) list[slot] = KeptKey{j, key.outer, uint32_t(a.Sq) << 16, key.score};
  }
  cluster.sync();  // this CTA's shared memory stays until the others have read it
#endif
}

}  // namespace

size_t decode_select_workspace(int rows, int chunks, int list_cap, SelectScratch* s) {
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t state = up(sizeof(SelectState) * rows), hist = up(sizeof(uint32_t) * kSelectBins * rows);
  const size_t eq = up(sizeof(int32_t) * size_t(rows) * chunks), list = up(sizeof(KeptKey) * size_t(rows) * list_cap);
  if (s) {
    s->zeroed_bytes = state + hist;
    s->state_offset = 0, s->hist_offset = state, s->eq_offset = state + hist, s->list_offset = state + hist + eq;
  }
  return state + hist + eq + list;
}

// The cluster kernel runs where a row fits one CTA (8192 candidates): there it takes about half
// the passes' time (22.8 against 46.8 us at 4096 keys, H100). Over several CTAs its cluster
// barriers and the histogram sums through distributed shared memory cost more than the passes
// (B8 Hk8 128K keys: 219 us with 16 CTAs a row, 167 with 4, passes 166; docs/performance.md).
// FDMA_DECODE_SELECT=passes or =cluster forces either path (the GPU tests run both).
int decode_select_cluster_size(int max_candidates) {
  const char* path = forced_decode_select();
  if (std::strcmp(path, "passes") == 0) return 0;
  const bool forced = std::strcmp(path, "cluster") == 0;
  if (!forced && max_candidates > kClusterThreads * 16) return 0;
  static std::atomic<int> major_of[kMaxDevices] = {};
  const int major = cached_per_device(major_of, [] {
    int device = 0, m = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      cudaGetLastError();
    return m;
  });
  if (major < 9) return 0;
  int c = 1;
  while (c * kClusterThreads * kClusterKeysPerThread < max_candidates) c *= 2;
  return c <= 16 ? c : 0;
}

// Keys a thread holds: 16 where a cluster of up to 16 CTAs covers the row with 16 (their
// shared memory then lets two CTAs share an SM), else 64.
int decode_select_cluster_items(int max_candidates) {
  return max_candidates <= 16 * kClusterThreads * 16 ? 16 : kClusterKeysPerThread;
}

cudaError_t run_decode_select(const DecodeSelectArgs& a, int rows, void* zeroed, size_t zeroed_bytes,
                              cudaStream_t stream) {
  if (decode_select_cluster_size(a.max_candidates)) {
    DecodeSelectArgs args = a;
    args.cluster_items = decode_select_cluster_items(a.max_candidates);
    int C = 1;
    while (C * kClusterThreads * args.cluster_items < a.max_candidates) C *= 2;
    const size_t smem = sizeof(ClusterShared) + size_t(args.cluster_items) * kClusterThreads * 4;
    static std::atomic<int> granted[kMaxDevices] = {};
    static std::atomic<bool> non_portable[kMaxDevices] = {};
    cudaError_t err = grant_smem_once(select_cluster_kernel, int(smem), granted);
    if (err == cudaSuccess && C > 8)
      err = once_per_device(non_portable, [] {
        return cudaFuncSetAttribute(select_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      });
    if (err != cudaSuccess) return err;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(C), unsigned(rows));
    cfg.blockDim = dim3(kClusterThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(C), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, select_cluster_kernel, args);
    if (err != cudaSuccess) return err;
    if (a.causal && a.Sq > 1) select_arrivals_kernel<<<rows, kSelectThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  cudaError_t err = cudaMemsetAsync(zeroed, 0, zeroed_bytes, stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(a.chunks, rows);
  // 16-bit scores are settled after two passes (nothing below bit 16).
  const int final_pass = a.cache.score_dtype == 1 ? 2 : 1;
  const int lane_bytes = kSelectBins * 8 * 4;  // select_pass_kernel<0>'s replicated counters
  static std::atomic<int> granted[kMaxDevices] = {};
  if (const cudaError_t e = grant_smem_once(select_pass_kernel<0>, lane_bytes, granted); e != cudaSuccess) return e;
  select_pass_kernel<0><<<grid, kSelectThreads, lane_bytes, stream>>>(a, final_pass);
  select_pass_kernel<1><<<grid, kSelectThreads, 0, stream>>>(a, final_pass);
  if (final_pass == 2) select_pass_kernel<2><<<grid, kSelectThreads, 0, stream>>>(a, final_pass);
  select_ties_kernel<<<grid, kSelectThreads, 0, stream>>>(a);
  select_collect_kernel<<<grid, kSelectThreads, 0, stream>>>(a);
  if (a.causal && a.Sq > 1) select_arrivals_kernel<<<rows, kSelectThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace fdma::cuda
