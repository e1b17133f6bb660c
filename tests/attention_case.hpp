// One attention problem in any dtype/layout/broadcast, run through the C++ API and the
// float64 reference, forward and backward. Shared by the attention and determinism tests.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "host_tensor.hpp"
#include "reference.hpp"
#include "test_util.hpp"

namespace fdma::test {

// Declared shape of a mask or bias: each of batch/query/key full or 1; heads 1, Hk or H.
struct Bcast {
  bool present = false;
  bool b = true, q = true, k = true;
  int heads = 2;          // 0: 1, 1: Hk, 2: H
  bool expanded = false;  // size-1 dims stretched to full by stride 0
  DType dtype = DType::unset;  // bias only: unset = q's dtype
};

struct AttnCase {
  int64_t B = 1, Sq = 8, Sk = 8, H = 2, Hk = 2, D = 16;
  bool causal = false;
  double softcap = 0;
  DType dtype = DType::f32;
  Bcast mask, bias;
  int layout = 0;  // 0: contiguous, 1: [B, H, S, D] physical, 2: rows padded by 3, 3: by 8
  int64_t out_row_pad = 0;  // elements after each row of D in out
  double scale = 0;
  int empty_rows = 0;  // mask rows forced all-false (needs a mask)
  uint64_t seed = 1;

  std::string str() const {
    std::ostringstream os;
    os << "B" << B << " Sq" << Sq << " Sk" << Sk << " H" << H << " Hk" << Hk << " D" << D << " causal" << causal
       << " softcap" << softcap << " " << dtype_name(dtype) << " layout" << layout;
    if (out_row_pad) os << " out_row_pad" << out_row_pad;
    auto bc = [&](const char* n, const Bcast& x) {
      if (x.present)
        os << " " << n << "[" << (x.b ? "B" : "1") << "," << (x.heads == 2 ? "H" : x.heads == 1 ? "Hk" : "1") << ","
           << (x.q ? "Sq" : "1") << "," << (x.k ? "Sk" : "1") << "]" << (x.expanded ? "expanded" : "");
    };
    bc("mask", mask);
    bc("bias", bias);
    return os.str();
  }
};

inline std::vector<int64_t> declared_shape(const AttnCase& c, const Bcast& x) {
  return {x.b ? c.B : 1, x.heads == 2 ? c.H : x.heads == 1 ? c.Hk : 1, x.q ? c.Sq : 1, x.k ? c.Sk : 1};
}

// Expand a declared broadcast tensor to the reference's full [B, H, Sq, Sk].
inline std::vector<double> expand_full(const AttnCase& c, const std::vector<double>& v, const std::vector<int64_t>& s) {
  std::vector<double> full(c.B * c.H * c.Sq * c.Sk);
  const int64_t G = c.H / c.Hk;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.Sq; ++i)
        for (int64_t j = 0; j < c.Sk; ++j) {
          int64_t hb = s[1] == c.H ? h : s[1] == c.Hk ? h / G : 0;
          full[((b * c.H + h) * c.Sq + i) * c.Sk + j] =
              v[(((s[0] > 1 ? b : 0) * s[1] + hb) * s[2] + (s[2] > 1 ? i : 0)) * s[3] + (s[3] > 1 ? j : 0)];
        }
  return full;
}

struct AttnRun {
  AttnCase c;
  HostTensor q, k, v, mask, bias, out, lse, dout, dq, dk, dv, dbias;
  std::vector<int64_t> bias_shape;
  ref::Problem rp;

  explicit AttnRun(const AttnCase& cs) : c(cs) {
    std::mt19937_64 rng(c.seed);
    std::vector<int> perm = c.layout == 1 ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
    const int64_t pad = c.layout == 2 ? 3 : c.layout == 3 ? 8 : 0;
    q = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm, pad);
    k = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm, pad);
    v = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm, pad);
    q.fill_uniform(rng, -1.5, 1.5);
    k.fill_uniform(rng, -1.5, 1.5);
    v.fill_uniform(rng, -1, 1);
    rp.B = c.B, rp.Sq = c.Sq, rp.Sk = c.Sk, rp.H = c.H, rp.Hk = c.Hk, rp.D = c.D;
    rp.scale = c.scale == 0 ? 1.0 / std::sqrt(double(c.D)) : c.scale;
    rp.softcap = c.softcap;
    rp.causal = c.causal;
    rp.q = q.values(), rp.k = k.values(), rp.v = v.values();
    if (c.mask.present) {
      auto s = declared_shape(c, c.mask);
      mask = HostTensor(DType::boolean, s);
      mask.fill_bool(rng, 0.7);
      const int64_t row_len = s[3];
      for (int r = 0; r < c.empty_rows && r * row_len < mask.numel(); ++r)  // whole rows of keys off
        for (int64_t j = 0; j < row_len; ++j) mask.set((mask.numel() / row_len - 1 - r) * row_len + j, 0);
      auto full = expand_full(c, mask.values(), s);
      rp.keep.assign(full.begin(), full.end());
      if (c.mask.expanded) mask = mask.expanded({c.B, c.H, c.Sq, c.Sk});
    }
    if (c.bias.present) {
      bias_shape = declared_shape(c, c.bias);
      bias = HostTensor(c.bias.dtype == DType::unset ? c.dtype : c.bias.dtype, bias_shape);
      bias.fill_uniform(rng, -2, 2);
      rp.bias = expand_full(c, bias.values(), bias_shape);
      if (c.bias.expanded) {  // a stride-0 view declares the full shape, and so does its gradient
        bias = bias.expanded({c.B, c.H, c.Sq, c.Sk});
        bias_shape = bias.shape();
      }
      dbias = HostTensor(bias.dtype(), bias_shape);
    }
    out = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm, pad, c.out_row_pad);
    lse = HostTensor(c.dtype == DType::f64 ? DType::f64 : DType::f32, {c.B, c.H, c.Sq});
    dout = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D});
    dout.fill_uniform(rng, -1, 1);
    dq = HostTensor(c.dtype, {c.B, c.Sq, c.H, c.D}, perm, pad);
    dk = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm, pad);
    dv = HostTensor(c.dtype, {c.B, c.Sk, c.Hk, c.D}, perm, pad);
  }

  // A float mask's sentinels in the bias (a [B, heads, Sq, Sk] one): every third query row holds
  // `lowest` throughout (a padded query), and its dO is zero, as a masked loss leaves it.
  void sentinel_rows(double lowest) {
    const std::vector<int64_t> s = bias.shape();
    for (int64_t i = 0; i < bias.numel(); ++i)
      if ((i / s[3]) % s[2] % 3 == 0) bias.set(i, lowest);
    rp.bias = expand_full(c, bias.values(), bias_shape);
    for (int64_t i = 0; i < dout.numel(); ++i)  // dout [B, Sq, H, D]
      if ((i / (c.H * c.D)) % c.Sq % 3 == 0) dout.set(i, 0.0);
  }

  AttentionParams params() const {
    AttentionParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view();
    if (c.mask.present) p.mask = mask.view();
    if (c.bias.present) p.bias = bias.view();
    p.scale = c.scale;
    p.softcap = c.softcap;
    p.causal = c.causal;
    p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
    if (c.bias.present) p.dbias = dbias.view();
    return p;
  }

  void forward() {
    out.poison();
    lse.poison();
    AttentionParams p = params();
    std::vector<unsigned char> ws(attention_workspace_size(p, Pass::forward));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    attention_forward(p);
  }

  void backward() {
    for (HostTensor* t : {&dq, &dk, &dv, &dbias}) t->poison();
    AttentionParams p = params();
    std::vector<unsigned char> ws(attention_workspace_size(p, Pass::backward));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    attention_backward(p);
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
    if (c.bias.present) {
      auto db = ref::reduce_broadcast(rp, g.dbias, bias_shape);
      // A reduced element sums many dS of both signs (a row's dS sums to 0), so its error
      // scales with the summed magnitude, not with the (possibly ~0) result.
      std::vector<double> mag(g.dbias.size());
      for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(g.dbias[i]);
      Tol tol = grad_tol(dbias.dtype(), ref::reduce_broadcast(rp, mag, bias_shape));
      EXPECT_TRUE(all_close(dbias.values(), db, tol, "dbias")) << c.str();
    }
  }
};

}  // namespace fdma::test
