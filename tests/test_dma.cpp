// dynamic_mask_attention on the CPU against brute-force selection + the float64 reference:
// ragged lengths, Sq != Sk, MHA/GQA/MQA, w = 1 and w >= Sk, ties, key padding, rows with
// nothing kept, softcap, scores added or not, every dtype.
#include <gtest/gtest.h>

#include "dma_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {
void run(const DmaCase& c) {
  SCOPED_TRACE(c.str());
  DmaRun r(c);
  r.forward();
  r.check_forward();
  r.backward();
  r.check_backward();
}
}  // namespace

TEST(DynamicMaskAttention, ShapesAndWindows) {
  uint64_t seed = 1;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {65, 65}, {100, 127}, {129, 63}, {1, 100}})
    for (auto [H, Hk] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}})
      for (int64_t w : {int64_t(1), int64_t(9), Sk, Sk + 4})
        for (bool causal : {true, false}) {
          DmaCase c;
          c.B = 2, c.Sq = Sq, c.Sk = Sk, c.H = H, c.Hk = Hk, c.D = 16, c.w = w, c.causal = causal, c.seed = seed++;
          run(c);
        }
}

TEST(DynamicMaskAttention, TiesPaddingAndNoScoreBias) {
  uint64_t seed = 100;
  for (bool ties : {false, true})
    for (bool padding : {false, true})
      for (bool add : {false, true}) {
        DmaCase c;
        c.B = 2, c.Sq = 90, c.Sk = 110, c.H = 4, c.Hk = 2, c.D = 16, c.w = 13, c.seed = seed++;
        c.ties = ties, c.padding = padding, c.add_scores = add;
        run(c);
      }
}

TEST(DynamicMaskAttention, RowsWithNothingKept) {
  // All keys padded in batch 1; causal with Sq > Sk leaves the first queries empty too.
  DmaCase c;
  c.B = 2, c.Sq = 40, c.Sk = 30, c.H = 2, c.Hk = 1, c.D = 8, c.w = 5, c.padding = true, c.seed = 7;
  DmaRun r(c);
  for (int64_t j = 0; j < c.Sk; ++j) r.pad.set(c.Sk + j, 0);
  r.rebuild_reference_mask();
  r.forward();
  r.check_forward();
  r.backward();
  r.check_backward();
  for (HostTensor* t : {&r.out, &r.dq, &r.dk, &r.dv, &r.dscores})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_FALSE(std::isnan(t->get(i)));
}

TEST(DynamicMaskAttention, DtypesSoftcapLayouts) {
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (bool score_in_q_dtype : {false, true}) {
      DmaCase c;
      c.B = 1, c.Sq = 70, c.Sk = 75, c.H = 4, c.Hk = 1, c.D = 32, c.w = 20, c.dtype = dt, c.seed = seed++;
      c.score_dtype = score_in_q_dtype ? dt : DType::f32;
      c.softcap = score_in_q_dtype ? 3.0 : 0.0;
      c.layout = score_in_q_dtype ? 1 : 0;
      run(c);
    }
}

TEST(DynamicMaskAttention, LongSequence) {
  DmaCase c;
  c.B = 1, c.Sq = 1000, c.Sk = 1000, c.H = 2, c.Hk = 1, c.D = 16, c.w = 64, c.padding = true, c.seed = 8;
  run(c);
}

TEST(DynamicMaskAttention, DeterministicAcrossThreadCounts) {
  DmaCase c;
  c.B = 1, c.Sq = 150, c.Sk = 150, c.H = 4, c.Hk = 2, c.D = 16, c.w = 30, c.seed = 9;
  std::vector<std::vector<unsigned char>> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    DmaRun r(c);
    r.forward();
    r.backward();
    std::vector<unsigned char> all;
    for (HostTensor* t : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv, &r.dscores})
      all.insert(all.end(), t->bytes().begin(), t->bytes().end());
    results.push_back(all);
  }
  set_num_threads(0);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}
