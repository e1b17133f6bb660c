// One KV-cache attention problem (decode, speculative decode or chunked prefill): random
// caches filled past every sequence's length (what lies there must never be read), ragged
// lengths, optionally paged with shuffled pages and appended new tokens; the float64
// reference runs each sequence as dynamic_mask_attention (or attention) over its first L_b
// keys, with brute-force selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "host_tensor.hpp"
#include "reference.hpp"
#include "test_util.hpp"

namespace fdma::test {

struct KvCase {
  int64_t B = 2, Sq = 1, H = 4, Hk = 2, D = 16, w = 8;
  int64_t max_len = 100;    // contiguous capacity; paged: pages of page_size, max_pages per sequence
  int64_t page_size = 0;    // 0 = contiguous cache
  int64_t Snew = 0;         // appended tokens
  std::vector<int64_t> lens;  // per sequence, before the append (default: random)
  bool dynamic = true, causal = true, add_scores = true, ties = false, nan_scores = false;
  bool state = false;  // pass a select_state (zeroed unless the test writes it)
  double softcap = 0;
  double score_shift = 0;  // added to every score: -3e38 makes every key's term a sentinel (ties in f32)
  DType dtype = DType::f32, score_dtype = DType::f32;
  uint64_t seed = 1;
  std::string str() const {
    std::ostringstream os;
    os << "B" << B << " Sq" << Sq << " H" << H << " Hk" << Hk << " D" << D << " w" << w << " max_len" << max_len
       << " page" << page_size << " Snew" << Snew << " dynamic" << dynamic << " causal" << causal << " add"
       << add_scores << " ties" << ties << " nan" << nan_scores << " softcap" << softcap << " shift" << score_shift
       << " state" << state << " "
       << dtype_name(dtype) << "/" << dtype_name(score_dtype) << " lens";
    for (auto l : lens) os << " " << l;
    return os.str();
  }
};

struct KvRun {
  KvCase c;
  int64_t max_pages = 0, num_pages = 0;
  // Logical caches [B, max_len, Hk, D] / [B, Hk, max_len], then the tensors handed to the call.
  HostTensor lk, lv, ls;
  HostTensor q, k_cache, v_cache, score_cache, seqlens, table, k_new, v_new, s_new, out, lse, state;
  std::vector<int32_t> page_of;  // [B * max_pages]

  explicit KvRun(const KvCase& cs) : c(cs) {
    std::mt19937_64 rng(c.seed);
    if (c.lens.empty()) {
      std::uniform_int_distribution<int64_t> len(0, c.max_len - c.Snew);
      for (int64_t b = 0; b < c.B; ++b) c.lens.push_back(len(rng));
    }
    lk = HostTensor(c.dtype, {c.B, c.max_len, c.Hk, c.D});
    lv = HostTensor(c.dtype, {c.B, c.max_len, c.Hk, c.D});
    ls = HostTensor(c.score_dtype, {c.B, c.Hk, c.max_len});
    lk.fill_uniform(rng, -1.5, 1.5);
    lv.fill_uniform(rng, -1, 1);
    for (int64_t i = 0; i < ls.numel(); ++i) {
      const double x = draw_score(rng);  // drawn for NaN elements too: the same draws either way
      ls.set(i, c.nan_scores && i % 7 == 3 ? std::nan("") : x);
    }
    q = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D});
    q.fill_uniform(rng, -1.5, 1.5);
    if (c.Snew) {
      k_new = HostTensor(c.dtype, {c.B, c.Snew, c.Hk, c.D});
      v_new = HostTensor(c.dtype, {c.B, c.Snew, c.Hk, c.D});
      s_new = HostTensor(c.score_dtype, {c.B, c.Hk, c.Snew});
      k_new.fill_uniform(rng, -1.5, 1.5);
      v_new.fill_uniform(rng, -1, 1);
      for (int64_t i = 0; i < s_new.numel(); ++i) s_new.set(i, draw_score(rng));
    }
    seqlens = HostTensor(DType::i32, {c.B});
    for (int64_t b = 0; b < c.B; ++b) seqlens.set(b, double(c.lens[b]));
    if (c.page_size) {
      max_pages = (c.max_len + c.page_size - 1) / c.page_size;
      num_pages = c.B * max_pages + 3;  // spare pages nobody uses
      std::vector<int32_t> pages(num_pages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      page_of.assign(pages.begin(), pages.begin() + c.B * max_pages);
      table = HostTensor(DType::i32, {c.B, max_pages});
      for (int64_t i = 0; i < c.B * max_pages; ++i) table.set(i, page_of[i]);
      k_cache = HostTensor(c.dtype, {num_pages, c.page_size, c.Hk, c.D});
      v_cache = HostTensor(c.dtype, {num_pages, c.page_size, c.Hk, c.D});
      score_cache = HostTensor(c.score_dtype, {num_pages, c.page_size, c.Hk});
      for (HostTensor* t : {&k_cache, &v_cache, &score_cache}) t->fill_uniform(rng, -3, 3);  // spare pages
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t j = 0; j < max_pages * c.page_size; ++j) {
          if (j >= c.max_len) continue;
          const int64_t page = page_of[b * max_pages + j / c.page_size], slot = j % c.page_size;
          for (int64_t hk = 0; hk < c.Hk; ++hk) {
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t dst = ((page * c.page_size + slot) * c.Hk + hk) * c.D + d;
              const int64_t src = ((b * c.max_len + j) * c.Hk + hk) * c.D + d;
              k_cache.set(dst, lk.get(src));
              v_cache.set(dst, lv.get(src));
            }
            score_cache.set((page * c.page_size + slot) * c.Hk + hk, ls.get((b * c.Hk + hk) * c.max_len + j));
          }
        }
    } else {
      k_cache = lk, v_cache = lv, score_cache = ls;
    }
    out = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D});
    lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {c.B, c.H, c.Sq});
    if (c.state) {
      state = HostTensor(DType::i32, {c.B, c.Hk, 1 + 2 * std::min(c.w, capacity())});
      for (int64_t i = 0; i < state.numel(); ++i) state.set(i, 0);
    }
  }

  // One key score: uniform in [-2, 2] (halves with ties), plus the case's shift.
  double draw_score(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(-2, 2);
    return (c.ties ? std::round(u(rng) * 2) / 2 : u(rng)) + c.score_shift;
  }

  // New tokens and queries for the next step of a generation loop (after advance()).
  void next_tokens(uint64_t seed) {
    std::mt19937_64 rng(seed);
    q.fill_uniform(rng, -1.5, 1.5);
    k_new.fill_uniform(rng, -1.5, 1.5);
    v_new.fill_uniform(rng, -1, 1);
    for (int64_t i = 0; i < s_new.numel(); ++i) s_new.set(i, draw_score(rng));
  }
  // The next calls take n queries and append n tokens (a prompt's chunks, then decode
  // steps); next_tokens fills them.
  void resize_step(int64_t n) {
    c.Sq = c.Snew = n;
    q = HostTensor(c.dtype, {c.B, n, c.H, c.D});
    k_new = HostTensor(c.dtype, {c.B, n, c.Hk, c.D});
    v_new = HostTensor(c.dtype, {c.B, n, c.Hk, c.D});
    s_new = HostTensor(c.score_dtype, {c.B, c.Hk, n});
    out = HostTensor(c.dtype, {c.B, n, c.H, c.D});
    lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {c.B, c.H, n});
  }
  // cache_seqlens past this call's appends (the caller's part of a decode step).
  void advance() {
    for (int64_t b = 0; b < c.B; ++b) {
      c.lens[b] += c.Snew;
      seqlens.set(b, double(c.lens[b]));
    }
  }

  // Row (b, hk) of a select_state: its prefix, its positions and their scores.
  std::vector<int32_t> state_row(int64_t b, int64_t hk) const {
    const int64_t n = state.shape()[2];
    std::vector<int32_t> r;
    for (int64_t i = 0; i < n; ++i) r.push_back(int32_t(state.get((b * c.Hk + hk) * n + i)));
    return r;
  }

  int64_t capacity() const { return c.page_size ? max_pages * c.page_size : c.max_len; }

  KvCacheParams params() const {
    KvCacheParams p;
    p.q = q.view();
    p.k_cache = k_cache.view(), p.v_cache = v_cache.view();
    if (c.dynamic) p.score_cache = score_cache.view(), p.window = c.w;
    p.cache_seqlens = seqlens.view();
    if (c.page_size) p.block_table = table.view();
    if (c.Snew) {
      p.k = k_new.view(), p.v = v_new.view();
      if (c.dynamic) p.scores = s_new.view();
    }
    p.causal = c.causal, p.add_scores = c.add_scores, p.softcap = c.softcap;
    p.out = out.view(), p.lse = lse.view();
    if (c.state) p.select_state = state.view();
    return p;
  }

  void run_cpu() {
    out.poison();
    lse.poison();
    KvCacheParams p = params();
    std::vector<unsigned char> ws(kvcache_workspace_size(p));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    kvcache_forward(p);
  }

  // The logical caches after the append.
  void append_reference() {
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.Snew; ++t) {
        const int64_t j = c.lens[b] + t;
        for (int64_t hk = 0; hk < c.Hk; ++hk) {
          for (int64_t d = 0; d < c.D; ++d) {
            const int64_t src = ((b * c.Snew + t) * c.Hk + hk) * c.D + d;
            lk.set(((b * c.max_len + j) * c.Hk + hk) * c.D + d, k_new.get(src));
            lv.set(((b * c.max_len + j) * c.Hk + hk) * c.D + d, v_new.get(src));
          }
          ls.set((b * c.Hk + hk) * c.max_len + j, s_new.get((b * c.Hk + hk) * c.Snew + t));
        }
      }
  }

  // What select_state's row (b, hk) must hold after the call (call append_reference first
  // when appending): L and the positions of the top-min(w, L) of keys [0, L), ascending.
  std::vector<int32_t> expected_state_row(int64_t b, int64_t hk) const {
    const int64_t L = c.lens[b] + c.Snew;
    std::vector<int32_t> r = state_row(b, hk);  // entries past the kept ones are not written
    r[0] = int32_t(L);
    if (L == 0) return r;
    std::vector<double> sc;
    for (int64_t j = 0; j < L; ++j) sc.push_back(ls.get((b * c.Hk + hk) * c.max_len + j));
    const auto keep = ref::select_ranked(sc, {}, 1, 1, 1, L, c.w, false);
    const int64_t slots = (int64_t(r.size()) - 1) / 2;
    int64_t n = 0;
    for (int64_t j = 0; j < L; ++j)
      if (keep[j]) {
        // The score's float bits (NaN canonical), after the positions.
        const float s = std::isnan(sc[j]) ? std::numeric_limits<float>::quiet_NaN() : float(sc[j]);
        std::memcpy(&r[1 + slots + n], &s, 4);
        r[1 + n++] = int32_t(j);
      }
    return r;
  }

  // Float64 out [B, Sq, H, D] and lse [B, H, Sq] (call append_reference first when appending).
  std::pair<std::vector<double>, std::vector<double>> reference() const {
    std::vector<double> ref_out(c.B * c.Sq * c.H * c.D, 0.0), ref_lse(c.B * c.H * c.Sq, -INFINITY);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t L = c.lens[b] + c.Snew;
      if (L == 0) continue;
      ref::Problem rp;
      rp.B = 1, rp.Sq = c.Sq, rp.Sk = L, rp.H = c.H, rp.Hk = c.Hk, rp.D = c.D;
      rp.scale = 1.0 / std::sqrt(double(c.D));
      rp.softcap = c.softcap;
      for (int64_t i = 0; i < c.Sq * c.H * c.D; ++i) rp.q.push_back(q.get(b * c.Sq * c.H * c.D + i));
      for (int64_t i = 0; i < L * c.Hk * c.D; ++i) {
        rp.k.push_back(lk.get(b * c.max_len * c.Hk * c.D + i));
        rp.v.push_back(lv.get(b * c.max_len * c.Hk * c.D + i));
      }
      if (c.dynamic) {
        std::vector<double> sc;
        for (int64_t hk = 0; hk < c.Hk; ++hk)
          for (int64_t j = 0; j < L; ++j) sc.push_back(ls.get((b * c.Hk + hk) * c.max_len + j));
        auto keep = ref::select_ranked(sc, {}, 1, c.Hk, c.Sq, L, c.w, c.causal);
        const int64_t G = c.H / c.Hk;
        rp.keep.assign(c.H * c.Sq * L, 0);
        rp.bias.assign(c.H * c.Sq * L, 0.0);
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t i = 0; i < c.Sq; ++i)
            for (int64_t j = 0; j < L; ++j) {
              rp.keep[(h * c.Sq + i) * L + j] = keep[((h / G) * c.Sq + i) * L + j];
              if (c.add_scores) rp.bias[(h * c.Sq + i) * L + j] = sc[(h / G) * L + j];
            }
      } else {
        rp.causal = c.causal;
      }
      auto f = ref::forward(rp);
      std::copy(f.out.begin(), f.out.end(), ref_out.begin() + b * c.Sq * c.H * c.D);
      std::copy(f.lse.begin(), f.lse.end(), ref_lse.begin() + b * c.H * c.Sq);
    }
    return {ref_out, ref_lse};
  }
};

}  // namespace fdma::test
