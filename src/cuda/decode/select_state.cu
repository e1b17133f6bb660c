// The decode selection with a caller-owned state: per (batch, KV head) row, the positions of
// the top-w keys of a prefix [0, n) of the cache, ascending, and their scores (fdma.h,
// select_state).
//
// Scores are fixed per key, so the top-w of a prefix grown by one key is the old set with the
// new key in place of the worst one when it ranks above it. A decode step whose state
// describes the cache up to its new keys therefore reads w scores and the new keys' instead of
// the whole row (the state keeps the w scores beside their positions, so reading them back is
// one contiguous read, not a gather across the cache): a group of threads per row holds the set
// in shared memory, lets the new keys arrive in position order (each query's set is the one
// after its own key arrived), writes the kept list with each key's interval of queries, and
// writes the set back for the next step.
//
// A row's update is a chain of dependent steps, not bandwidth: with more rows than SMs, a CTA
// takes two or four rows, a group of its threads each, so that every row runs in the first wave
// (the B64 step's 512 rows took four waves of one row a CTA).
//
// Chunked prefill (prefill.cu) asks for the set of the keys before its queries instead
// (StateMode::prefix): grown from the state where it can be, rebuilt otherwise, written out in
// position order and the state left as it was.
//
// A state that does not describe such a prefix (zeros for a non-empty cache, a prefix longer
// than the keys that predate this call's appends, positions out of order or range, a key now
// absent) is rebuilt here by a radix select over the prefix (11/11/10-bit digits as in
// decode_select.cu, all in this CTA) whose kept keys are compacted in position order.
#include "cuda/decode/select_state.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/decode/score_bits.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 16;  // keys per thread and tile of the rebuild
constexpr int kTile = kThreads * kItems;
constexpr int kMaxGrowth = 64;  // keys a state may be behind the cache and still be grown
constexpr int kMaxGroups = 4;   // rows a CTA takes at most

struct Shared {
  uint32_t rep[kSelectBins * 4];  // first-digit counters, 4 replicas (decode_select.cu's reason)
  uint32_t hist[kSelectBins];
  uint32_t part[kThreads];
  int strict_scan[kItems * kWarps], eq_scan[kItems * kWarps];  // per (item, warp), then scanned
  uint64_t warp_rank[kWarps];  // by warp of the CTA: a group's warps are its own
  int warp_arg[kWarps];
  int tile_strict, tile_eq, strict_run, eq_run;
  RadixThreshold t;
  // Per group (row of the CTA).
  int ok[kMaxGroups];
  int rebuilt_size[kMaxGroups];
  int dropped[kMaxGroups][kMaxGrowth];  // the set's gaps, per group
  uint64_t worst_rank[kMaxGroups];
  int worst[kMaxGroups];
};
// Followed by each group's set: pos[cap], score[cap], since[cap] (its first query), with room
// for the keys a call may add: cap = slots + kMaxGrowth.

size_t shared_bytes(int slots, int groups) {
  return sizeof(Shared) + size_t(groups) * size_t(slots + kMaxGrowth) * 12;
}

// The threads of a CTA that work on one row. The rebuild runs on the whole CTA, one row at a
// time; everything else per group, under a barrier of its own.
struct Group {
  int index, threads, tid, first_warp, warps;
  __device__ void sync() const {
    if (threads == kThreads) __syncthreads();
    else ptx::named_barrier_sync(1 + index, threads);
  }
};

// One digit's histogram over keys [0, V) of the row, then its resolution.
template <int kPass>
__device__ void radix_pass(const CacheView& c, Shared& sh, int b, int hk, int V, bool final_pass) {
  using Dg = Digit<kPass>;
  const int tid = threadIdx.x;
  uint32_t* counters = kPass == 0 ? sh.rep : sh.hist;
  const int n_counters = kPass == 0 ? kSelectBins * 4 : Dg::kBins;
  for (int i = tid; i < n_counters; i += kThreads) counters[i] = 0;
  __syncthreads();
  const uint32_t prefix = sh.t.prefix;
  for (int j0 = 0; j0 < V; j0 += kTile) {
    uint32_t bits[kItems];
    load_score_bits<kThreads, kItems>(c, b, hk, j0, V, bits);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (bits[i] == 0 || !Dg::in_bucket(bits[i], prefix)) continue;
      if constexpr (kPass == 0) atomicAdd(&sh.rep[Dg::of(bits[i]) * 4 + (tid & 3)], 1u);
      else atomicAdd(&sh.hist[Dg::of(bits[i])], 1u);
    }
  }
  __syncthreads();
  if constexpr (kPass == 0)
    for (int bin = tid; bin < kSelectBins; bin += kThreads) {
      const uint4 r = *reinterpret_cast<const uint4*>(&sh.rep[bin * 4]);
      sh.hist[bin] = r.x + r.y + r.z + r.w;
    }
  __syncthreads();
  resolve_digit<kPass, kThreads>(sh.hist, sh.part, uint32_t(sh.t.need), final_pass, sh.t);
  __syncthreads();
}

// The top-w of keys [0, V) into pos/score in position order; returns how many.
__device__ int rebuild(const CacheView& c, Shared& sh, int w, int b, int hk, int V, int* pos, float* score) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) sh.t = RadixThreshold{0u, w, 0, 0}, sh.strict_run = 0, sh.eq_run = 0;
  __syncthreads();
  const bool f32 = c.score_dtype == 1;
  radix_pass<0>(c, sh, b, hk, V, false);
  if (!sh.t.keep_all) radix_pass<1>(c, sh, b, hk, V, !f32);
  if (!sh.t.keep_all && f32) radix_pass<2>(c, sh, b, hk, V, true);
  const bool keep_all = sh.t.keep_all != 0;
  const uint32_t tau = sh.t.prefix;
  const int need = sh.t.need;  // threshold keys to keep, lowest positions first
  // Compaction in position order: a key's slot is the strictly-above keys before it plus the
  // threshold keys before it, the latter capped at need.
  const unsigned below = (1u << lane) - 1;
  for (int j0 = 0; j0 < V; j0 += kTile) {
    uint32_t bits[kItems], strict[kItems], eq[kItems];
    load_score_bits<kThreads, kItems>(c, b, hk, j0, V, bits);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const uint32_t k = bits[i];
      strict[i] = __ballot_sync(0xffffffffu, k != 0 && (keep_all || k > tau));
      eq[i] = __ballot_sync(0xffffffffu, !keep_all && k != 0 && k == tau);
      if (lane == 0) sh.strict_scan[i * kWarps + warp] = __popc(strict[i]), sh.eq_scan[i * kWarps + warp] = __popc(eq[i]);
    }
    __syncthreads();
    if (tid < 32) {  // exclusive scans in (item, warp) order, 8 entries a lane, from the runs
      constexpr int kPer = kItems * kWarps / 32;
      int s_sum = 0, e_sum = 0;
#pragma unroll
      for (int k = 0; k < kPer; ++k) s_sum += sh.strict_scan[lane * kPer + k], e_sum += sh.eq_scan[lane * kPer + k];
      int s_incl = s_sum, e_incl = e_sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int sv = __shfl_up_sync(0xffffffffu, s_incl, off), ev = __shfl_up_sync(0xffffffffu, e_incl, off);
        if (lane >= off) s_incl += sv, e_incl += ev;
      }
      int s_run = sh.strict_run + s_incl - s_sum, e_run = sh.eq_run + e_incl - e_sum;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int sn = sh.strict_scan[lane * kPer + k], en = sh.eq_scan[lane * kPer + k];
        sh.strict_scan[lane * kPer + k] = s_run, sh.eq_scan[lane * kPer + k] = e_run;
        s_run += sn, e_run += en;
      }
      if (lane == 31) sh.tile_strict = s_run, sh.tile_eq = e_run;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const bool is_strict = (strict[i] >> lane) & 1u, is_eq = (eq[i] >> lane) & 1u;
      if (!is_strict && !is_eq) continue;
      const int s_before = sh.strict_scan[i * kWarps + warp] + __popc(strict[i] & below);
      const int e_before = sh.eq_scan[i * kWarps + warp] + __popc(eq[i] & below);
      if (is_eq && e_before >= need) continue;
      const int slot = s_before + min(e_before, need);
      const int j = j0 + i * kThreads + tid;
      pos[slot] = j;
      score[slot] = read_key(c, b, hk, j).score;  // kept keys are few: read again for the value
    }
    __syncthreads();
    if (tid == 0) sh.strict_run = sh.tile_strict, sh.eq_run = sh.tile_eq;
    __syncthreads();
  }
  return sh.strict_run + min(sh.eq_run, need);
}

// The group's worst entry from each thread's own (lowest rank, its index) into
// sh.worst_rank / sh.worst.
__device__ void reduce_worst(Shared& sh, const Group& g, uint64_t best, int arg) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (ob < best) best = ob, arg = oa;
  }
  if (lane == 0) sh.warp_rank[warp] = best, sh.warp_arg[warp] = arg;
  g.sync();
  if (g.tid == 0) {
    uint64_t b = ~uint64_t(0);
    int s = -1;
    for (int k = g.first_warp; k < g.first_warp + g.warps; ++k)
      if (sh.warp_rank[k] < b) b = sh.warp_rank[k], s = sh.warp_arg[k];
    sh.worst_rank[g.index] = b, sh.worst[g.index] = s;
  }
  g.sync();
}

// The set's worst entry (lowest rank) into the group's sh.worst_rank / sh.worst.
__device__ void find_worst(const CacheView& c, Shared& sh, const Group& g, const int* pos, const float* score,
                           int size) {
  uint64_t best = ~uint64_t(0);
  int arg = -1;
  for (int i = g.tid; i < size; i += g.threads) {
    if (pos[i] < 0) continue;  // a gap left by a key that was dropped
    const uint64_t r = rank_of(order_bits(c, score[i]), pos[i]);
    if (r < best) best = r, arg = i;
  }
  reduce_worst(sh, g, best, arg);
}

__device__ __forceinline__ void write_kept(const CacheView& c, KeptKey* list, int slot, int cap, int b, int pos,
                                           float score, int begin, int end) {
  int outer, inner;
  locate(c, b, pos, outer, inner);
  if (slot < cap) list[slot] = KeptKey{pos, outer, uint32_t(begin) | (uint32_t(end) << 16), score};
}

// Where row r of the call stands: its length, the keys before this call's appends, and the
// range of keys its set grows over.
struct RowSpan {
  int b, hk, L, old, first, last;
};

__device__ RowSpan row_span(const StateSelectArgs& a, int row) {
  const CacheView& c = a.cache;
  RowSpan r;
  r.b = row / c.Hk, r.hk = row - r.b * c.Hk;
  r.L = cache_length(c, r.b);
  r.old = max(0, r.L - c.Snew);  // keys that predate this call's appends
  // The set describes [0, first) before keys arrive one by one up to `last`: emitting, what
  // the first query sees, then the rest; refreshing, all of the cache; for a prefix, the keys
  // before the call's queries and no arrivals.
  const bool emit = a.mode == StateMode::emit, prefix = a.mode == StateMode::prefix;
  r.last = prefix ? max(0, r.L - a.Sq) : r.L;
  r.first = prefix || !emit ? r.last : a.causal ? max(0, r.L - a.Sq + 1) : r.L;
  return r;
}

// grid: rows / groups CTAs; the CTA's group j takes row blockIdx.x * groups + j.
__global__ void __launch_bounds__(kThreads, 1) select_state_kernel(StateSelectArgs a, int rows, int groups) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  const int group_threads = kThreads / groups;
  const Group g{int(threadIdx.x) / group_threads, group_threads, int(threadIdx.x) % group_threads,
                int(threadIdx.x) / group_threads * (group_threads / 32), group_threads / 32};
  auto set_of = [&](int j, int*& pos, float*& score, int*& since) {
    const int cap = a.slots + kMaxGrowth;
    pos = reinterpret_cast<int*>(smem + sizeof(Shared)) + size_t(j) * 3 * cap;
    score = reinterpret_cast<float*>(pos + cap);
    since = pos + 2 * cap;
  };
  int *pos, *since;
  float* score;
  set_of(g.index, pos, score, since);
  const CacheView& c = a.cache;
  const int row = blockIdx.x * groups + g.index;
  const bool active = row < rows;
  // The attention may get its CTAs placed: it waits for this kernel before reading the list.
  ptx::griddep_launch_dependents();
  // Until griddep_wait below, only what the call's append (the kernel this one may overlap)
  // never writes is read: lengths, the state, and keys below the state's prefix n <= old.
  const bool emit = a.mode == StateMode::emit, prefix = a.mode == StateMode::prefix;
  const RowSpan r = row_span(a, active ? row : 0);
  const int b = r.b, hk = r.hk, L = r.L, first = r.first, last = r.last;
  int32_t* st = a.state ? a.state + b * a.state_stride[0] + hk * a.state_stride[1] : nullptr;
  int size = 0, grown_from = first;
  // The thread's worst entry of those it reads (its rank, its index), for the set's worst.
  uint64_t best = ~uint64_t(0);
  int best_at = -1;
  // Every group passes the same four barriers up to the CTA-wide rebuild, active or not, so
  // that racecheck can order the rebuild's accesses (docs/hardening.md).
  const int n = active && st ? st[0] : -1;
  const bool usable = active && n >= 0 && n <= r.old && n <= first && last - n <= kMaxGrowth;
  if (g.tid == 0) sh.ok[g.index] = usable;
  g.sync();
  if (usable) {
    size = min(a.w, n);
    // kLoads entries a thread at a time, positions and their scores (the state's copy: the
    // cache's scores sit at scattered positions, a DRAM burst each) all in flight at once.
    // A key counts as present where its page is one of the cache's.
    constexpr int kLoads = 4;
    for (int base = 0; base < size; base += kLoads * g.threads) {
      int p[kLoads], prev[kLoads];
      float sc[kLoads];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * g.threads + g.tid;
        p[k] = i < size ? st[1 + i] : 0;
        prev[k] = i < size && i > 0 ? st[i] : -1;
        sc[k] = i < size ? __int_as_float(st[1 + a.slots + i]) : 0.f;
      }
      KeyRead key[kLoads];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * g.threads + g.tid;
        const bool ordered = i < size && p[k] > prev[k] && p[k] < n;
        int inner;
        key[k] = KeyRead{0u, 0, 0.f};
        if (ordered && locate(c, b, p[k], key[k].outer, inner)) key[k] = KeyRead{order_bits(c, sc[k]), key[k].outer, sc[k]};
      }
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * g.threads + g.tid;
        if (i >= size) continue;
        if (key[k].bits == 0) sh.ok[g.index] = 0;  // out of order or range, or now absent
        pos[i] = p[k], score[i] = key[k].score, since[i] = 0;
        const uint64_t r = rank_of(key[k].bits, p[k]);
        if (r < best) best = r, best_at = i;
      }
    }
    grown_from = n;
  }
  g.sync();
  // The worst kept key of a full set read from the state does not depend on the append:
  // found here (each thread ranked its entries as it read them), it is off the path that
  // waits for the new keys.
  const bool worst_known_early = sh.ok[g.index] && size == a.w && grown_from < last;
  reduce_worst(sh, g, best, best_at);
  bool worst_known = worst_known_early;
  ptx::griddep_wait();  // the appended keys are in place from here
  // Sets that cannot be grown are rebuilt by the whole CTA, one row at a time.
  __syncthreads();
  for (int j = 0; j < groups; ++j) {
    const int rj = blockIdx.x * groups + j;
    if (rj >= rows || sh.ok[j]) continue;
    const RowSpan s = row_span(a, rj);
    int *pj, *since_j;
    float* sj;
    set_of(j, pj, sj, since_j);
    const int n_kept = rebuild(c, sh, a.w, s.b, s.hk, s.first, pj, sj);
    for (int i = threadIdx.x; i < n_kept; i += kThreads) since_j[i] = 0;
    if (threadIdx.x == 0) sh.rebuilt_size[j] = n_kept;
    __syncthreads();
  }
  if (!active) return;
  // Entries [0, unchanged) of a grown set are the state's own, in their places: not written back.
  int unchanged = sh.ok[g.index] ? size : 0;
  if (!sh.ok[g.index]) size = sh.rebuilt_size[g.index], grown_from = first;

  // Keys arrive in position order. Causal, key p is first seen by query p - (L - Sq).
  KeptKey* list = a.list ? a.list + size_t(row) * a.list_cap : nullptr;
  const int off = L - a.Sq;
  // A key that leaves the set becomes a gap (position -1) and the one that takes its place goes
  // to the end (the highest position so far), so the arrays stay in position order without
  // shifting w entries per arrival; the gaps close on the way out.
  int count = size;   // entries, gaps included
  int dropped = 0;    // gaps, in sh.dropped (the same counts in every thread of the group)
  int evicted = 0;    // list entries of keys that left the set
  for (int p = grown_from; p < last; ++p) {
    const KeyRead k = read_key(c, b, hk, p);
    if (k.bits == 0) continue;  // absent: never kept
    const int q0 = a.causal ? max(0, p - off) : 0;
    if (count - dropped < a.w) {
      if (g.tid == 0) pos[count] = p, score[count] = k.score, since[count] = q0;
      ++count;
      g.sync();
      continue;
    }
    if (!worst_known) find_worst(c, sh, g, pos, score, count);
    worst_known = true;
    if (rank_of(k.bits, p) < sh.worst_rank[g.index]) continue;  // never kept by any query: the set stays
    worst_known = false;
    const int x = sh.worst[g.index];
    const bool served = emit && q0 > since[x];  // the evicted key served queries [since, q0)
    g.sync();  // every thread has read since[x]
    if (g.tid == 0) {
      if (served && a.list) write_kept(c, list, evicted, a.list_cap, b, pos[x], score[x], since[x], q0);
      sh.dropped[g.index][dropped] = x;
      pos[x] = -1;
      pos[count] = p, score[count] = k.score, since[count] = q0;
    }
    unchanged = min(unchanged, x);
    evicted += served && a.list;  // never for one query (its only query sees every arrival)
    ++dropped, ++count;
    g.sync();
  }
  size = count - dropped;
  // Entry i's place once the gaps before it close.
  auto place = [&](int i) {
    int before = 0;
    for (int d = 0; d < dropped; ++d) before += sh.dropped[g.index][d] < i;
    return i - before;
  };

  if (prefix) {
    for (int i = g.tid; i < count; i += g.threads)
      if (pos[i] >= 0) a.prefix_pos[size_t(row) * a.slots + place(i)] = pos[i];
    if (g.tid == 0) a.prefix_len[row] = size;
    return;
  }
  if (emit) {
    if (a.list)
      for (int i = g.tid; i < count; i += g.threads)
        if (pos[i] >= 0) write_kept(c, list, evicted + place(i), a.list_cap, b, pos[i], score[i], since[i], a.Sq);
    if (g.tid == 0) a.sel[row].listed = min(evicted + size, a.list_cap);
  }
  // A set short of min(w, L) (keys on pages outside the cache) is not the state of [0, L):
  // a prefix of 0 asks the next call to rebuild rather than trust entries left from before.
  // Most decode steps keep the set as it was, so only the prefix length changes.
  for (int i = unchanged + g.tid; i < count; i += g.threads)
    if (pos[i] >= 0) {
      const int o = place(i);
      st[1 + o] = pos[i], st[1 + a.slots + o] = state_score_bits(score[i]);
    }
  if (g.tid == 0) st[0] = size == min(a.w, L) ? L : 0;
}

// Rows a CTA takes: the fewest that put every row in one wave (one CTA an SM), as far as the
// sets fit in shared memory.
int groups_for(int rows, int slots) {
  const int sms = device_sm_count(), optin = device_smem_optin();
  if (const int forced = forced_state_rows_per_cta(); forced && shared_bytes(slots, forced) <= size_t(optin))
    return forced;
  int groups = 1;
  while (groups < kMaxGroups && (rows + groups - 1) / groups > sms &&
         shared_bytes(slots, 2 * groups) <= size_t(optin))
    groups *= 2;
  return groups;
}

}  // namespace

int select_state_max_slots() {
  const int optin = device_smem_optin();
  return std::max(0, (optin - int(sizeof(Shared))) / 12 - kMaxGrowth);
}

cudaError_t run_select_state(const StateSelectArgs& a, int rows, cudaStream_t stream, bool overlap) {
  const int groups = groups_for(rows, a.slots);
  const size_t smem = shared_bytes(a.slots, groups);
  static std::atomic<int> granted[kMaxDevices] = {};
  if (const cudaError_t err = grant_smem_once(select_state_kernel, int(smem), granted); err != cudaSuccess) return err;
  return launch_kernel(overlap, select_state_kernel, dim3(unsigned((rows + groups - 1) / groups)), dim3(kThreads),
                       smem, stream, a, rows, groups);
}

}  // namespace fdma::cuda
