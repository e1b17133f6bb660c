// The example problem of the fdma command: q, k, v, dout random; key importance scores in the
// DMA papers' zero-order-hold form, score(b, hk, j) = A[hk] * softplus(v[b, j, hk, :] . u[hk]),
// with a learnable-looking A and projection u drawn at random.
#pragma once

#include <cmath>
#include <random>
#include <string>

#include "host_tensor.hpp"

namespace fdma::tool {

struct Shape {
  int64_t B, Sq, Sk, H, Hk, D, w;
  bool causal;
  DType dtype;
  std::string str() const {
    return "B" + std::to_string(B) + " Sq" + std::to_string(Sq) + " Sk" + std::to_string(Sk) + " H" + std::to_string(H) +
           " Hk" + std::to_string(Hk) + " D" + std::to_string(D) + " w" + std::to_string(w) +
           (causal ? " causal " : " non-causal ") + dtype_name(dtype);
  }
};

inline DType parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::f16;
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "fp64" || s == "f64" || s == "float64") return DType::f64;
  throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or fp64, got '" + s + "'");
}

struct DmaProblemData {
  Shape s;
  test::HostTensor q, k, v, scores, out, lse, dout, dq, dk, dv, dscores;

  DmaProblemData(const Shape& shape, uint64_t seed) : s(shape) {
    std::mt19937_64 rng(seed);
    q = test::HostTensor(s.dtype, {s.B, s.Sq, s.H, s.D});
    k = test::HostTensor(s.dtype, {s.B, s.Sk, s.Hk, s.D});
    v = test::HostTensor(s.dtype, {s.B, s.Sk, s.Hk, s.D});
    dout = test::HostTensor(s.dtype, {s.B, s.Sq, s.H, s.D});
    for (auto* t : {&q, &k, &v, &dout}) t->fill_uniform(rng, -1.0, 1.0);
    scores = test::HostTensor(DType::f32, {s.B, s.Hk, s.Sk});
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> a_dist(0.5, 1.5);
    for (int64_t hk = 0; hk < s.Hk; ++hk) {
      const double A = a_dist(rng);
      std::vector<double> u(s.D);
      for (auto& x : u) x = normal(rng) * 2.0 / std::sqrt(double(s.D));
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t j = 0; j < s.Sk; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += v.get(((b * s.Sk + j) * s.Hk + hk) * s.D + d) * u[d];
          const double softplus = dot > 20 ? dot : std::log1p(std::exp(dot));
          scores.set((b * s.Hk + hk) * s.Sk + j, A * softplus);
        }
    }
    out = test::HostTensor(s.dtype, {s.B, s.Sq, s.H, s.D});
    lse = test::HostTensor(DType::f32, {s.B, s.H, s.Sq});
    dq = test::HostTensor(s.dtype, {s.B, s.Sq, s.H, s.D});
    dk = test::HostTensor(s.dtype, {s.B, s.Sk, s.Hk, s.D});
    dv = test::HostTensor(s.dtype, {s.B, s.Sk, s.Hk, s.D});
    dscores = test::HostTensor(DType::f32, {s.B, s.Hk, s.Sk});
  }

  DmaParams params(Backend backend) const {
    DmaParams p;
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.key_scores = scores.view();
    p.window = s.w;
    p.causal = s.causal;
    p.add_scores = 1;
    p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view(), p.dkey_scores = dscores.view();
    p.backend = static_cast<int32_t>(backend);
    return p;
  }
};

}  // namespace fdma::tool
