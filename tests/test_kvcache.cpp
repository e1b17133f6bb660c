// Attention against a KV cache on the CPU against the float64 reference: ragged lengths
// (0, 1, < w, = w, > w, not multiples of 16 or of the page size), paged caches with shuffled
// pages against contiguous ones, appended tokens, Sq 1..16 and chunked prefill, GQA, ties and
// NaN scores, dense attention; and the errors bad input gets.
#include <gtest/gtest.h>

#include <cmath>

#include "kvcache_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

void check(KvRun& r) {
  SCOPED_TRACE(r.c.str());
  r.run_cpu();
  if (r.c.Snew) r.append_reference();
  auto [ref_out, ref_lse] = r.reference();
  EXPECT_TRUE(all_close(r.out.values(), ref_out, forward_tol(r.c.dtype, ref_out), "out")) << r.c.str();
  EXPECT_TRUE(all_close(r.lse.values(), ref_lse, {1e-5, 2e-6}, "lse")) << r.c.str();
}

}  // namespace

TEST(KvCache, RaggedLengthsAroundTheWindow) {
  uint64_t seed = 1;
  for (int64_t Sq : {1, 3, 16})
    for (int64_t page : {0, 16})
      for (bool causal : {true, false}) {
        KvCase c;
        c.B = 6, c.Sq = Sq, c.H = 4, c.Hk = 2, c.D = 16, c.w = 9, c.max_len = 70, c.page_size = page;
        c.causal = causal, c.seed = seed++;
        c.lens = {0, 1, 8, 9, 10, 70};
        KvRun r(c);
        check(r);
      }
}

TEST(KvCache, PagedEqualsContiguous) {
  for (int64_t page : {16, 32, 64}) {
    KvCase c;
    c.B = 3, c.Sq = 2, c.H = 8, c.Hk = 2, c.D = 32, c.w = 20, c.max_len = 150, c.seed = 40 + page;
    c.lens = {149, 77, 33};
    KvRun contiguous(c);
    contiguous.run_cpu();
    c.page_size = page;
    KvRun paged(c);
    paged.run_cpu();
    EXPECT_EQ(contiguous.out.values(), paged.out.values()) << c.str();
    EXPECT_EQ(contiguous.lse.values(), paged.lse.values()) << c.str();
  }
}

TEST(KvCache, AppendsNewTokensFirst) {
  uint64_t seed = 60;
  for (int64_t page : {0, 16})
    for (int64_t Snew : {1, 4})
      for (bool dynamic : {true, false}) {
        KvCase c;
        c.B = 3, c.Sq = Snew, c.H = 4, c.Hk = 1, c.D = 16, c.w = 6, c.max_len = 50, c.page_size = page;
        c.Snew = Snew, c.dynamic = dynamic, c.seed = seed++;
        c.lens = {0, 13, 50 - Snew};
        KvRun r(c);
        check(r);
        // The caches now hold the new tokens at cache_seqlens[b] + t.
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < Snew; ++t) {
            const int64_t j = c.lens[b] + t;
            const int64_t page_b = page ? r.page_of[b * r.max_pages + j / page] : b;
            const int64_t slot = page ? j % page : j;
            const int64_t rows = page ? page : c.max_len;
            EXPECT_EQ(r.k_cache.get(((page_b * rows + slot) * c.Hk) * c.D), r.k_new.get(((b * Snew + t) * c.Hk) * c.D));
            EXPECT_EQ(r.v_cache.get(((page_b * rows + slot) * c.Hk) * c.D + 3),
                      r.v_new.get(((b * Snew + t) * c.Hk) * c.D + 3));
          }
      }
}

TEST(KvCache, GroupsHeadDimsDtypesAndSoftcap) {
  uint64_t seed = 80;
  for (auto [H, Hk] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {8, 1}})
    for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
      KvCase c;
      c.B = 2, c.Sq = 4, c.H = H, c.Hk = Hk, c.D = dt == DType::f64 ? 8 : 64, c.w = 12, c.max_len = 64;
      c.dtype = dt, c.score_dtype = dt == DType::f32 ? DType::f32 : dt, c.softcap = dt == DType::bf16 ? 5.0 : 0.0;
      c.seed = seed++;
      KvRun r(c);
      check(r);
    }
}

TEST(KvCache, TiesNanScoresAndNoScoreBias) {
  uint64_t seed = 100;
  for (bool ties : {false, true})
    for (bool nan : {false, true})
      for (bool add : {false, true}) {
        KvCase c;
        c.B = 2, c.Sq = 5, c.H = 2, c.Hk = 1, c.D = 16, c.w = 7, c.max_len = 60, c.page_size = 16;
        c.ties = ties, c.nan_scores = nan, c.add_scores = add, c.seed = seed++;
        KvRun r(c);
        check(r);
      }
}

TEST(KvCache, ChunkedPrefill) {
  KvCase c;
  c.B = 2, c.Sq = 100, c.H = 4, c.Hk = 2, c.D = 16, c.w = 24, c.max_len = 300, c.page_size = 32, c.Snew = 100;
  c.lens = {150, 0};
  c.seed = 120;
  KvRun r(c);
  check(r);
}

TEST(KvCache, DenseAttention) {
  uint64_t seed = 140;
  for (bool causal : {true, false}) {
    KvCase c;
    c.B = 3, c.Sq = 3, c.H = 4, c.Hk = 2, c.D = 16, c.max_len = 80, c.page_size = 16, c.dynamic = false;
    c.causal = causal, c.seed = seed++;
    c.lens = {0, 2, 80};
    KvRun r(c);
    check(r);
  }
}

// select_state: after a call, each row holds its cache's length and the positions of its
// top-w keys, ascending, whatever it held before (the CPU selects from scratch every call).
TEST(KvCache, SelectStateHoldsEachRowsTopW) {
  uint64_t seed = 400;
  for (int64_t page : {0, 16})
    for (bool ties : {false, true})
      for (int64_t Snew : {0, 1, 3}) {
        KvCase c;
        c.B = 5, c.Sq = Snew ? Snew : 2, c.H = 4, c.Hk = 2, c.D = 16, c.w = 10, c.max_len = 64, c.page_size = page;
        c.Snew = Snew, c.ties = ties, c.nan_scores = !ties, c.state = true, c.seed = seed++;
        c.lens = {0, 1, 9, 10, 64 - Snew};
        KvRun r(c);
        for (int64_t i = 0; i < r.state.numel(); ++i) r.state.set(i, double(int64_t(i * 7919 % 97) - 20));  // junk
        check(r);
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t hk = 0; hk < c.Hk; ++hk) EXPECT_EQ(r.state_row(b, hk), r.expected_state_row(b, hk)) << b << " " << hk;
      }
}

// --- bad input: a clear error naming the argument, and nothing written -----------------------

namespace {

std::string error_of(const KvCacheParams& p) {
  try {
    std::vector<unsigned char> ws(1 << 20);
    KvCacheParams w = p;
    w.workspace = ws.data(), w.workspace_bytes = ws.size();
    kvcache_forward(w);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KvCache, BadInputNamesTheArgument) {
  KvCase c;
  c.B = 2, c.Sq = 1, c.H = 4, c.Hk = 2, c.D = 16, c.w = 4, c.max_len = 32, c.page_size = 16, c.Snew = 1;
  c.lens = {3, 5};
  KvRun r(c);
  auto expect = [&](KvCacheParams p, const std::string& needle) {
    r.out.poison();
    const std::string msg = error_of(p);
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected an error naming '" << needle << "', got: " << msg;
    EXPECT_TRUE(r.out.all_poisoned()) << needle;
  };
  KvCacheParams p = r.params();
  {
    HostTensor lens(DType::i32, {2});
    lens.set(0, 3), lens.set(1, 32);  // 32 + 1 appended > 32 positions
    KvCacheParams b = p;
    b.cache_seqlens = lens.view();
    expect(b, "cache_seqlens[1]");
    lens.set(1, -1);
    expect(b, "cache_seqlens[1]");
  }
  {
    HostTensor table = r.table;
    table.set(0, 999);  // the first page of sequence 0 (entries past a length are never read)
    KvCacheParams b = p;
    b.block_table = table.view();
    expect(b, "block_table[0, 0]");
  }
  {
    HostTensor cache(c.dtype, {r.num_pages, 24, c.Hk, c.D});
    KvCacheParams b = p;
    b.k_cache = b.v_cache = cache.view();
    expect(b, "page_size");
  }
  {
    KvCacheParams b = p;
    b.scores = Tensor();
    expect(b, "scores is required");
    b = p;
    b.window = 0;
    expect(b, "window");
    b = p;
    b.score_cache = Tensor();
    b.scores = Tensor();
    expect(b, "needs score_cache");
    b = p;
    b.v = Tensor();
    expect(b, "k and v go together");
  }
  {
    HostTensor lens(DType::f32, {2});
    KvCacheParams b = p;
    b.cache_seqlens = lens.view();
    expect(b, "cache_seqlens has dtype float32");
  }
  {
    HostTensor state(DType::i32, {2, 2, 1 + 4});  // window 4: 1 + 2 * 4 entries a row
    KvCacheParams b = p;
    b.select_state = state.view();
    expect(b, "select_state.shape[2]");
    HostTensor fstate(DType::f32, {2, 2, 1 + 2 * 4});
    b.select_state = fstate.view();
    expect(b, "select_state has dtype float32");
    HostTensor ok(DType::i32, {2, 2, 1 + 2 * 4});
    b = p;
    b.select_state = ok.view();
    b.score_cache = Tensor(), b.scores = Tensor(), b.window = 0;
    expect(b, "select_state is given but score_cache is not");
  }
  {
    HostTensor sc(DType::f32, {r.num_pages, 16, 3});
    KvCacheParams b = p;
    b.score_cache = sc.view();
    expect(b, "score_cache.shape[2]");
  }
}
