// dynamic_mask_attention on the CPU against brute-force selection + the float64 reference:
// ragged lengths, Sq != Sk, MHA/GQA/MQA, w = 1 and w >= Sk, ties, key padding, rows with
// nothing kept, softcap, scores added or not, every dtype.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <thread>

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

// Any window up to INT64_MAX keeps every key. Found by the fuzzer: the CPU sized its per-worker
// lists as window + 64, which overflowed.
TEST(DynamicMaskAttention, LargestWindowKeepsEveryKey) {
  for (bool causal : {true, false}) {
    DmaCase c;
    c.B = 1, c.Sq = 9, c.Sk = 70, c.H = 2, c.Hk = 1, c.D = 16, c.w = std::numeric_limits<int64_t>::max();
    c.causal = causal, c.seed = 77;
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

// The same call from several threads at once (each with its own outputs and workspace, the
// inputs shared) gives the bits of one call at a time: the CPU backend's worker pool serves
// concurrent callers.
TEST(DynamicMaskAttention, ConcurrentCallsGiveTheSameBits) {
  DmaCase c;
  c.B = 2, c.Sq = 120, c.Sk = 130, c.H = 4, c.Hk = 2, c.D = 16, c.w = 25, c.padding = true, c.seed = 11;
  auto bits = [](DmaRun& r) {
    r.forward();
    r.backward();
    std::vector<unsigned char> all;
    for (HostTensor* t : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv, &r.dscores})
      all.insert(all.end(), t->bytes().begin(), t->bytes().end());
    return all;
  };
  DmaRun alone(c);
  const std::vector<unsigned char> expected = bits(alone);
  constexpr int kThreads = 4, kRepeats = 3;
  std::vector<std::unique_ptr<DmaRun>> runs;
  for (int t = 0; t < kThreads; ++t) runs.push_back(std::make_unique<DmaRun>(c));
  std::vector<std::vector<unsigned char>> got(kThreads * kRepeats);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < kRepeats; ++k) got[t * kRepeats + k] = bits(*runs[t]);
    });
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == expected) << "thread " << i / kRepeats << " call " << i % kRepeats;
}

// keep_begin/keep_end: the forward writes its selection there (exactly select_keys'), and a
// backward given them computes bitwise what it computes when it selects again.
TEST(DynamicMaskAttention, BackwardReusesTheForwardsSelection) {
  uint64_t seed = 300;
  for (bool causal : {true, false})
    for (bool padding : {false, true}) {
      DmaCase c;
      c.B = 2, c.Sq = 70, c.Sk = 90, c.H = 4, c.Hk = 2, c.D = 16, c.w = 11, c.seed = seed++;
      c.causal = causal, c.padding = padding, c.ties = padding;
      SCOPED_TRACE(c.str());
      DmaRun r(c);
      r.forward();
      const auto out_selecting = r.out.bytes();
      r.backward();
      const std::vector<std::vector<unsigned char>> grads_selecting = {r.dq.bytes(), r.dk.bytes(), r.dv.bytes(),
                                                                       r.dscores.bytes()};
      r.with_intervals = true;
      r.keep_begin.poison();
      r.keep_end.poison();
      r.forward();
      EXPECT_TRUE(r.out.bytes() == out_selecting);
      const auto [begin, end] = r.cpu_selection();
      EXPECT_EQ(r.keep_begin.values(), begin);
      EXPECT_EQ(r.keep_end.values(), end);
      r.backward();
      r.check_backward();
      EXPECT_TRUE(r.dq.bytes() == grads_selecting[0]);
      EXPECT_TRUE(r.dk.bytes() == grads_selecting[1]);
      EXPECT_TRUE(r.dv.bytes() == grads_selecting[2]);
      EXPECT_TRUE(r.dscores.bytes() == grads_selecting[3]);
    }
}

// A NaN in a key's K row reaches only the queries that keep the key (a garbage or padded key
// must not poison queries that never attend to it): out and lse match the reference, NaN in
// exactly the rows that keep a poisoned key. Causal: keys kept by some queries and not others,
// and keys no query keeps; non-causal (every query keeps the same keys): keys no query keeps.
TEST(DynamicMaskAttention, NanKeyRowsReachOnlyTheQueriesThatKeepThem) {
  for (bool causal : {true, false}) {
    DmaCase c;
    c.B = 1, c.Sq = 90, c.Sk = 120, c.H = 4, c.Hk = 2, c.D = 16, c.w = 6, c.seed = 320, c.causal = causal;
    SCOPED_TRACE(c.str());
    DmaRun r(c);
    const int64_t nan_rows = r.poison_key_rows(3);
    if (causal) {
      ASSERT_GT(nan_rows, 0);
    }
    ASSERT_LT(nan_rows, c.B * c.Sq * c.H);
    r.forward();
    r.check_forward();
  }
}

// Intervals that are no selection's (out of range, reversed, more keys than w per query)
// give wrong gradients but run within bounds: they are clamped to the queries that exist.
TEST(DynamicMaskAttention, MadeUpIntervalsStayInBounds) {
  DmaCase c;
  c.B = 1, c.Sq = 50, c.Sk = 300, c.H = 2, c.Hk = 1, c.D = 16, c.w = 3, c.seed = 310;  // lists of w + 64 keys
  DmaRun r(c);
  r.forward();
  r.make_up_intervals(5);
  r.backward();  // no crash; every gradient written
  for (HostTensor* t : {&r.dq, &r.dk, &r.dv, &r.dscores})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_FALSE(std::isnan(t->get(i))) << i;
}
