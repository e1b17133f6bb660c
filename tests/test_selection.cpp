// Top-w selection against brute force (sort each query's candidates, take w): ties, NaN,
// padding, causal and not, Sq != Sk, w = 1 .. beyond Sk.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "host_tensor.hpp"
#include "reference.hpp"

using namespace fdma;
using fdma::test::HostTensor;

namespace {

struct SelectCase {
  int64_t B, Hk, Sq, Sk, w;
  bool causal, padding, ties;
  DType dtype;
};

void run_select_case(const SelectCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor scores(c.dtype, {c.B, c.Hk, c.Sk}, {0, 2, 1}, 1);  // strided: Hk innermost, padded
  std::uniform_real_distribution<double> u(-3, 3);
  for (int64_t i = 0; i < scores.numel(); ++i) {
    double x = u(rng);
    scores.set(i, c.ties ? std::round(x) : x);  // rounding makes many exact ties
  }
  if (c.ties && c.dtype != DType::f16 && scores.numel() > 3) scores.set(3, NAN);  // NaN ranks lowest
  HostTensor pad(DType::boolean, {c.B, c.Sk});
  if (c.padding) pad.fill_bool(rng, 0.8);
  HostTensor begin(DType::i32, {c.B, c.Hk, c.Sk}), end(DType::i32, {c.B, c.Hk, c.Sk});
  begin.poison();
  end.poison();

  SelectParams p;
  p.key_scores = scores.view();
  if (c.padding) p.key_padding = pad.view();
  p.num_queries = c.Sq;
  p.window = c.w;
  p.causal = c.causal;
  p.keep_begin = begin.view();
  p.keep_end = end.view();
  std::vector<unsigned char> ws(select_workspace_size(p));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  select_keys(p);

  std::vector<uint8_t> padding;
  if (c.padding)
    for (double x : pad.values()) padding.push_back(x != 0);
  auto keep = ref::select_brute(scores.values(), padding, c.B, c.Hk, c.Sq, c.Sk, c.w, c.causal);
  const auto bv = begin.values(), ev = end.values();
  int64_t mismatches = 0;
  for (int64_t r = 0; r < c.B * c.Hk; ++r)
    for (int64_t j = 0; j < c.Sk; ++j) {
      const int64_t lo = bv[r * c.Sk + j], hi = ev[r * c.Sk + j];
      if (lo >= hi) {
        EXPECT_TRUE(lo == 0 && hi == 0) << "unkept key must be (0, 0), got " << lo << ", " << hi;
      }
      for (int64_t i = 0; i < c.Sq; ++i) {
        const bool got = lo <= i && i < hi, want = keep[(r * c.Sq + i) * c.Sk + j];
        if (got != want && ++mismatches <= 10)
          ADD_FAILURE() << "row " << r << " query " << i << " key " << j << ": got " << got << " want " << want;
      }
    }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace

TEST(Selection, MatchesBruteForce) {
  uint64_t seed = 100;
  for (bool causal : {true, false})
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {65, 65}, {40, 129}, {100, 37}, {1, 50}})
      for (int64_t w : {int64_t(1), int64_t(2), int64_t(5), Sk - 1, Sk, Sk + 3})
        for (bool padding : {false, true})
          for (bool ties : {false, true}) {
            if (w < 1) continue;
            SCOPED_TRACE(testing::Message() << "causal " << causal << " Sq " << Sq << " Sk " << Sk << " w " << w
                                            << " padding " << padding << " ties " << ties);
            run_select_case({2, 2, Sq, Sk, w, causal, padding, ties, ties ? DType::f32 : DType::bf16}, seed++);
          }
}

TEST(Selection, MoreHeadsAndMidWindows) {
  uint64_t seed = 500;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{63, 64}, {65, 65}, {129, 40}, {300, 300}})
    for (int64_t w : {2, 17})
      for (bool ties : {false, true}) {
        SCOPED_TRACE(testing::Message() << "Sq " << Sq << " Sk " << Sk << " w " << w << " ties " << ties);
        run_select_case({2, 3, Sq, Sk, w, true, true, ties, ties ? DType::f32 : DType::bf16}, seed++);
      }
}

TEST(Selection, EveryScoreDtype) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
    run_select_case({1, 3, 50, 80, 9, true, true, true, dt}, 7);
}

TEST(Selection, LongSequence) { run_select_case({1, 1, 1000, 1000, 64, true, true, false, DType::f32}, 9); }

// The suites' cases take their kept keys from ref::select_ranked (one sort a row); it must
// keep what brute force keeps: ties, NaN, signed zeros, padding, causal and not, Sq != Sk,
// w from 0 to beyond Sk.
TEST(Selection, RankedReferenceMatchesBruteForce) {
  std::mt19937_64 rng(77);
  int64_t cases = 0;
  for (bool causal : {true, false})
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {9, 9}, {40, 129}, {129, 40}, {1, 300}, {200, 200}})
      for (int64_t w : {int64_t(0), int64_t(1), int64_t(3), Sk / 2, Sk, Sk + 2})
        for (int variant = 0; variant < 3; ++variant) {
          const int64_t B = 2, Hk = 2;
          std::vector<double> scores(B * Hk * Sk);
          std::uniform_real_distribution<double> u(-2, 2);
          for (size_t i = 0; i < scores.size(); ++i) {
            const double x = u(rng);
            scores[i] = variant == 0 ? x : std::round(x);  // rounded: many exact ties
            if (variant == 2 && i % 5 == 1) scores[i] = i % 2 ? NAN : -0.0;
          }
          std::vector<uint8_t> padding;
          if (variant > 0) {
            std::bernoulli_distribution keep(0.8);
            for (int64_t j = 0; j < B * Sk; ++j) padding.push_back(keep(rng));
          }
          EXPECT_TRUE(ref::select_ranked(scores, padding, B, Hk, Sq, Sk, w, causal) ==
                      ref::select_brute(scores, padding, B, Hk, Sq, Sk, w, causal))
              << "causal " << causal << " Sq " << Sq << " Sk " << Sk << " w " << w << " variant " << variant;
          ++cases;
        }
  EXPECT_EQ(cases, 2 * 6 * 6 * 3);
}
