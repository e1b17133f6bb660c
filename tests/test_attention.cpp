// attention on the CPU against the float64 reference over the shape list below:
// ragged lengths, Sq != Sk, MHA/GQA/MQA, every broadcast shape of mask and bias, mask only,
// bias only, both, causal, softcap, rows with no visible key, every dtype and layout.
#include <gtest/gtest.h>

#include "attention_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

void run(const AttnCase& c) {
  SCOPED_TRACE(c.str());
  AttnRun r(c);
  r.forward();
  r.check_forward();
  r.backward();
  r.check_backward();
}

Bcast full_mask() {
  Bcast m;
  m.present = true;
  m.dtype = DType::boolean;
  return m;
}

}  // namespace

TEST(Attention, RaggedLengthsAndHeads) {
  uint64_t seed = 1;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {64, 64}, {65, 65}, {100, 127}, {129, 63},
                        {1, 129}, {127, 1}})
    for (auto [H, Hk] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}})
      for (bool causal : {false, true}) {
        AttnCase c;
        c.B = 2, c.Sq = Sq, c.Sk = Sk, c.H = H, c.Hk = Hk, c.D = 16, c.causal = causal, c.seed = seed++;
        run(c);
      }
}

TEST(Attention, EveryMaskBroadcastShape) {
  uint64_t seed = 100;
  for (int heads : {0, 1, 2})
    for (int bits = 0; bits < 8; ++bits)
      for (bool expanded : {false, true}) {
        AttnCase c;
        c.B = 2, c.Sq = 17, c.Sk = 23, c.H = 4, c.Hk = 2, c.D = 8, c.causal = bits % 2, c.seed = seed++;
        c.mask = full_mask();
        c.mask.b = bits & 1, c.mask.q = bits & 2, c.mask.k = bits & 4, c.mask.heads = heads, c.mask.expanded = expanded;
        run(c);
      }
}

TEST(Attention, EveryBiasBroadcastShapeWithDbias) {
  uint64_t seed = 200;
  for (int heads : {0, 1, 2})
    for (int bits = 0; bits < 8; ++bits)
      for (bool expanded : {false, true}) {
        AttnCase c;
        c.B = 2, c.Sq = 19, c.Sk = 21, c.H = 4, c.Hk = 2, c.D = 8, c.causal = bits & 1, c.seed = seed++;
        c.bias.present = true;
        c.bias.b = bits & 1, c.bias.q = bits & 2, c.bias.k = bits & 4, c.bias.heads = heads, c.bias.expanded = expanded;
        c.bias.dtype = heads == 1 ? DType::unset : DType::f32;
        run(c);
      }
}

TEST(Attention, MaskAndBiasTogether) {
  AttnCase c;
  c.B = 2, c.Sq = 65, c.Sk = 100, c.H = 4, c.Hk = 1, c.D = 32, c.causal = true, c.seed = 5;
  c.mask = full_mask();
  c.mask.heads = 1;
  c.bias.present = true;
  c.bias.q = false;  // a per-key bias [B, H, 1, Sk]
  run(c);
}

TEST(Attention, RowsWithNoVisibleKeyGiveZerosNotNaN) {
  // Fully masked rows, and causal with Sq > Sk (the first Sq - Sk queries see nothing).
  AttnCase c;
  c.B = 1, c.Sq = 30, c.Sk = 20, c.H = 2, c.Hk = 1, c.D = 8, c.causal = true, c.seed = 9;
  c.mask = full_mask();
  c.empty_rows = 4;
  c.bias.present = true;
  AttnRun r(c);
  r.forward();
  r.check_forward();
  for (int64_t i = 0; i < r.out.numel(); ++i) ASSERT_FALSE(std::isnan(r.out.get(i))) << i;
  EXPECT_EQ(r.out.get(0), 0.0);  // query 0 sees no key: Sk - Sq < 0
  EXPECT_TRUE(std::isinf(r.lse.get(0)) && r.lse.get(0) < 0);
  r.backward();
  r.check_backward();
  for (HostTensor* t : {&r.dq, &r.dk, &r.dv, &r.dbias})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_FALSE(std::isnan(t->get(i)));
}

TEST(Attention, FloatMaskSentinelRows) {
  // A float mask's sentinels as the bias: every third query row the dtype's lowest value
  // throughout (a padded query), with its dO zero as a masked loss leaves it. The forward gives
  // such a row the mean of every value row; its gradients are exactly zero.
  for (DType dt : {DType::f32, DType::bf16}) {
    AttnCase c;
    c.B = 2, c.Sq = 30, c.Sk = 25, c.H = 4, c.Hk = 2, c.D = 16, c.seed = 11, c.dtype = dt;
    c.bias.present = true;
    c.bias.q = true, c.bias.b = true, c.bias.heads = 2;
    AttnRun r(c);
    const double lowest = dt == DType::f32 ? -3.4028234663852886e38 : -3.3895313892515355e38;
    r.sentinel_rows(lowest);
    r.forward();
    r.check_forward();
    r.backward();
    r.check_backward();
    for (int64_t i = 0; i < r.dq.numel(); ++i) {
      if ((i / (c.H * c.D)) % c.Sq % 3 == 0) {
        ASSERT_EQ(r.dq.get(i), 0.0) << i;
      }
    }
  }
}

TEST(Attention, SoftcapAndScale) {
  uint64_t seed = 300;
  for (double softcap : {0.5, 5.0})
    for (double scale : {0.0, 0.7}) {
      AttnCase c;
      c.B = 1, c.Sq = 33, c.Sk = 40, c.H = 4, c.Hk = 2, c.D = 24, c.softcap = softcap, c.scale = scale, c.seed = seed++;
      c.causal = true;
      c.bias.present = true;
      c.bias.b = false;
      run(c);
    }
}

TEST(Attention, DtypesAndLayouts) {
  uint64_t seed = 400;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (int layout : {0, 1, 2}) {
      AttnCase c;
      c.B = 2, c.Sq = 45, c.Sk = 70, c.H = 4, c.Hk = 2, c.D = 40, c.dtype = dt, c.layout = layout, c.seed = seed++;
      c.out_row_pad = layout == 2 ? 2 : 0;  // out's rows of D padded too
      c.causal = layout != 1;
      c.mask = full_mask();
      c.mask.b = false;
      c.bias.present = true;
      c.bias.q = false;
      c.bias.heads = 1;
      run(c);
    }
}

TEST(Attention, HeadDims) {
  uint64_t seed = 500;
  for (int64_t D : {1, 3, 64, 100, 256}) {
    AttnCase c;
    c.B = 1, c.Sq = 20, c.Sk = 30, c.H = 2, c.Hk = 1, c.D = D, c.causal = true, c.seed = seed++;
    run(c);
  }
}

TEST(Attention, LongSequence) {
  AttnCase c;
  c.B = 1, c.Sq = 1000, c.Sk = 1000, c.H = 2, c.Hk = 1, c.D = 16, c.causal = true, c.seed = 11;
  c.bias.present = true;
  c.bias.q = false;
  run(c);
}

TEST(Attention, NaNAndInfParity) {
  // A NaN in q poisons exactly the rows of that query, as in the float64 reference.
  AttnCase c;
  c.B = 1, c.Sq = 6, c.Sk = 9, c.H = 2, c.Hk = 2, c.D = 4, c.seed = 12;
  c.bias.present = true;
  AttnRun r(c);
  r.q.set(0, NAN);
  r.rp.q = r.q.values();
  r.forward();
  r.check_forward();
  EXPECT_TRUE(std::isnan(r.out.get(0)));
  EXPECT_FALSE(std::isnan(r.out.get(r.out.numel() - 1)));
}

TEST(Attention, DeterministicAcrossThreadCounts) {
  AttnCase c;
  c.B = 2, c.Sq = 70, c.Sk = 90, c.H = 4, c.Hk = 2, c.D = 16, c.causal = true, c.seed = 13;
  c.bias.present = true;
  c.bias.q = false;  // dbias reduced over queries: the case most prone to order effects
  std::vector<std::vector<unsigned char>> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    AttnRun r(c);
    r.forward();
    r.backward();
    std::vector<unsigned char> all;
    for (HostTensor* t : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv, &r.dbias})
      all.insert(all.end(), t->bytes().begin(), t->bytes().end());
    results.push_back(all);
  }
  set_num_threads(0);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}
