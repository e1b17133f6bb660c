// Attention against a KV cache on the GPU (docs/decode.md): append the new tokens, select each
// (batch, KV head) row's kept keys (decode_select.cu; dynamic mask only), attend over them
// split across CTAs (decode_attention.cuh), merge the splits (decode_combine.cu). Every launch
// is on the caller's stream, reads lengths and pages on the device and sizes its grid from
// shapes alone: no host synchronization and no allocation, so a decode step captures into a
// CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <string>

#include "core/device.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/decode/cache_view.cuh"
#include "cuda/decode/decode_combine.hpp"
#include "cuda/decode/decode_params.hpp"
#include "cuda/decode/decode_select.hpp"
#include "cuda/decode/prefill.hpp"
#include "cuda/decode/select_state.hpp"
#include "cuda/primitives/device_guard.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/attention/kernel_table.hpp"

namespace fdma::cuda {

template <class T, int kHeadDim>
cudaError_t launch_decode_attention(const DecodeAttentionArgs& a, int stages, dim3 grid, cudaStream_t stream,
                                    bool overlap);
template <class T, int kHeadDim>
int decode_attention_ctas_per_sm(int stages);

namespace {

constexpr const char* kOp = "kvcache attention (CUDA)";

[[noreturn]] void unsupported(const std::string& msg) { detail::fail(Status::unsupported, std::string(kOp) + ": " + msg); }

void check(cudaError_t err, const char* what) { cuda::check_cuda(err, std::string(kOp) + ": " + what); }

void check_rows_aligned(const fdma_tensor& t, const char* name) { require_rows_aligned("kvcache attention", t, name); }

void check_inputs(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob) {
  const detail::Dims& d = prob.dims;
  if (prob.dtype != DType::bf16 && prob.dtype != DType::f16)
    unsupported(std::string("q has dtype ") + dtype_name(prob.dtype) + "; the GPU takes float16 or bfloat16");
  if (d.D % 8 != 0) unsupported("head dim D = " + std::to_string(d.D) + " must be a multiple of 8 on the GPU");
  if (d.Sq > 65535) unsupported("at most 65535 queries per call (Sq = " + std::to_string(d.Sq) + ")");
  if (d.B * d.Hk > 65535) unsupported("B * Hk must be <= 65535");
  if ((d.G() * d.Sq + 15) / 16 > 65535) unsupported("(H / Hk) * Sq must be below 2^20");
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.out, "out"}, {&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}})
    check_rows_aligned(*t, name);
  if (prob.append) {
    check_rows_aligned(p.k, "k");
    check_rows_aligned(p.v, "v");
  }
  if (prob.state_slots) {
    const int max_slots = select_state_max_slots();
    if (prob.state_slots > max_slots)
      unsupported("select_state holds min(window, capacity) = " + std::to_string(prob.state_slots) +
                  " positions in shared memory; this GPU fits " + std::to_string(max_slots));
  }
  if (p.workspace) require_device_workspace(kOp, p.workspace);
}

// Blocks in flight per CTA of the decode attention (decode_attention.cuh): three (two CTAs an
// SM) for dense calls, whose rows lie in position order, two (three CTAs an SM) over kept
// lists. Measured both ways on either kind (docs/performance.md, "Attention"): three took 4-5%
// off dense steps and changed kept-list steps by -1% to +2%.
int attention_stages(const detail::KvCacheProblem& prob) {
  if (const int forced = forced_decode_stages()) return forced;
  return prob.dynamic ? 2 : 3;
}

// The attention kernel's CTAs one SM holds (3 at head dim 128 on the H100, 1 at 256).
int attention_ctas_per_sm(const detail::KvCacheProblem& prob, int stages) {
  const bool bf16 = prob.dtype == DType::bf16;
  const int bucket = head_dim_bucket(int(prob.dims.D));
  int n = 0;
#define FDMA_KERNEL(T, IS_BF16, HD) \
  if (!n && bf16 == IS_BF16 && bucket == HD) n = decode_attention_ctas_per_sm<T, HD>(stages);
#include "kernel_list.inc"
#undef FDMA_KERNEL
  return std::max(n, 1);
}

// Splits of each row's keys: the fewest waves of CTAs over the GPU, each as long as it can be.
// A split of `per` 64-key blocks costs about per + 2 blocks (its queries' load, the pipeline's
// fill and drain, the partial's write), and a launch of more CTAs than the SMs hold at once
// runs in waves: the cost is waves * (per + 2). One wave of CTAs that each take a few blocks
// beats more, shorter CTAs (B8 Hk8 w2048: 6 splits of 6 blocks in one wave of 384 CTAs).
int choose_splits(int64_t ctas_per_split, int64_t blocks, int64_t slots) {
  int best = 1;
  double best_cost = 1e300;
  for (int64_t s = 1; s <= std::min<int64_t>(blocks, 512); ++s) {
    const int64_t per = (blocks + s - 1) / s, used = (blocks + per - 1) / per;
    if (used != s) continue;  // the same split count as a smaller s
    const int64_t waves = (ctas_per_split * s + slots - 1) / slots;
    const double cost = double(waves) * double(per + 2);
    if (cost < best_cost) best_cost = cost, best = int(s);
  }
  return best;
}

// Grid and workspace of one call, from shapes alone.
struct Plan {
  int stages, rows, m_tiles, chunks = 0, list_cap = 0, splits, split_keys;
  SelectScratch select{};
  size_t select_bytes = 0, part_out = 0, part_lse = 0, total = 0;
};

Plan plan_of(const detail::KvCacheProblem& prob) {
  const detail::Dims& d = prob.dims;
  Plan pl;
  pl.rows = int(d.B * d.Hk);
  pl.m_tiles = int((d.G() * d.Sq + 15) / 16);
  int64_t n_max = d.Sk;  // keys a row may attend: all cached (dense) or the kept list
  if (prob.dynamic) {
    pl.chunks = int((d.Sk + kSelectChunk - 1) / kSelectChunk);
    pl.list_cap = int(std::min<int64_t>(prob.window, d.Sk) + (prob.causal ? d.Sq - 1 : 0));
    n_max = pl.list_cap;
    pl.select_bytes = decode_select_workspace(pl.rows, pl.chunks, pl.list_cap, &pl.select);
  }
  // FDMA_DECODE_CTAS_PER_SM overrides the CTAs an SM is taken to hold (tuning runs,
  // bench/bench_decode.py --tune).
  pl.stages = attention_stages(prob);
  int64_t per_sm = attention_ctas_per_sm(prob, pl.stages);
  if (const int forced = forced_decode_ctas_per_sm()) per_sm = forced;
  const int64_t blocks = std::max<int64_t>(1, (n_max + 63) / 64);
  const int splits = choose_splits(int64_t(pl.rows) * pl.m_tiles, blocks, per_sm * std::max(device_sm_count(), 1));
  pl.split_keys = int((blocks + splits - 1) / splits * 64);
  pl.splits = splits;
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  size_t off = up(pl.select_bytes);
  if (pl.splits > 1) {
    const size_t qrows = size_t(d.B * d.H * d.Sq);
    pl.part_out = off;
    off += up(qrows * pl.splits * d.D * 4);
    pl.part_lse = off;
    off += up(qrows * pl.splits * 4);
  }
  pl.total = off;
  return pl;
}

CacheView cache_view(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob) {
  const detail::Dims& d = prob.dims;
  CacheView c{};
  c.k = p.k_cache.data, c.v = p.v_cache.data;
  for (int i = 0; i < 3; ++i) c.k_stride[i] = p.k_cache.stride[i], c.v_stride[i] = p.v_cache.stride[i];
  if (prob.dynamic) {
    c.scores = p.score_cache.data;
    c.score_dtype = p.score_cache.dtype;
    const int64_t* s = p.score_cache.stride;
    if (prob.paged)  // [num_pages, page_size, Hk]
      c.score_stride[0] = s[0], c.score_stride[1] = s[1], c.score_stride[2] = s[2];
    else  // [B, Hk, max_len]
      c.score_stride[0] = s[0], c.score_stride[1] = s[2], c.score_stride[2] = s[1];
  }
  c.seqlens = static_cast<const int32_t*>(p.cache_seqlens.data);
  c.seqlens_stride = p.cache_seqlens.stride[0];
  if (prob.paged) {
    c.block_table = static_cast<const int32_t*>(p.block_table.data);
    c.table_stride[0] = p.block_table.stride[0], c.table_stride[1] = p.block_table.stride[1];
    c.page_size = FastDivmod(int(prob.page_size));
    c.num_pages = int(prob.num_pages);
  }
  c.capacity = int(d.Sk);
  c.Snew = int(prob.Snew);
  c.B = int(d.B), c.Hk = int(d.Hk);
  return c;
}

// New tokens into the caches at positions cache_seqlens[b] + t: one CTA per (t, b). Positions
// outside the cache, or on pages that are not the cache's, are skipped.
__global__ void __launch_bounds__(128) append_kernel(CacheView c, const char* k, const char* v, int64_t ks0, int64_t ks1,
                                                     int64_t ks2, int64_t vs0, int64_t vs1, int64_t vs2,
                                                     const char* s, int64_t ss0, int64_t ss1, int64_t ss2,
                                                     int row_bytes, int elem, int score_bytes) {
  ptx::griddep_launch_dependents();  // the selection reads nothing this kernel writes until it waits
  const int t = blockIdx.x, b = blockIdx.y;
  const int64_t pos = int64_t(c.seqlens[b * c.seqlens_stride]) + t;
  if (pos < 0 || pos >= c.capacity) return;
  int outer, inner;
  if (!locate(c, b, int(pos), outer, inner)) return;
  const int chunks = row_bytes / 16;
  char* kc = static_cast<char*>(const_cast<void*>(c.k));
  char* vc = static_cast<char*>(const_cast<void*>(c.v));
  for (int e = threadIdx.x; e < c.Hk * chunks; e += blockDim.x) {
    const int hk = e / chunks, ch = e - hk * chunks;
    const int64_t src_k = (b * ks0 + t * ks1 + hk * ks2) * elem + ch * 16;
    const int64_t src_v = (b * vs0 + t * vs1 + hk * vs2) * elem + ch * 16;
    const int64_t dst_k = (outer * c.k_stride[0] + inner * c.k_stride[1] + hk * c.k_stride[2]) * elem + ch * 16;
    const int64_t dst_v = (outer * c.v_stride[0] + inner * c.v_stride[1] + hk * c.v_stride[2]) * elem + ch * 16;
    *reinterpret_cast<uint4*>(kc + dst_k) = *reinterpret_cast<const uint4*>(k + src_k);
    *reinterpret_cast<uint4*>(vc + dst_v) = *reinterpret_cast<const uint4*>(v + src_v);
  }
  if (s)
    for (int hk = threadIdx.x; hk < c.Hk; hk += blockDim.x) {
      const char* src = s + (b * ss0 + hk * ss1 + t * ss2) * score_bytes;
      char* dst = static_cast<char*>(const_cast<void*>(c.scores)) +
                  (outer * c.score_stride[0] + inner * c.score_stride[1] + hk * c.score_stride[2]) * score_bytes;
      if (score_bytes == 4)
        *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
      else
        *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
    }
}

// dynamic_mask_attention's problem as a KV-cache call over full contiguous caches: k, v
// [B, Sk, Hk, D] and key_scores [B, Hk, Sk] are already that layout, and its bottom-right
// causal rule puts query i at Sk - Sq + i, as the cache call does.
std::pair<fdma_kvcache_params, detail::KvCacheProblem> as_full_cache(const fdma_dma_params& p,
                                                                     const detail::DmaProblem& prob) {
  fdma_kvcache_params k{};
  k.q = p.q, k.k_cache = p.k, k.v_cache = p.v, k.score_cache = p.key_scores;
  k.window = p.window, k.causal = p.causal, k.add_scores = p.add_scores, k.scale = p.scale, k.softcap = p.softcap;
  k.out = p.out, k.lse = p.lse;
  k.backend = FDMA_BACKEND_CUDA, k.stream = p.stream, k.workspace = p.workspace, k.workspace_bytes = p.workspace_bytes;
  detail::KvCacheProblem kp;
  kp.dims = prob.dims;
  kp.dynamic = true, kp.causal = prob.causal, kp.add_scores = prob.add_scores;
  kp.window = prob.window, kp.scale = prob.scale, kp.softcap = prob.softcap;
  kp.dtype = prob.dtype, kp.score_dtype = static_cast<DType>(p.key_scores.dtype);
  kp.backend = Backend::cuda;
  return {k, kp};
}

}  // namespace

bool dma_forward_takes_decode_path(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const detail::Dims& d = prob.dims;
  if (d.Sq > kDecodeMaxQueries || prob.has_padding || prob.has_intervals || p.deterministic || prob.varlen.on)
    return false;
  if (d.D % 8 != 0 || d.B * d.Hk > 65535 || (prob.dtype != DType::bf16 && prob.dtype != DType::f16)) return false;
  return dma_decode_allowed();
}

size_t dma_decode_workspace(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const auto [k, kp] = as_full_cache(p, prob);
  return kvcache_workspace(k, kp);
}

void dma_decode_forward(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const auto [k, kp] = as_full_cache(p, prob);
  kvcache_forward(k, kp);
}

size_t kvcache_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob) {
  check_inputs(p, prob);
  if (kvcache_takes_prefill_path(prob)) return prefill_workspace(p, prob);
  return plan_of(prob).total;
}

void kvcache_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob) {
  check_inputs(p, prob);
  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const detail::Dims& d = prob.dims;
  const CacheView cache = cache_view(p, prob);
  char* ws = static_cast<char*>(p.workspace);

  if (prob.append) {
    const int elem = int(dtype_size(prob.dtype));
    const int score_bytes = prob.dynamic ? int(dtype_size(prob.score_dtype)) : 0;
    append_kernel<<<dim3(unsigned(prob.Snew), unsigned(d.B)), 128, 0, stream>>>(
        cache, static_cast<const char*>(p.k.data), static_cast<const char*>(p.v.data), p.k.stride[0], p.k.stride[1],
        p.k.stride[2], p.v.stride[0], p.v.stride[1], p.v.stride[2],
        prob.dynamic ? static_cast<const char*>(p.scores.data) : nullptr, p.scores.stride[0], p.scores.stride[1],
        p.scores.stride[2], int(d.D) * elem, elem, score_bytes);
    check(cudaGetLastError(), "append");
  }
  if (kvcache_takes_prefill_path(prob)) return prefill_forward(p, prob, cache, stream);
  const Plan pl = plan_of(prob);
  // Each kernel after the call's first is launched overlapping its predecessor (launch.cuh):
  // it gets its CTAs placed and reads what predates the call while that one finishes. About
  // 1 us a launch of a decode step's four.
  const bool overlap = overlap_launches();

  DecodeAttentionArgs a{};
  if (prob.dynamic) {
    DecodeSelectArgs s{};
    s.cache = cache;
    s.Sq = int(d.Sq), s.w = int(std::min<int64_t>(prob.window, int64_t(1) << 30)), s.causal = prob.causal;
    s.chunks = pl.chunks, s.list_cap = pl.list_cap;
    s.max_candidates = int(prob.causal ? std::max<int64_t>(1, d.Sk - d.Sq + 1) : d.Sk);
    s.state = reinterpret_cast<SelectState*>(ws + pl.select.state_offset);
    s.hist = reinterpret_cast<uint32_t*>(ws + pl.select.hist_offset);
    s.eq_count = reinterpret_cast<int32_t*>(ws + pl.select.eq_offset);
    s.list = reinterpret_cast<KeptKey*>(ws + pl.select.list_offset);
    // With a state, decode steps grow it (select_state.cu); longer calls select as without
    // one, then bring it up to date.
    StateSelectArgs g{};
    if (prob.state_slots) {
      g.cache = cache;
      g.Sq = s.Sq, g.w = s.w, g.slots = int(prob.state_slots), g.causal = s.causal;
      g.mode = d.Sq <= kStateMaxQueries ? StateMode::emit : StateMode::refresh;
      g.state = static_cast<int32_t*>(p.select_state.data);
      g.state_stride[0] = p.select_state.stride[0], g.state_stride[1] = p.select_state.stride[1];
      g.list_cap = pl.list_cap, g.sel = s.state;
    }
    // One query keeps every key of the grown set: the attention reads the state itself.
    const bool state_is_list = prob.state_slots && g.mode == StateMode::emit && d.Sq == 1;
    g.list = state_is_list ? nullptr : s.list;
    if (prob.state_slots && g.mode == StateMode::emit) {
      check(run_select_state(g, pl.rows, stream, overlap && prob.append), "selection");
    } else {
      check(run_decode_select(s, pl.rows, ws, pl.select.zeroed_bytes, stream), "selection");
      if (prob.state_slots) check(run_select_state(g, pl.rows, stream), "select_state update");
    }
    a.list = state_is_list ? nullptr : s.list;
    if (state_is_list) {
      a.kept_state = g.state;
      a.kept_state_stride[0] = g.state_stride[0], a.kept_state_stride[1] = g.state_stride[1];
      a.kept_state_slots = g.slots;
    }
    a.state = s.state;
    a.list_cap = pl.list_cap;
  }
  a.cache = cache;
  a.q = p.q.data;
  for (int i = 0; i < 3; ++i) a.q_stride[i] = p.q.stride[i], a.out_stride[i] = p.out.stride[i];
  a.out = p.out.data;
  if (p.lse.data) {
    a.lse = static_cast<float*>(p.lse.data);
    for (int i = 0; i < 3; ++i) a.lse_stride[i] = p.lse.stride[i];
  }
  a.Sq = int(d.Sq), a.H = int(d.H), a.G = int(d.G()), a.D = int(d.D);
  a.causal = prob.causal, a.add_scores = prob.dynamic && prob.add_scores;
  a.scale = float(prob.scale), a.softcap = float(prob.softcap);
  a.splits = pl.splits, a.split_keys = pl.split_keys;
  if (pl.splits > 1) {
    a.part_out = reinterpret_cast<float*>(ws + pl.part_out);
    a.part_lse = reinterpret_cast<float*>(ws + pl.part_lse);
  }

  const bool bf16 = prob.dtype == DType::bf16;
  const int bucket = head_dim_bucket(int(d.D));
  const dim3 grid(unsigned(pl.splits), unsigned(pl.rows), unsigned(pl.m_tiles));
  cudaError_t err = cudaErrorInvalidValue;
  bool launched = false;
#define FDMA_KERNEL(T, IS_BF16, HD)                       \
  if (!launched && bf16 == IS_BF16 && bucket == HD) {     \
    err = launch_decode_attention<T, HD>(a, pl.stages, grid, stream, overlap && (prob.append || prob.dynamic)); \
    launched = true;                                      \
  }
#include "kernel_list.inc"
#undef FDMA_KERNEL
  if (!launched) unsupported("no kernel compiled for head dim " + std::to_string(d.D));
  check(err, "attention");
  if (pl.splits > 1) check(run_decode_combine(a, int(d.B * d.H * d.Sq), bf16, stream, overlap), "split merge");
}

}  // namespace fdma::cuda
