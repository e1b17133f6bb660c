// Chunked prefill: Sq queries at positions n .. n + Sq - 1 of a cache whose first n keys are
// already there (n = L - Sq per sequence).
//
// With scores fixed per key, the top-w of [0, n + i] lies within P ∪ [n, n + i], where P is
// the top-w of [0, n): a key of [0, n) outside P has w keys of P ranked above it. So each
// (batch, KV head) row needs only V = min(w, capacity) + Sq keys: P, right-aligned into the
// first min(w, capacity) slots in position order (the slots before it padding), then the
// chunk's Sq keys. Query i sits at slot V - Sq + i, the bottom-right causal place, and sees
// exactly P and the chunk's keys up to its own; since the slots keep position order, ties
// still go to the lower position. The training forward (select_topw, key lists, the
// gathered attention kernels) runs on that compact copy: its speed for the same kept pairs,
// plus one selection over [0, n) per row (grown from a select_state when one is kept) and a
// copy of V rows per row.
//
// Non-causal, every query keeps P, the top-w of the whole cache: the compact problem is P
// alone (V = min(w, capacity)) and the training forward's non-causal path runs on it.
//
// The state afterwards is the last query's kept set, read from the training selection's
// per-key query intervals: no second selection over the cache.
#include "cuda/decode/prefill.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/decode/cache_view.cuh"
#include "cuda/decode/select_state.hpp"
#include "cuda/primitives/device_guard.hpp"

namespace fdma::cuda {
namespace {

constexpr const char* kOp = "kvcache attention (CUDA)";

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// The compact problem: its dynamic_mask_attention params over workspace buffers, and where
// each buffer sits in the call's workspace.
struct Compact {
  int slots, V, rows;
  size_t prefix_pos, prefix_len, k, v, scores, padding, begin, end, dma, total;
  fdma_dma_params p{};
  detail::DmaProblem prob;
};

// ws null: sizes only.
Compact compact_of(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob, char* ws) {
  const detail::Dims& d = prob.dims;
  Compact c;
  c.slots = int(std::min<int64_t>(prob.window, d.Sk));
  c.V = int(c.slots + (prob.causal ? d.Sq : 0));  // non-causal: every query sees P, the top-w of the cache
  c.rows = int(d.B * d.Hk);
  const size_t elem = dtype_size(prob.dtype), score_bytes = dtype_size(prob.score_dtype);
  const size_t kv_bytes = size_t(d.B) * c.V * d.Hk * d.D * elem;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  c.prefix_pos = take(size_t(c.rows) * c.slots * 4);
  c.prefix_len = take(size_t(c.rows) * 4);
  c.k = take(kv_bytes);
  c.v = take(kv_bytes);
  c.scores = take(size_t(c.rows) * c.V * score_bytes);
  c.padding = take(size_t(d.B) * c.V);
  c.begin = take(size_t(c.rows) * c.V * 4);
  c.end = take(size_t(c.rows) * c.V * 4);
  c.dma = off;
  auto at = [&](size_t o) -> void* { return ws ? ws + o : nullptr; };

  fdma_dma_params& q = c.p;  // contiguous views of the workspace buffers (fdma::Tensor)
  q.q = p.q, q.out = p.out, q.lse = p.lse;
  q.k = Tensor(at(c.k), prob.dtype, {d.B, c.V, d.Hk, d.D});
  q.v = Tensor(at(c.v), prob.dtype, {d.B, c.V, d.Hk, d.D});
  q.key_scores = Tensor(at(c.scores), prob.score_dtype, {d.B, d.Hk, c.V});
  q.key_padding = Tensor(at(c.padding), DType::boolean, {d.B, c.V});
  q.keep_begin = Tensor(at(c.begin), DType::i32, {d.B, d.Hk, c.V});
  q.keep_end = Tensor(at(c.end), DType::i32, {d.B, d.Hk, c.V});
  q.window = p.window, q.causal = prob.causal, q.add_scores = p.add_scores, q.scale = prob.scale, q.softcap = prob.softcap;
  q.backend = FDMA_BACKEND_CUDA, q.stream = p.stream;
  detail::DmaProblem& r = c.prob;
  r.dims = d;
  r.dims.Sk = c.V;
  r.window = prob.window, r.causal = prob.causal, r.add_scores = prob.add_scores, r.has_padding = true;
  r.has_intervals = true;  // the forward writes them into c.begin / c.end
  r.scale = prob.scale, r.softcap = prob.softcap, r.dtype = prob.dtype, r.backend = Backend::cuda;
  const size_t dma_bytes = dma_workspace(q, r, Pass::forward);
  q.workspace = at(c.dma), q.workspace_bytes = dma_bytes;
  c.total = c.dma + dma_bytes;
  return c;
}

struct GatherArgs {
  CacheView cache;
  int Sq, slots, V;
  const int32_t* prefix_pos;  // [rows][slots]
  const int32_t* prefix_len;  // [rows]
  char *k, *v, *scores;       // [B, V, Hk, D], [B, V, Hk, D], [B, Hk, V]
  uint8_t* padding;           // [B, V]
  int row_bytes, elem, score_bytes;
};

// The cache position behind compact slot s of row (b, hk), -1 for padding.
__device__ __forceinline__ int slot_position(const int32_t* prefix_pos, const int32_t* prefix_len, int slots, int row,
                                             int s, int n) {
  if (s >= slots) return n + (s - slots);  // the chunk (negative before position 0)
  const int i = s - (slots - prefix_len[row]);
  return i >= 0 ? prefix_pos[size_t(row) * slots + i] : -1;
}

// One CTA per (slot, batch), a warp per KV head: its K and V rows (16 bytes a lane), score
// and (head 0) the slot's padding flag. Padding slots get zero rows.
__global__ void __launch_bounds__(128) gather_compact_kernel(GatherArgs g) {
  const CacheView& c = g.cache;
  const int s = blockIdx.x, b = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int L = cache_length(c, b), n = L - g.Sq;
  const int chunks = g.row_bytes / 16;
  for (int hk = warp; hk < c.Hk; hk += blockDim.x / 32) {
    const int row = b * c.Hk + hk;
    const int pos = slot_position(g.prefix_pos, g.prefix_len, g.slots, row, s, n);
    int outer = 0, inner = 0;
    const bool valid = pos >= 0 && pos < L && locate(c, b, pos, outer, inner);
    const int64_t dst = ((int64_t(b) * g.V + s) * c.Hk + hk) * g.row_bytes;
    for (int ch = lane; ch < chunks; ch += 32) {
      uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
      if (valid) {
        const char* kc = static_cast<const char*>(c.k);
        const char* vc = static_cast<const char*>(c.v);
        kx = *reinterpret_cast<const uint4*>(
            kc + (outer * c.k_stride[0] + inner * c.k_stride[1] + hk * c.k_stride[2]) * g.elem + ch * 16);
        vx = *reinterpret_cast<const uint4*>(
            vc + (outer * c.v_stride[0] + inner * c.v_stride[1] + hk * c.v_stride[2]) * g.elem + ch * 16);
      }
      *reinterpret_cast<uint4*>(g.k + dst + ch * 16) = kx;
      *reinterpret_cast<uint4*>(g.v + dst + ch * 16) = vx;
    }
    if (lane == 0) {
      char* to = g.scores + (int64_t(row) * g.V + s) * g.score_bytes;
      const char* from = static_cast<const char*>(c.scores) +
                         (outer * c.score_stride[0] + inner * c.score_stride[1] + hk * c.score_stride[2]) * g.score_bytes;
      if (g.score_bytes == 4) *reinterpret_cast<uint32_t*>(to) = valid ? *reinterpret_cast<const uint32_t*>(from) : 0u;
      else *reinterpret_cast<uint16_t*>(to) = valid ? *reinterpret_cast<const uint16_t*>(from) : uint16_t(0);
      // Absent positions are the same for every head, so head 0 speaks for the slot.
      if (hk == 0) g.padding[int64_t(b) * g.V + s] = valid;
    }
  }
}

struct StateArgs {
  CacheView cache;
  int Sq, slots, V, w;
  const int32_t* prefix_pos;
  const int32_t* prefix_len;
  const int32_t* begin;  // [rows][V]: queries [begin, end) keep the slot
  const int32_t* end;
  const char* scores;  // [rows][V], the compact problem's (score_dtype)
  int score_dtype;
  int32_t* state;
  int64_t state_stride[2];
};

// One CTA per row: the slots the last query keeps, in slot (= position) order, become the
// row's state, which then describes [0, L).
__global__ void __launch_bounds__(256) state_from_intervals_kernel(StateArgs a) {
  __shared__ int warp_count[8];
  __shared__ int run;
  const CacheView& c = a.cache;
  const int row = blockIdx.x, b = row / c.Hk, hk = row - b * c.Hk;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int L = cache_length(c, b), n = L - a.Sq, last = a.Sq - 1;
  int32_t* st = a.state + b * a.state_stride[0] + hk * a.state_stride[1];
  if (tid == 0) run = 0;
  __syncthreads();
  for (int s0 = 0; s0 < a.V; s0 += blockDim.x) {
    const int s = s0 + tid;
    const int64_t at = int64_t(row) * a.V + s;
    const bool kept = s < a.V && a.begin[at] <= last && a.end[at] > last;
    const unsigned ballot = __ballot_sync(0xffffffffu, kept);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = run;
    for (int k = 0; k < warp; ++k) before += warp_count[k];
    before += __popc(ballot & ((1u << lane) - 1));
    if (kept && before < a.slots) {
      st[1 + before] = slot_position(a.prefix_pos, a.prefix_len, a.slots, row, s, n);
      st[1 + a.slots + before] = state_score_bits(load_score(a.scores, a.score_dtype, at));
    }
    __syncthreads();
    if (tid == 0)
      for (int k = 0; k < 8; ++k) run += warp_count[k];
    __syncthreads();
  }
  // As select_state.cu: a set short of min(w, L) (absent keys) asks the next call to rebuild.
  if (tid == 0) st[0] = run == min(a.w, L) ? L : 0;
}

}  // namespace

bool kvcache_takes_prefill_path(const detail::KvCacheProblem& prob) {
  const detail::Dims& d = prob.dims;
  if (!prob.dynamic || d.D > 256) return false;
  if (d.Sq < (prob.causal ? kPrefillMinQueriesCausal : kPrefillMinQueriesNonCausal)) return false;
  const int64_t slots = std::min<int64_t>(prob.window, d.Sk);
  return slots <= select_state_max_slots() && d.B * d.Hk * (slots + d.Sq) < (int64_t(1) << 31) && d.B <= 65535 &&
         d.H <= 65535;
}

size_t prefill_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob) {
  return compact_of(p, prob, nullptr).total;
}

void prefill_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob, const CacheView& cache,
                     cudaStream_t stream) {
  const detail::Dims& d = prob.dims;
  char* ws = static_cast<char*>(p.workspace);
  const Compact c = compact_of(p, prob, ws);
  auto* prefix_pos = reinterpret_cast<int32_t*>(ws + c.prefix_pos);
  auto* prefix_len = reinterpret_cast<int32_t*>(ws + c.prefix_len);
  const int w = int(std::min<int64_t>(prob.window, int64_t(1) << 30));

  // P per row: grown from the caller's state where it describes a prefix close enough,
  // else a radix select over [0, n) in the row's CTA.
  StateSelectArgs g{};
  g.cache = cache;
  g.Sq = prob.causal ? int(d.Sq) : 0, g.w = w, g.slots = c.slots, g.causal = prob.causal;  // P of [0, L - g.Sq)
  g.mode = StateMode::prefix;
  if (prob.state_slots) {
    g.state = static_cast<int32_t*>(p.select_state.data);
    g.state_stride[0] = p.select_state.stride[0], g.state_stride[1] = p.select_state.stride[1];
  }
  g.prefix_pos = prefix_pos, g.prefix_len = prefix_len;
  check_cuda(run_select_state(g, c.rows, stream), std::string(kOp) + ": prefix selection");

  GatherArgs ga{};
  ga.cache = cache;
  ga.Sq = int(d.Sq), ga.slots = c.slots, ga.V = c.V;
  ga.prefix_pos = prefix_pos, ga.prefix_len = prefix_len;
  ga.k = ws + c.k, ga.v = ws + c.v, ga.scores = ws + c.scores;
  ga.padding = reinterpret_cast<uint8_t*>(ws + c.padding);
  ga.elem = int(dtype_size(prob.dtype));
  ga.row_bytes = int(d.D) * ga.elem;
  ga.score_bytes = int(dtype_size(prob.score_dtype));
  gather_compact_kernel<<<dim3(unsigned(c.V), unsigned(d.B)), 128, 0, stream>>>(ga);
  check_cuda(cudaGetLastError(), std::string(kOp) + ": compact copy");

  dma_forward(c.p, c.prob);

  if (prob.state_slots) {
    StateArgs sa{};
    sa.cache = cache;
    sa.Sq = int(d.Sq), sa.slots = c.slots, sa.V = c.V, sa.w = w;
    sa.prefix_pos = prefix_pos, sa.prefix_len = prefix_len;
    sa.begin = reinterpret_cast<const int32_t*>(ws + c.begin);
    sa.end = reinterpret_cast<const int32_t*>(ws + c.end);
    sa.scores = ws + c.scores;
    sa.score_dtype = p.score_cache.dtype;
    sa.state = g.state;
    sa.state_stride[0] = g.state_stride[0], sa.state_stride[1] = g.state_stride[1];
    state_from_intervals_kernel<<<c.rows, 256, 0, stream>>>(sa);
    check_cuda(cudaGetLastError(), std::string(kOp) + ": select_state update");
  }
}

}  // namespace fdma::cuda
