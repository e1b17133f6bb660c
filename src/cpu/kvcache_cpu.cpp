// Attention against a KV cache on the CPU (docs/decode.md): the reference for the decode path.
//
// Each sequence b is its own problem over the first L_b = cache_seqlens[b] + Snew cached
// keys, with the Sq queries at positions L_b - Sq .. L_b - 1: exactly dynamic_mask_attention
// (or attention) on k_cache[b, :L_b] with Sk = L_b, whose bottom-right causal rule puts the
// queries there. So this file appends the new tokens, views (contiguous) or packs (paged)
// each sequence's cache, and calls those operations' CPU kernels.
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/arena.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/pack.hpp"
#include "cpu/selection.hpp"

namespace fdma::cpu {
namespace {

using detail::KvCacheProblem;

size_t elem(const fdma_tensor& t) { return dtype_size(static_cast<DType>(t.dtype)); }

// t with its data moved by `offset` elements.
fdma_tensor shifted(const fdma_tensor& t, int64_t offset) {
  fdma_tensor v = t;
  v.data = static_cast<char*>(t.data) + offset * int64_t(elem(t));
  return v;
}

// Where position `pos` of sequence b lives: (outer, inner) indices of a cache's first two dims,
// [b, pos] for contiguous caches and [page, slot] for paged ones.
struct Slot {
  int64_t outer, inner;
};
Slot locate(const fdma_kvcache_params& p, const KvCacheProblem& prob, int64_t b, int64_t pos) {
  if (!prob.paged) return {b, pos};
  const auto* table = static_cast<const int32_t*>(p.block_table.data);
  const int64_t page = table[b * p.block_table.stride[0] + (pos / prob.page_size) * p.block_table.stride[1]];
  return {page, pos % prob.page_size};
}

// Element offset of (position, head) in a k/v cache, and of the score of (position, head).
int64_t kv_offset(const fdma_tensor& t, Slot s, int64_t hk) {
  return s.outer * t.stride[0] + s.inner * t.stride[1] + hk * t.stride[2];
}
int64_t score_offset(const fdma_tensor& t, const KvCacheProblem& prob, Slot s, int64_t hk) {
  return prob.paged ? s.outer * t.stride[0] + s.inner * t.stride[1] + hk * t.stride[2]
                    : s.outer * t.stride[0] + hk * t.stride[1] + s.inner * t.stride[2];
}

void copy_elems(void* dst, const void* src, int64_t n, size_t bytes) { std::memcpy(dst, src, size_t(n) * bytes); }

void append(const fdma_kvcache_params& p, const KvCacheProblem& prob) {
  const auto* lens = static_cast<const int32_t*>(p.cache_seqlens.data);
  const detail::Dims& d = prob.dims;
  const size_t eb = elem(p.q);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < prob.Snew; ++t) {
      const Slot s = locate(p, prob, b, lens[b * p.cache_seqlens.stride[0]] + t);
      for (int64_t hk = 0; hk < d.Hk; ++hk) {
        copy_elems(byte_ptr(p.k_cache.data, dtype_of(p.k_cache), kv_offset(p.k_cache, s, hk)),
                   byte_ptr(p.k.data, dtype_of(p.k), bshd_offset(p.k, b, t, hk)), d.D, eb);
        copy_elems(byte_ptr(p.v_cache.data, dtype_of(p.v_cache), kv_offset(p.v_cache, s, hk)),
                   byte_ptr(p.v.data, dtype_of(p.v), bshd_offset(p.v, b, t, hk)), d.D, eb);
        if (prob.dynamic)
          copy_elems(byte_ptr(p.score_cache.data, dtype_of(p.score_cache), score_offset(p.score_cache, prob, s, hk)),
                     byte_ptr(p.scores.data, dtype_of(p.scores), offset3(p.scores, b, hk, t)), 1,
                     elem(p.score_cache));
      }
    }
}

// The per-sequence problems, for Sk keys.
detail::DmaProblem dma_problem(const KvCacheProblem& prob, int64_t Sk) {
  detail::DmaProblem d;
  d.dims = prob.dims;
  d.dims.B = 1;
  d.dims.Sk = Sk;
  d.window = prob.window;
  d.causal = prob.causal;
  d.add_scores = prob.add_scores;
  d.scale = prob.scale;
  d.softcap = prob.softcap;
  d.dtype = prob.dtype;
  d.backend = Backend::cpu;
  return d;
}
detail::AttentionProblem attention_problem(const KvCacheProblem& prob, int64_t Sk) {
  detail::AttentionProblem a;
  a.dims = prob.dims;
  a.dims.B = 1;
  a.dims.Sk = Sk;
  a.causal = prob.causal;
  a.scale = prob.scale;
  a.softcap = prob.softcap;
  a.dtype = prob.dtype;
  a.backend = Backend::cpu;
  return a;
}

// Workspace: packed K, V and scores of one sequence (paged caches only), then the
// per-sequence operation's own workspace at full capacity (its size grows with Sk).
// With a select_state, a row's scores and the selection's scratch follow.
struct KvLayout {
  char *k = nullptr, *v = nullptr, *scores = nullptr, *inner = nullptr;
  size_t inner_bytes = 0;
  double* row = nullptr;
  int32_t *begin = nullptr, *end = nullptr, *heap = nullptr;
  KvLayout(Arena& a, const fdma_kvcache_params& p, const KvCacheProblem& prob) {
    const detail::Dims& d = prob.dims;
    if (prob.paged) {
      k = a.take<char>(d.Sk * d.Hk * d.D * int64_t(elem(p.q)));
      v = a.take<char>(d.Sk * d.Hk * d.D * int64_t(elem(p.q)));
      if (prob.dynamic) scores = a.take<char>(d.Hk * d.Sk * int64_t(elem(p.score_cache)));
    }
    if (prob.state_slots) {
      row = a.take<double>(d.Sk);
      begin = a.take<int32_t>(d.Sk);
      end = a.take<int32_t>(d.Sk);
      heap = a.take<int32_t>(prob.state_slots);
    }
    inner_bytes = prob.dynamic ? dma_workspace(dma_problem(prob, d.Sk), Pass::forward)
                               : attention_workspace(attention_problem(prob, d.Sk), Pass::forward);
    inner = a.take<char>(int64_t(inner_bytes));
  }
};

// [1, L, Hk, D] and [1, Hk, L] views of sequence b's cached keys, values and scores.
struct SequenceViews {
  fdma_tensor k, v, scores;
};

SequenceViews sequence_views(const fdma_kvcache_params& p, const KvCacheProblem& prob, const KvLayout& L, int64_t b,
                             int64_t len) {
  const detail::Dims& d = prob.dims;
  SequenceViews s{};
  if (!prob.paged) {
    s.k = shifted(p.k_cache, b * p.k_cache.stride[0]);
    s.v = shifted(p.v_cache, b * p.v_cache.stride[0]);
    if (prob.dynamic) s.scores = shifted(p.score_cache, b * p.score_cache.stride[0]);
  } else {
    // Gather the pages into packed [L, Hk, D] / [Hk, L] buffers.
    const size_t eb = elem(p.q), sb = prob.dynamic ? elem(p.score_cache) : 0;
    for (int64_t j = 0; j < len; ++j) {
      const Slot sl = locate(p, prob, b, j);
      for (int64_t hk = 0; hk < d.Hk; ++hk) {
        const int64_t row = (j * d.Hk + hk) * d.D;
        copy_elems(L.k + row * eb, byte_ptr(p.k_cache.data, dtype_of(p.k_cache), kv_offset(p.k_cache, sl, hk)), d.D, eb);
        copy_elems(L.v + row * eb, byte_ptr(p.v_cache.data, dtype_of(p.v_cache), kv_offset(p.v_cache, sl, hk)), d.D, eb);
        if (prob.dynamic)
          copy_elems(L.scores + (hk * len + j) * sb,
                     byte_ptr(p.score_cache.data, dtype_of(p.score_cache), score_offset(p.score_cache, prob, sl, hk)), 1,
                     sb);
      }
    }
    s.k = p.k_cache, s.v = p.v_cache;
    s.k.data = L.k, s.v.data = L.v;
    for (fdma_tensor* t : {&s.k, &s.v}) {
      t->stride[0] = len * d.Hk * d.D, t->stride[1] = d.Hk * d.D, t->stride[2] = d.D, t->stride[3] = 1;
    }
    if (prob.dynamic) {
      s.scores = p.score_cache;
      s.scores.data = L.scores;
      s.scores.stride[0] = d.Hk * len, s.scores.stride[1] = len, s.scores.stride[2] = 1;
    }
  }
  s.k.shape[0] = s.v.shape[0] = 1;
  s.k.shape[1] = s.v.shape[1] = len;
  s.k.shape[2] = s.v.shape[2] = d.Hk;
  if (prob.dynamic) s.scores.shape[0] = 1, s.scores.shape[1] = d.Hk, s.scores.shape[2] = len;
  return s;
}

// out = 0, lse = -inf for sequence b (no key in its cache).
void empty_sequence(const fdma_kvcache_params& p, const KvCacheProblem& prob, int64_t b) {
  const detail::Dims& d = prob.dims;
  std::vector<double> zeros(d.D, 0.0);
  for (int64_t i = 0; i < d.Sq; ++i)
    for (int64_t h = 0; h < d.H; ++h) {
      store_bshd_row(p.out, b, i, h, zeros.data());
      if (p.lse.data) store_one(p.lse.data, dtype_of(p.lse), offset3(p.lse, b, h, i), -std::numeric_limits<double>::infinity());
    }
}

// select_state rows of sequence b: [0, len), the positions of its top-min(w, len) keys,
// ascending (the last query's selection when it sees every key), and their scores.
void write_select_state(const fdma_kvcache_params& p, const KvCacheProblem& prob, const KvLayout& L,
                        const SequenceViews& s, int64_t b, int64_t len) {
  const fdma_tensor& st = p.select_state;
  for (int64_t hk = 0; hk < prob.dims.Hk; ++hk) {
    auto* out = static_cast<int32_t*>(st.data) + b * st.stride[0] + hk * st.stride[1];
    out[0] = int32_t(len);
    if (len == 0) continue;
    load_strided(byte_ptr(s.scores.data, dtype_of(s.scores), hk * s.scores.stride[1]), dtype_of(s.scores), len,
                 s.scores.stride[2], L.row);
    select_row<double>(L.row, nullptr, 0, 1, len, prob.window, false, L.begin, L.end, L.heap);
    const int64_t slots = prob.state_slots;
    int64_t n = 0;
    for (int64_t j = 0; j < len; ++j)
      if (L.end[j] == 1) {
        // Exact (the cached dtype widened, then narrowed to float); NaN as one canonical
        // pattern, as the GPU writes it.
        const float score = std::isnan(L.row[j]) ? std::numeric_limits<float>::quiet_NaN() : float(L.row[j]);
        std::memcpy(&out[1 + slots + n], &score, 4);
        out[1 + n++] = int32_t(j);
      }
  }
}

}  // namespace

size_t kvcache_workspace(const fdma_kvcache_params& p, const KvCacheProblem& prob) {
  Arena a;
  KvLayout L(a, p, prob);
  return a.bytes();
}

void kvcache_forward(const fdma_kvcache_params& p, const KvCacheProblem& prob) {
  if (prob.append) append(p, prob);
  Arena arena(p.workspace);
  KvLayout L(arena, p, prob);
  const auto* lens = static_cast<const int32_t*>(p.cache_seqlens.data);
  const detail::Dims& d = prob.dims;
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t len = lens ? lens[b * p.cache_seqlens.stride[0]] + prob.Snew : d.Sk;  // absent: full
    if (len == 0) {
      empty_sequence(p, prob, b);
      if (prob.state_slots)
        for (int64_t hk = 0; hk < d.Hk; ++hk)
          static_cast<int32_t*>(p.select_state.data)[b * p.select_state.stride[0] + hk * p.select_state.stride[1]] = 0;
      continue;
    }
    const SequenceViews s = sequence_views(p, prob, L, b, len);
    if (prob.state_slots) write_select_state(p, prob, L, s, b, len);
    fdma_tensor q = shifted(p.q, b * p.q.stride[0]), out = shifted(p.out, b * p.out.stride[0]), lse{};
    q.shape[0] = out.shape[0] = 1;
    if (p.lse.data) {
      lse = shifted(p.lse, b * p.lse.stride[0]);
      lse.shape[0] = 1;
    }
    if (prob.dynamic) {
      fdma_dma_params dp{};
      dp.q = q, dp.k = s.k, dp.v = s.v, dp.key_scores = s.scores;
      dp.window = prob.window, dp.causal = prob.causal, dp.add_scores = prob.add_scores;
      dp.out = out, dp.lse = lse;
      dp.workspace = L.inner, dp.workspace_bytes = L.inner_bytes;
      dma_forward(dp, dma_problem(prob, len));
    } else {
      fdma_attention_params ap{};
      ap.q = q, ap.k = s.k, ap.v = s.v;
      ap.causal = prob.causal;
      ap.out = out, ap.lse = lse;
      ap.workspace = L.inner, ap.workspace_bytes = L.inner_bytes;
      attention_forward(ap, attention_problem(prob, len));
    }
  }
}

}  // namespace fdma::cpu
