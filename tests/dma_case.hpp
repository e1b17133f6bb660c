// One dynamic_mask_attention problem run through the C++ API and the float64 reference
// (brute-force selection turned into a dense keep-mask plus the scores as a bias).
#pragma once

#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "host_tensor.hpp"
#include "reference.hpp"
#include "test_util.hpp"

namespace fdma::test {

struct DmaCase {
  int64_t B = 1, Sq = 8, Sk = 8, H = 2, Hk = 1, D = 16, w = 4;
  bool causal = true, add_scores = true, padding = false, ties = false;
  bool deterministic = false;  // backward: the reproducible kernels (on Hopper, not the fused dq)
  double softcap = 0;
  DType dtype = DType::f32;
  DType score_dtype = DType::f32;
  int layout = 0;
  int64_t out_row_pad = 0;  // elements after each row of D in out
  uint64_t seed = 1;
  std::string str() const {
    std::ostringstream os;
    os << "B" << B << " Sq" << Sq << " Sk" << Sk << " H" << H << " Hk" << Hk << " D" << D << " w" << w << " causal"
       << causal << " add_scores" << add_scores << " padding" << padding << " ties" << ties << " softcap" << softcap
       << " " << dtype_name(dtype) << " scores " << dtype_name(score_dtype) << " layout" << layout
       << (deterministic ? " deterministic" : "");
    if (out_row_pad) os << " out_row_pad" << out_row_pad;
    return os.str();
  }
};

// dkey_scores from the reference's full dS (ref::backward's dbias, [B, H, Sq, Sk]): summed over
// the group's heads and all queries; with `magnitude`, the same sum of |dS| (the scale of its
// rounding error).
inline std::vector<double> reference_dscores(const DmaCase& c, const std::vector<double>& dbias,
                                             bool magnitude = false) {
  std::vector<double> ds(c.B * c.Hk * c.Sk, 0.0);
  const int64_t G = c.H / c.Hk;
  if (c.add_scores)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t j = 0; j < c.Sk; ++j) {
            const double x = dbias[((b * c.H + h) * c.Sq + i) * c.Sk + j];
            ds[(b * c.Hk + h / G) * c.Sk + j] += magnitude ? std::fabs(x) : x;
          }
  return ds;
}

struct DmaRun {
  DmaCase c;
  HostTensor q, k, v, scores, pad, out, lse, dout, dq, dk, dv, dscores;
  HostTensor keep_begin, keep_end;  // the selection's intervals, passed when with_intervals
  bool with_intervals = false;
  ref::Problem rp;

  explicit DmaRun(const DmaCase& cs) : c(cs) {
    std::mt19937_64 rng(c.seed);
    std::vector<int> perm = c.layout == 1 ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
    q = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm);
    k = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm);
    v = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm);
    q.fill_uniform(rng, -1.5, 1.5);
    k.fill_uniform(rng, -1.5, 1.5);
    v.fill_uniform(rng, -1, 1);
    scores = HostTensor(c.score_dtype, {c.B, c.Hk, c.Sk});
    std::uniform_real_distribution<double> u(-2, 2);
    for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, c.ties ? std::round(u(rng) * 2) / 2 : u(rng));
    pad = HostTensor(DType::boolean, {c.B, c.Sk});
    if (c.padding) pad.fill_bool(rng, 0.8);

    rp.B = c.B, rp.Sq = c.Sq, rp.Sk = c.Sk, rp.H = c.H, rp.Hk = c.Hk, rp.D = c.D;
    rp.scale = 1.0 / std::sqrt(double(c.D));
    rp.softcap = c.softcap;
    rp.causal = false;  // the selection already holds causality
    rp.q = q.values(), rp.k = k.values(), rp.v = v.values();
    rebuild_reference_mask();

    out = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm, 0, c.out_row_pad);
    lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {c.B, c.H, c.Sq});
    dout = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D});
    dout.fill_uniform(rng, -1, 1);
    dq = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm);
    dk = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm);
    dv = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm);
    dscores = HostTensor(c.score_dtype, {c.B, c.Hk, c.Sk});
    keep_begin = HostTensor(DType::i32, {c.B, c.Hk, c.Sk}, {2, 0, 1});  // strided, as a caller's view may be
    keep_end = HostTensor(DType::i32, {c.B, c.Hk, c.Sk});
  }

  // Intervals that are no selection's, passed from now on: random in [-2 Sq, 4 Sq] (out of
  // range and reversed ones among them), and every third key kept by every query.
  void make_up_intervals(uint64_t seed) {
    with_intervals = true;
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> any(-2 * c.Sq, 4 * c.Sq);
    for (int64_t i = 0; i < keep_begin.numel(); ++i) {
      keep_begin.set(i, i % 3 ? double(any(rng)) : -7.0);
      keep_end.set(i, i % 3 ? double(any(rng)) : 20.0 * c.Sq);
    }
  }

  // NaN in every element of the K rows of some keys of each (batch, KV head): up to `per_row`
  // that some queries keep and others not (causal: their selected interval begins after query
  // 0 or ends before the last query), and one that no query keeps. The reference reads the new
  // K. Returns how many rows of the reference's out are NaN (the rows that keep such a key),
  // so that a test can tell that both kinds of rows are there.
  int64_t poison_key_rows(int per_row) {
    const auto [begin, end] = cpu_selection();
    auto poison = [&](int64_t bh, int64_t j) {
      const int64_t bb = bh / c.Hk, hk = bh % c.Hk;
      for (int64_t d = 0; d < c.D; ++d) k.set(((bb * c.Sk + j) * c.Hk + hk) * c.D + d, std::nan(""));
    };
    for (int64_t bh = 0; bh < c.B * c.Hk; ++bh) {
      int partly = 0;
      bool unkept = false;
      for (int64_t j = c.Sk / 4; j < c.Sk; j += 7) {
        const double b = begin[bh * c.Sk + j], e = end[bh * c.Sk + j];
        if (b >= e && !unkept) {
          poison(bh, j);
          unkept = true;
        } else if (b < e && (b > 0 || e < c.Sq) && partly < per_row) {
          poison(bh, j);
          ++partly;
        }
      }
    }
    rp.k = k.values();
    const auto ref = ref::forward(rp);
    int64_t nan_rows = 0;
    for (int64_t row = 0; row < c.B * c.Sq * c.H; ++row) nan_rows += std::isnan(ref.out[row * c.D]);
    return nan_rows;
  }

  // The selection as select_keys computes it on the CPU: (begin, end) values.
  std::pair<std::vector<double>, std::vector<double>> cpu_selection() const {
    HostTensor b(DType::i32, {c.B, c.Hk, c.Sk}), e(DType::i32, {c.B, c.Hk, c.Sk});
    SelectParams p;
    p.key_scores = scores.view();
    if (c.padding) p.key_padding = pad.view();
    p.num_queries = c.Sq, p.window = c.w, p.causal = c.causal;
    p.keep_begin = b.view(), p.keep_end = e.view();
    std::vector<unsigned char> ws(select_workspace_size(p));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    select_keys(p);
    return {b.values(), e.values()};
  }

  // Reference keep-mask and bias from brute-force selection over the current scores.
  void rebuild_reference_mask() {
    std::vector<uint8_t> padding;
    if (c.padding)
      for (double x : pad.values()) padding.push_back(x != 0);
    auto sv = scores.values();
    auto keep = ref::select_ranked(sv, padding, c.B, c.Hk, c.Sq, c.Sk, c.w, c.causal);
    const int64_t G = c.H / c.Hk;
    rp.keep.assign(c.B * c.H * c.Sq * c.Sk, 0);
    rp.bias.assign(c.B * c.H * c.Sq * c.Sk, 0.0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t j = 0; j < c.Sk; ++j) {
            const int64_t hk = h / G, idx = ((b * c.H + h) * c.Sq + i) * c.Sk + j;
            rp.keep[idx] = keep[((b * c.Hk + hk) * c.Sq + i) * c.Sk + j];
            if (c.add_scores) rp.bias[idx] = sv[(b * c.Hk + hk) * c.Sk + j];
          }
  }

  DmaParams params() const {
    DmaParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view();
    p.key_scores = scores.view();
    if (c.padding) p.key_padding = pad.view();
    p.window = c.w;
    p.causal = c.causal;
    p.add_scores = c.add_scores;
    p.softcap = c.softcap;
    p.deterministic = c.deterministic;
    p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view(), p.dkey_scores = dscores.view();
    if (with_intervals) p.keep_begin = keep_begin.view(), p.keep_end = keep_end.view();
    return p;
  }

  void forward() {
    out.poison();
    lse.poison();
    DmaParams p = params();
    std::vector<unsigned char> ws(dma_workspace_size(p, Pass::forward));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    dma_forward(p);
  }

  void backward() {
    for (HostTensor* t : {&dq, &dk, &dv, &dscores}) t->poison();
    DmaParams p = params();
    std::vector<unsigned char> ws(dma_workspace_size(p, Pass::backward));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    dma_backward(p);
  }

  void check_forward() {
    auto f = ref::forward(rp);
    EXPECT_TRUE(all_close(out.values(), f.out, forward_tol(c.dtype, f.out), "out")) << c.str();
    EXPECT_TRUE(all_close(lse.values(), f.lse, {1e-5, 2e-6}, "lse")) << c.str();
    EXPECT_TRUE(out.gaps_poisoned() && lse.gaps_poisoned()) << "out or lse written outside its elements";
  }

  void check_backward() {
    auto g = ref::backward(rp, dout.values());
    EXPECT_TRUE(all_close(dq.values(), g.dq, grad_tol(c.dtype, g.dq), "dq")) << c.str();
    EXPECT_TRUE(all_close(dk.values(), g.dk, grad_tol(c.dtype, g.dk), "dk")) << c.str();
    EXPECT_TRUE(all_close(dv.values(), g.dv, grad_tol(c.dtype, g.dv), "dv")) << c.str();
    EXPECT_TRUE(dq.gaps_poisoned() && dk.gaps_poisoned() && dv.gaps_poisoned())
        << "dq, dk or dv written outside its elements";
    const std::vector<double> ds = reference_dscores(c, g.dbias);
    EXPECT_TRUE(all_close(dscores.values(), ds, grad_tol(c.score_dtype == DType::f32 ? c.dtype : c.score_dtype, ds),
                          "dkey_scores"))
        << c.str();
  }
};

}  // namespace fdma::test
