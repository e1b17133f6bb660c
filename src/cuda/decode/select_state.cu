// The decode selection with a caller-owned state: per (batch, KV head) row, the positions of
// the top-w keys of a prefix [0, n) of the cache, ascending, and their scores (fdma.h,
// select_state).
//
// Scores are fixed per key, so the top-w of a prefix grown by one key is the old set with the
// new key in place of the worst one when it ranks above it. A decode step whose state
// describes the cache up to its new keys therefore reads w scores and the new keys' instead of
// the whole row (the state keeps the w scores beside their positions, so reading them back is
// one contiguous read, not a gather across the cache): one CTA per row holds the set in shared memory, lets the new keys arrive in
// position order (each query's set is the one after its own key arrived), writes the kept
// list with each key's interval of queries, and writes the set back for the next step.
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

#include "cuda/decode/score_bits.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 16;  // keys per thread and tile of the rebuild
constexpr int kTile = kThreads * kItems;
constexpr int kMaxGrowth = 64;  // keys a state may be behind the cache and still be grown

struct Shared {
  uint32_t rep[kSelectBins * 4];  // first-digit counters, 4 replicas (decode_select.cu's reason)
  uint32_t hist[kSelectBins];
  uint32_t part[kThreads];
  int strict_scan[kItems * kWarps], eq_scan[kItems * kWarps];  // per (item, warp), then scanned
  uint64_t warp_rank[kWarps];
  int warp_arg[kWarps];
  int tile_strict, tile_eq, strict_run, eq_run;
  RadixThreshold t;
  int ok;
  uint64_t worst_rank;
  int worst;
};
// Followed by the set: pos[slots], score[slots], since[slots] (its first query).

size_t shared_bytes(int slots) { return sizeof(Shared) + size_t(slots) * 12; }

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

// The set's worst entry (lowest rank) into sh.worst_rank / sh.worst.
__device__ void find_worst(const CacheView& c, Shared& sh, const int* pos, const float* score, int size) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  uint64_t best = ~uint64_t(0);
  int arg = -1;
  for (int i = tid; i < size; i += kThreads) {
    const uint64_t r = rank_of(order_bits(c, score[i]), pos[i]);
    if (r < best) best = r, arg = i;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (ob < best) best = ob, arg = oa;
  }
  if (lane == 0) sh.warp_rank[warp] = best, sh.warp_arg[warp] = arg;
  __syncthreads();
  if (tid == 0) {
    uint64_t b = ~uint64_t(0);
    int s = -1;
    for (int k = 0; k < kWarps; ++k)
      if (sh.warp_rank[k] < b) b = sh.warp_rank[k], s = sh.warp_arg[k];
    sh.worst_rank = b, sh.worst = s;
  }
  __syncthreads();
}

__device__ __forceinline__ void write_kept(const CacheView& c, KeptKey* list, int slot, int cap, int b, int pos,
                                           float score, int begin, int end) {
  int outer, inner;
  locate(c, b, pos, outer, inner);
  if (slot < cap) list[slot] = KeptKey{pos, outer, uint32_t(begin) | (uint32_t(end) << 16), score};
}

__global__ void __launch_bounds__(kThreads, 1) select_state_kernel(StateSelectArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  int* pos = reinterpret_cast<int*>(smem + sizeof(Shared));
  float* score = reinterpret_cast<float*>(pos + a.slots);
  int* since = reinterpret_cast<int*>(score + a.slots);
  const CacheView& c = a.cache;
  const int row = blockIdx.x, b = row / c.Hk, hk = row - b * c.Hk, tid = threadIdx.x;
  // The attention may get its CTAs placed: it waits for this kernel before reading the list.
  ptx::griddep_launch_dependents();
  // Until griddep_wait below, only what the call's append (the kernel this one may overlap)
  // never writes is read: lengths, the state, and keys below the state's prefix n <= old.
  const int L = cache_length(c, b);
  const int old = max(0, L - c.Snew);  // keys that predate this call's appends
  const bool emit = a.mode == StateMode::emit, prefix = a.mode == StateMode::prefix;
  // The set describes [0, first) before keys arrive one by one up to `last`: emitting, what
  // the first query sees, then the rest; refreshing, all of the cache; for a prefix, the keys
  // before the call's queries and no arrivals.
  const int last = prefix ? max(0, L - a.Sq) : L;
  const int first = prefix || !emit ? last : a.causal ? max(0, L - a.Sq + 1) : L;
  int32_t* st = a.state ? a.state + b * a.state_stride[0] + hk * a.state_stride[1] : nullptr;
  const int n = st ? st[0] : -1;
  const bool usable = n >= 0 && n <= old && n <= first && last - n <= kMaxGrowth;
  if (tid == 0) sh.ok = usable;
  __syncthreads();
  int size = 0, grown_from = first;
  if (usable) {
    size = min(a.w, n);
    // kLoads entries a thread at a time, positions and their scores (the state's copy: the
    // cache's scores sit at scattered positions, a DRAM burst each) all in flight at once.
    // A key counts as present where its page is one of the cache's.
    constexpr int kLoads = 4;
    for (int base = 0; base < size; base += kLoads * kThreads) {
      int p[kLoads], prev[kLoads];
      float sc[kLoads];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * kThreads + tid;
        p[k] = i < size ? st[1 + i] : 0;
        prev[k] = i < size && i > 0 ? st[i] : -1;
        sc[k] = i < size ? __int_as_float(st[1 + a.slots + i]) : 0.f;
      }
      KeyRead key[kLoads];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * kThreads + tid;
        const bool ordered = i < size && p[k] > prev[k] && p[k] < n;
        int inner;
        key[k] = KeyRead{0u, 0, 0.f};
        if (ordered && locate(c, b, p[k], key[k].outer, inner)) key[k] = KeyRead{order_bits(c, sc[k]), key[k].outer, sc[k]};
      }
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int i = base + k * kThreads + tid;
        if (i >= size) continue;
        if (key[k].bits == 0) sh.ok = 0;  // out of order or range, or now absent
        pos[i] = p[k], score[i] = key[k].score, since[i] = 0;
      }
    }
    __syncthreads();
    grown_from = n;
  }
  // The worst kept key of a full set read from the state does not depend on the append: found
  // here, it is off the path that waits for the new keys.
  bool worst_known = false;
  if (sh.ok && size == a.w && grown_from < last) {
    find_worst(c, sh, pos, score, size);
    worst_known = true;
  }
  ptx::griddep_wait();  // the appended keys are in place from here
  if (!sh.ok) {
    size = rebuild(c, sh, a.w, b, hk, first, pos, score);
    for (int i = tid; i < size; i += kThreads) since[i] = 0;
    grown_from = first;
  }
  __syncthreads();

  // Keys arrive in position order. Causal, key p is first seen by query p - (L - Sq).
  KeptKey* list = a.list + size_t(row) * a.list_cap;
  const int off = L - a.Sq;
  int evicted = 0;  // list entries of keys that left the set (the same count in every thread)
  for (int p = grown_from; p < last; ++p) {
    const KeyRead k = read_key(c, b, hk, p);
    if (k.bits == 0) continue;  // absent: never kept
    const int q0 = a.causal ? max(0, p - off) : 0;
    if (size < a.w) {
      if (tid == 0) pos[size] = p, score[size] = k.score, since[size] = q0;
      ++size;
      __syncthreads();
      continue;
    }
    if (!worst_known) find_worst(c, sh, pos, score, size);
    worst_known = true;
    if (rank_of(k.bits, p) < sh.worst_rank) continue;  // never kept by any query: the set stays
    worst_known = false;
    const int x = sh.worst;
    if (emit && q0 > since[x]) {  // the evicted key served queries [since, q0)
      if (tid == 0) write_kept(c, list, evicted, a.list_cap, b, pos[x], score[x], since[x], q0);
      ++evicted;
    }
    // Close the gap at x, then append the new key (the highest position so far).
    for (int base = x + 1; base < size; base += kThreads) {
      const int i = base + tid;
      int pv = 0, cv = 0;
      float sv = 0.f;
      if (i < size) pv = pos[i], sv = score[i], cv = since[i];
      __syncthreads();
      if (i < size) pos[i - 1] = pv, score[i - 1] = sv, since[i - 1] = cv;
    }
    __syncthreads();
    if (tid == 0) pos[size - 1] = p, score[size - 1] = k.score, since[size - 1] = q0;
    __syncthreads();
  }

  if (prefix) {
    for (int i = tid; i < size; i += kThreads) a.prefix_pos[size_t(row) * a.slots + i] = pos[i];
    if (tid == 0) a.prefix_len[row] = size;
    return;
  }
  if (emit) {
    for (int i = tid; i < size; i += kThreads)
      write_kept(c, list, evicted + i, a.list_cap, b, pos[i], score[i], since[i], a.Sq);
    if (tid == 0) a.sel[row].listed = min(evicted + size, a.list_cap);
  }
  // A set short of min(w, L) (keys on pages outside the cache) is not the state of [0, L):
  // a prefix of 0 asks the next call to rebuild rather than trust entries left from before.
  for (int i = tid; i < size; i += kThreads) st[1 + i] = pos[i], st[1 + a.slots + i] = state_score_bits(score[i]);
  if (tid == 0) st[0] = size == min(a.w, L) ? L : 0;
}

}  // namespace

int select_state_max_slots() {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] {
    int device = 0, optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return int((size_t(optin) - sizeof(Shared)) / 12);
  });
}

cudaError_t run_select_state(const StateSelectArgs& a, int rows, cudaStream_t stream, bool overlap) {
  const size_t smem = shared_bytes(a.slots);
  static std::atomic<int> granted[kMaxDevices] = {};
  if (const cudaError_t err = grant_smem_once(select_state_kernel, int(smem), granted); err != cudaSuccess) return err;
  return launch_kernel(overlap, select_state_kernel, dim3(unsigned(rows)), dim3(kThreads), smem, stream, a);
}

}  // namespace fdma::cuda
