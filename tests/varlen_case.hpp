// One packed variable-length batch (fdma.h, "varlen") run through the C++ API, checked against
// the float64 reference on the packed batch as one problem: total_q queries against total_k
// keys with a block-diagonal keep-mask (a query sees its own sequence's keys: per sequence
// bottom-right causal, and the top-w of that sequence's scores for dynamic_mask_attention).
// The reference never splits the batch, so it checks the library's per-sequence windows.
#pragma once

#include <random>
#include <sstream>
#include <string>

#include "host_tensor.hpp"
#include "reference.hpp"
#include "test_util.hpp"

namespace fdma::test {

struct VarlenCase {
  std::vector<int64_t> q_lens{5, 0, 17, 1}, k_lens{5, 3, 30, 1};
  int64_t H = 4, Hk = 2, D = 16, w = 6;
  bool dynamic = true;  // dynamic_mask_attention, else attention
  bool causal = true, add_scores = true, padding = false, ties = false;
  int64_t bias_heads = 0;  // attention: a per-key bias [bias_heads, total_k] (0: none)
  DType bias_dtype = DType::f32;  // and dbias's
  bool mask = false;       // attention: a per-key mask [mask_heads, total_k]
  int64_t mask_heads = 1;
  double softcap = 0;
  DType dtype = DType::f32;
  uint64_t seed = 1;
  std::string str() const {
    std::ostringstream os;
    os << (dynamic ? "dma" : "attention") << " q_lens";
    for (auto l : q_lens) os << " " << l;
    os << " k_lens";
    for (auto l : k_lens) os << " " << l;
    os << " H" << H << " Hk" << Hk << " D" << D << " w" << w << " causal" << causal << " add_scores" << add_scores
       << " padding" << padding << " ties" << ties << " bias_heads" << bias_heads << " " << dtype_name(bias_dtype)
       << " mask" << mask << " mask_heads" << mask_heads << " softcap" << softcap << " " << dtype_name(dtype);
    return os.str();
  }
};

struct VarlenRun {
  VarlenCase c;
  int64_t N = 0, total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  std::vector<int64_t> q0, k0;  // sequence starts
  HostTensor cu_q, cu_k, q, k, v, scores, pad, bias, mask, out, lse, dout, dq, dk, dv, dscores, dbias;
  HostTensor keep_begin, keep_end;
  ref::Problem rp;
  std::vector<uint8_t> seq_keep;  // [Hk, total_q, total_k] what each query keeps (dynamic)

  explicit VarlenRun(const VarlenCase& cs) : c(cs) {
    N = int64_t(c.q_lens.size());
    cu_q = HostTensor(DType::i32, {N + 1});
    cu_k = HostTensor(DType::i32, {N + 1});
    for (int64_t s = 0; s < N; ++s) {
      q0.push_back(total_q), k0.push_back(total_k);
      total_q += c.q_lens[s], total_k += c.k_lens[s];
      max_q = std::max(max_q, c.q_lens[s]), max_k = std::max(max_k, c.k_lens[s]);
      cu_q.set(s + 1, double(total_q)), cu_k.set(s + 1, double(total_k));
    }
    std::mt19937_64 rng(c.seed);
    q = HostTensor(c.dtype, {total_q, c.H, c.D}, {1, 0, 2});  // heads outermost: not the packed order
    k = HostTensor(c.dtype, {total_k, c.Hk, c.D});
    v = HostTensor(c.dtype, {total_k, c.Hk, c.D});
    q.fill_uniform(rng, -1.5, 1.5);
    k.fill_uniform(rng, -1.5, 1.5);
    v.fill_uniform(rng, -1, 1);
    scores = HostTensor(DType::f32, {c.Hk, total_k});
    std::uniform_real_distribution<double> u(-2, 2);
    for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, c.ties ? std::round(u(rng) * 2) / 2 : u(rng));
    pad = HostTensor(DType::boolean, {total_k});
    pad.fill_bool(rng, c.padding ? 0.8 : 1.0);
    if (c.bias_heads) {
      bias = HostTensor(c.bias_dtype, {c.bias_heads, total_k});
      bias.fill_uniform(rng, -1, 1);
      dbias = HostTensor(c.bias_dtype, {c.bias_heads, total_k});
    }
    mask = HostTensor(DType::boolean, {c.mask_heads, total_k});
    mask.fill_bool(rng, c.mask ? 0.7 : 1.0);
    out = HostTensor(c.dtype, {total_q, c.H, c.D});
    lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {c.H, total_q});
    dout = HostTensor(c.dtype, {total_q, c.H, c.D});
    dout.fill_uniform(rng, -1, 1);
    dq = HostTensor(c.dtype, {total_q, c.H, c.D});
    dk = HostTensor(c.dtype, {total_k, c.Hk, c.D});
    dv = HostTensor(c.dtype, {total_k, c.Hk, c.D});
    dscores = HostTensor(DType::f32, {c.Hk, total_k});
    keep_begin = HostTensor(DType::i32, {c.Hk, total_k});
    keep_end = HostTensor(DType::i32, {c.Hk, total_k});
    build_reference();
  }

  int64_t seq_of_key(int64_t j) const {
    for (int64_t s = 0; s < N; ++s)
      if (j >= k0[s] && j < k0[s] + c.k_lens[s]) return s;
    return -1;
  }

  void build_reference() {
    rp.B = 1, rp.Sq = total_q, rp.Sk = total_k, rp.H = c.H, rp.Hk = c.Hk, rp.D = c.D;
    rp.scale = 1.0 / std::sqrt(double(c.D));
    rp.softcap = c.softcap;
    rp.causal = false;  // per sequence, in the keep-mask
    rp.q = q.values(), rp.k = k.values(), rp.v = v.values();
    const int64_t G = c.H / c.Hk;
    rp.keep.assign(c.H * total_q * total_k, 0);
    rp.bias.assign(c.H * total_q * total_k, 0.0);
    seq_keep.assign(c.Hk * total_q * total_k, 0);
    const auto sv = scores.values(), pv = pad.values(), bv = c.bias_heads ? bias.values() : std::vector<double>{},
               mv = mask.values();
    for (int64_t s = 0; s < N; ++s) {
      const int64_t nq = c.q_lens[s], nk = c.k_lens[s];
      for (int64_t hk = 0; hk < c.Hk; ++hk) {
        std::vector<uint8_t> keep;  // [nq, nk]
        if (c.dynamic) {
          std::vector<double> row(sv.begin() + hk * total_k + k0[s], sv.begin() + hk * total_k + k0[s] + nk);
          std::vector<uint8_t> padding;
          if (c.padding)
            for (int64_t j = 0; j < nk; ++j) padding.push_back(pv[k0[s] + j] != 0);
          keep = ref::select_ranked(row, padding, 1, 1, nq, nk, c.w, c.causal);
        } else {
          keep.assign(nq * nk, 1);
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t j = 0; j < nk; ++j)
              keep[i * nk + j] = !c.causal || j <= i + nk - nq;
        }
        for (int64_t i = 0; i < nq; ++i)
          for (int64_t j = 0; j < nk; ++j) {
            const int64_t gi = q0[s] + i, gj = k0[s] + j;
            seq_keep[(hk * total_q + gi) * total_k + gj] = keep[i * nk + j];
            for (int64_t h = hk * G; h < hk * G + G; ++h) {
              const int64_t idx = (h * total_q + gi) * total_k + gj;
              const int64_t hm = c.mask_heads == c.H ? h : c.mask_heads == c.Hk ? hk : 0;
              rp.keep[idx] = keep[i * nk + j] && (c.dynamic || !c.mask || mv[hm * total_k + gj] != 0);
              if (c.dynamic && c.add_scores) rp.bias[idx] = sv[hk * total_k + gj];
              if (!c.dynamic && c.bias_heads) {
                const int64_t hb = c.bias_heads == c.H ? h : c.bias_heads == c.Hk ? hk : 0;
                rp.bias[idx] = bv[hb * total_k + gj];
              }
            }
          }
      }
    }
  }

  template <class P>
  void common(P& p) const {
    p.q = q.view(), p.k = k.view(), p.v = v.view();
    p.softcap = c.softcap;
    p.causal = c.causal;
    p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
    p.cu_seqlens_q = cu_q.view(), p.cu_seqlens_k = cu_k.view();
    p.max_seqlen_q = max_q, p.max_seqlen_k = max_k;
  }

  DmaParams dma_params() const {
    DmaParams p;
    common(p);
    p.key_scores = scores.view();
    if (c.padding) p.key_padding = pad.view();
    p.window = c.w;
    p.add_scores = c.add_scores;
    p.dkey_scores = dscores.view();
    p.keep_begin = keep_begin.view(), p.keep_end = keep_end.view();
    return p;
  }

  AttentionParams attention_params() const {
    AttentionParams p;
    common(p);
    if (c.bias_heads) p.bias = bias.view(), p.dbias = dbias.view();
    if (c.mask) p.mask = mask.view();
    return p;
  }

  void forward() {
    out.poison();
    lse.poison();
    keep_begin.poison();
    keep_end.poison();
    if (c.dynamic) {
      DmaParams p = dma_params();
      std::vector<unsigned char> ws(dma_workspace_size(p, Pass::forward));
      p.workspace = ws.data(), p.workspace_bytes = ws.size();
      dma_forward(p);
    } else {
      AttentionParams p = attention_params();
      std::vector<unsigned char> ws(attention_workspace_size(p, Pass::forward));
      p.workspace = ws.data(), p.workspace_bytes = ws.size();
      attention_forward(p);
    }
  }

  void backward() {
    for (HostTensor* t : {&dq, &dk, &dv, &dscores}) t->poison();
    if (c.bias_heads) dbias.poison();
    if (c.dynamic) {
      DmaParams p = dma_params();
      std::vector<unsigned char> ws(dma_workspace_size(p, Pass::backward));
      p.workspace = ws.data(), p.workspace_bytes = ws.size();
      dma_backward(p);
    } else {
      AttentionParams p = attention_params();
      std::vector<unsigned char> ws(attention_workspace_size(p, Pass::backward));
      p.workspace = ws.data(), p.workspace_bytes = ws.size();
      attention_backward(p);
    }
  }

  // out [total_q, H, D] and lse [H, total_q] against the reference's [1, total_q, H, D], [1, H, total_q].
  void check_forward() {
    auto f = ref::forward(rp);
    EXPECT_TRUE(all_close(out.values(), f.out, forward_tol(c.dtype, f.out), "out")) << c.str();
    EXPECT_TRUE(all_close(lse.values(), f.lse, {1e-5, 2e-6}, "lse")) << c.str();
    if (!c.dynamic) return;
    // keep_begin/keep_end: for every key, the queries of its sequence that keep it, as indices
    // within the sequence.
    std::vector<double> b(c.Hk * total_k, 0), e(c.Hk * total_k, 0);
    for (int64_t hk = 0; hk < c.Hk; ++hk)
      for (int64_t j = 0; j < total_k; ++j) {
        const int64_t s = seq_of_key(j);
        int64_t lo = -1, hi = -1;
        for (int64_t i = 0; i < c.q_lens[s]; ++i)
          if (seq_keep[(hk * total_q + q0[s] + i) * total_k + j]) {
            if (lo < 0) lo = i;
            hi = i + 1;
          }
        if (lo >= 0) b[hk * total_k + j] = double(lo), e[hk * total_k + j] = double(hi);
      }
    EXPECT_EQ(keep_begin.values(), b) << "keep_begin, " << c.str();
    EXPECT_EQ(keep_end.values(), e) << "keep_end, " << c.str();
  }

  void check_backward() {
    auto g = ref::backward(rp, dout.values());
    EXPECT_TRUE(all_close(dq.values(), g.dq, grad_tol(c.dtype, g.dq), "dq")) << c.str();
    EXPECT_TRUE(all_close(dk.values(), g.dk, grad_tol(c.dtype, g.dk), "dk")) << c.str();
    EXPECT_TRUE(all_close(dv.values(), g.dv, grad_tol(c.dtype, g.dv), "dv")) << c.str();
    const int64_t G = c.H / c.Hk;
    if (c.dynamic) {  // dkey_scores(hk, j): dS summed over the group's heads and every query
      std::vector<double> ds(c.Hk * total_k, 0.0);
      if (c.add_scores)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t i = 0; i < total_q; ++i)
            for (int64_t j = 0; j < total_k; ++j) ds[(h / G) * total_k + j] += g.dbias[(h * total_q + i) * total_k + j];
      EXPECT_TRUE(all_close(dscores.values(), ds, grad_tol(c.dtype, ds), "dkey_scores")) << c.str();
    } else if (c.bias_heads) {
      auto db = ref::reduce_broadcast(rp, g.dbias, {1, c.bias_heads, 1, total_k});
      EXPECT_TRUE(all_close(dbias.values(), db, grad_tol(c.dtype, db), "dbias")) << c.str();
    }
  }
};

}  // namespace fdma::test
