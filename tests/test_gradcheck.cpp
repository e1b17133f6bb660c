// Gradients of both operations against central finite differences of the library's own
// float64 forward: loss = sum(out * dout), d loss / d x for sampled elements of every input.
#include <gtest/gtest.h>

#include <functional>

#include "attention_case.hpp"
#include "dma_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

double dot_values(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

// Checks grad against (loss(x + eps) - loss(x - eps)) / 2eps at up to `samples` elements of x.
void check_fd(const char* name, HostTensor& x, const HostTensor& grad, const std::function<double()>& loss,
              int samples = 12) {
  const double eps = 1e-6;
  const int64_t n = x.numel();
  for (int s = 0; s < samples && s < n; ++s) {
    const int64_t idx = (s * 7919) % n;
    const double orig = x.get(idx);
    x.set(idx, orig + eps);
    const double up = loss();
    x.set(idx, orig - eps);
    const double down = loss();
    x.set(idx, orig);
    const double fd = (up - down) / (2 * eps), an = grad.get(idx);
    EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << name << "[" << idx << "]";
  }
}

}  // namespace

TEST(GradCheck, AttentionAllInputs) {
  for (bool causal : {false, true})
    for (double softcap : {0.0, 2.0}) {
      AttnCase c;
      c.B = 1, c.Sq = 6, c.Sk = 9, c.H = 4, c.Hk = 2, c.D = 5, c.dtype = DType::f64, c.causal = causal;
      c.softcap = softcap, c.seed = 21;
      c.mask.present = true;
      c.mask.heads = 0;
      c.bias.present = true;
      c.bias.q = false;  // [B, H, 1, Sk]: a reduced dbias
      AttnRun r(c);
      r.forward();
      r.backward();
      auto loss = [&] {
        r.forward();
        return dot_values(r.out, r.dout);
      };
      check_fd("q", r.q, r.dq, loss);
      check_fd("k", r.k, r.dk, loss);
      check_fd("v", r.v, r.dv, loss);
      check_fd("bias", r.bias, r.dbias, loss);
    }
}

TEST(GradCheck, DynamicMaskAttentionAllInputs) {
  for (bool causal : {false, true}) {
    DmaCase c;
    c.B = 1, c.Sq = 12, c.Sk = 14, c.H = 4, c.Hk = 2, c.D = 4, c.w = 5, c.causal = causal, c.softcap = 1.5;
    c.dtype = DType::f64, c.score_dtype = DType::f64, c.seed = 22;
    DmaRun r(c);
    r.forward();
    r.backward();
    auto loss = [&] {
      r.forward();
      return dot_values(r.out, r.dout);
    };
    check_fd("q", r.q, r.dq, loss);
    check_fd("k", r.k, r.dk, loss);
    check_fd("v", r.v, r.dv, loss);
    check_fd("key_scores", r.scores, r.dscores, loss);  // distinct scores: eps never flips the selection
  }
}
