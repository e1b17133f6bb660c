// Attention against a KV cache on the GPU (the decode path) against the float64 reference,
// with the CPU backend's error on the same inputs as the yardstick (FlashAttention's rule):
// ragged lengths around the window, paged caches with shuffled pages, appended tokens, Sq
// 1..16 and a chunked prefill, GQA 1..8, head dims 64/128/256, long rows that take many
// selection CTAs, 16-bit and tied scores, NaN scores, dense attention; and lengths and page
// tables that point outside the cache, which must never move an access out of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "device_tensor.hpp"
#include "kvcache_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

// The GPU call on device copies of r's tensors; the caches come back (appends) into r.
void run_gpu(KvRun& r) {
  std::vector<HostTensor*> hosts = {&r.q, &r.k_cache, &r.v_cache, &r.score_cache, &r.seqlens, &r.out, &r.lse};
  if (r.c.page_size) hosts.push_back(&r.table);
  if (r.c.Snew) hosts.insert(hosts.end(), {&r.k_new, &r.v_new, &r.s_new});
  if (r.c.state) hosts.push_back(&r.state);
  std::vector<std::unique_ptr<DeviceTensor>> dev;
  for (HostTensor* h : hosts) dev.push_back(std::make_unique<DeviceTensor>(*h));
  auto view = [&](HostTensor& h) {
    for (size_t i = 0; i < hosts.size(); ++i)
      if (hosts[i] == &h) return dev[i]->view();
    return Tensor();
  };
  auto device_of = [&](HostTensor& h) -> DeviceTensor& {
    for (size_t i = 0; i < hosts.size(); ++i)
      if (hosts[i] == &h) return *dev[i];
    return *dev[0];
  };
  device_of(r.out).poison();
  device_of(r.lse).poison();
  KvCacheParams p = r.params();
  p.q = view(r.q), p.k_cache = view(r.k_cache), p.v_cache = view(r.v_cache);
  if (r.c.dynamic) p.score_cache = view(r.score_cache);
  p.cache_seqlens = view(r.seqlens);
  if (r.c.page_size) p.block_table = view(r.table);
  if (r.c.Snew) {
    p.k = view(r.k_new), p.v = view(r.v_new);
    if (r.c.dynamic) p.scores = view(r.s_new);
  }
  p.out = view(r.out), p.lse = view(r.lse);
  if (r.c.state) p.select_state = view(r.state);
  const size_t bytes = kvcache_workspace_size(p);
  void* ws = nullptr;
  if (bytes) {
    ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  }
  // The workspace's content is the caller's: whatever the call needs zeroed, it zeroes.
  if (bytes) {
    ASSERT_EQ(cudaMemset(ws, 0xff, bytes), cudaSuccess);
  }
  p.workspace = ws, p.workspace_bytes = bytes;
  kvcache_forward(p);
  FDMA_CUDA_OK(cudaDeviceSynchronize());
  if (ws) cudaFree(ws);
  for (HostTensor* h : {&r.out, &r.lse, &r.k_cache, &r.v_cache, &r.score_cache}) device_of(*h).download();
  if (r.c.state) device_of(r.state).download();
}

// One call on the CPU and the GPU from the same inputs: GPU out/lse against the reference,
// within twice the CPU backend's error plus rounding; appends and select_state byte for byte.
void compare_step(KvRun& cpu, KvRun& gpu) {
  const KvCase& c = cpu.c;
  SCOPED_TRACE(c.str());
  cpu.run_cpu();
  run_gpu(gpu);
  if (c.Snew) {
    // Bytes, not values: NaN scores compare unequal to themselves.
    EXPECT_TRUE(cpu.k_cache.bytes() == gpu.k_cache.bytes()) << "appended k";
    EXPECT_TRUE(cpu.v_cache.bytes() == gpu.v_cache.bytes()) << "appended v";
    if (c.dynamic) {
      EXPECT_TRUE(cpu.score_cache.bytes() == gpu.score_cache.bytes()) << "appended scores";
    }
    cpu.append_reference();
  }
  auto [ref_out, ref_lse] = cpu.reference();
  const auto co = cpu.out.values(), go = gpu.out.values();
  const double bound = 2 * max_err(co, ref_out) + unit(c.dtype) * std::max(1e-3, max_abs(ref_out)) + 1e-4;
  EXPECT_TRUE(all_close(go, ref_out, {bound, 0.0}, "out (GPU)")) << "CPU error " << max_err(co, ref_out);
  EXPECT_TRUE(all_close(gpu.lse.values(), ref_lse, {2e-3, 1e-3}, "lse (GPU)"));
  if (c.state) {
    EXPECT_TRUE(cpu.state.bytes() == gpu.state.bytes()) << "select_state";
  }
}

// Each GPU run gets a copy of the CPU run's inputs (the same draws, built once: a 40K-key paged
// cache took seconds to build).
void check_case(const KvCase& c) {
  KvRun cpu(c), gpu = cpu;
  compare_step(cpu, gpu);
}

// A generation loop: `steps` calls, each appending Snew tokens, cache_seqlens advanced between.
void check_loop(const KvCase& c, int steps) {
  KvRun cpu(c), gpu = cpu;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    compare_step(cpu, gpu);
    if (::testing::Test::HasFailure()) return;
    for (KvRun* r : {&cpu, &gpu}) {
      r->advance();
      r->next_tokens(c.seed * 1000 + s);
    }
  }
}

}  // namespace

TEST(KvCacheGpu, DecodeRaggedPagedGroups) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (int64_t page : {0, 16, 64})
    for (auto [H, Hk] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {8, 1}})
      for (bool causal : {true, false}) {
        KvCase c;
        c.B = 6, c.Sq = 1, c.H = H, c.Hk = Hk, c.D = 64, c.w = 40, c.max_len = 300, c.page_size = page;
        c.causal = causal, c.dtype = DType::bf16, c.seed = seed++;
        c.lens = {0, 1, 39, 40, 41, 300};
        check_case(c);
      }
}

TEST(KvCacheGpu, SpeculativeQueriesAndChunkedPrefill) {
  REQUIRE_GPU();
  uint64_t seed = 30;
  for (int64_t Sq : {2, 4, 16, 100})
    for (int64_t page : {0, 32}) {
      KvCase c;
      c.B = 3, c.Sq = Sq, c.H = 8, c.Hk = 2, c.D = 128, c.w = 50, c.max_len = 400, c.page_size = page;
      c.dtype = DType::f16, c.seed = seed++;
      c.lens = {0, 60, 400 - 0};
      check_case(c);
    }
}

TEST(KvCacheGpu, LongRowsManySelectionCtas) {
  REQUIRE_GPU();
  uint64_t seed = 60;
  for (DType sdt : {DType::f32, DType::bf16})
    for (bool ties : {false, true}) {
      KvCase c;
      c.B = 2, c.Sq = 3, c.H = 4, c.Hk = 2, c.D = 128, c.w = 700, c.max_len = 40000, c.page_size = 64;
      c.dtype = DType::bf16, c.score_dtype = sdt, c.ties = ties, c.seed = seed++;
      c.lens = {39999, 9000};
      check_case(c);
    }
}

TEST(KvCacheGpu, AppendsHeadDimsSoftcapNan) {
  REQUIRE_GPU();
  uint64_t seed = 90;
  for (int64_t D : {64, 128, 256})
    for (bool nan : {false, true}) {
      KvCase c;
      c.B = 2, c.Sq = 2, c.H = 4, c.Hk = 1, c.D = D, c.w = 30, c.max_len = 200, c.page_size = 16, c.Snew = 2;
      c.dtype = DType::bf16, c.nan_scores = nan, c.softcap = nan ? 0.0 : 10.0, c.add_scores = !nan || D != 64;
      c.seed = seed++;
      c.lens = {100, 198};
      check_case(c);
    }
}

// Every key's score near -FLT_MAX, as a caller's sentinel might be: a row's kept keys tie, and
// it gets their mean (times log2(e), such a score would overflow to -inf and hide the row).
TEST(KvCacheGpu, SentinelScoresGiveTheKeptKeysMean) {
  REQUIRE_GPU();
  uint64_t seed = 110;
  for (int64_t Sq : {1, 3}) {
    KvCase c;
    c.B = 2, c.Sq = Sq, c.H = 4, c.Hk = 2, c.D = 128, c.w = 30, c.max_len = 300, c.page_size = 16, c.Snew = 1;
    c.dtype = DType::bf16, c.score_shift = -3e38, c.seed = seed++;
    c.lens = {100, 298};
    check_case(c);
  }
}

TEST(KvCacheGpu, DenseAttention) {
  REQUIRE_GPU();
  uint64_t seed = 120;
  for (int64_t page : {0, 16})
    for (int64_t Sq : {1, 5}) {
      KvCase c;
      c.B = 3, c.Sq = Sq, c.H = 8, c.Hk = 2, c.D = 64, c.max_len = 3000, c.page_size = page, c.dynamic = false;
      c.dtype = DType::bf16, c.seed = seed++, c.Snew = 1;
      c.lens = {0, 7, 2999};
      check_case(c);
    }
}

// Lengths past the cache are clamped to it; pages outside the cache hold no keys. Nothing is
// read or written out of bounds (compute-sanitizer runs this test on the device).
TEST(KvCacheGpu, OutOfRangeLengthsAndPagesStayInBounds) {
  REQUIRE_GPU();
  for (int64_t Sq : {2, 70}) {  // decode and chunked prefill
  SCOPED_TRACE("Sq " + std::to_string(Sq));
  KvCase c;
  c.B = 3, c.Sq = Sq, c.H = 4, c.Hk = 2, c.D = 64, c.w = 20, c.max_len = 128, c.page_size = 16, c.Snew = 1;
  c.dtype = DType::bf16, c.seed = 150;
  c.lens = {10, 20, 30};
  KvRun r(c);
  r.seqlens.set(0, 1000);   // past the capacity: clamped to 128
  r.seqlens.set(1, -50);    // negative: no key, nothing appended
  r.table.set(2 * r.max_pages + 0, 1 << 30);  // sequence 2's first page: not the cache's
  r.table.set(2 * r.max_pages + 1, -3);
  run_gpu(r);
  for (int64_t i = 0; i < r.out.numel(); ++i) ASSERT_TRUE(std::isfinite(r.out.get(i))) << i;
  // Sequence 1 sees no key: zeros and -inf.
  for (int64_t i = 0; i < c.Sq * c.H * c.D; ++i) EXPECT_EQ(r.out.get(c.Sq * c.H * c.D + i), 0.0);
  for (int64_t i = 0; i < c.H * c.Sq; ++i) EXPECT_EQ(r.lse.get(c.H * c.Sq + i), -INFINITY);
  }
}

// Bad shapes on device tensors: the same errors as on the CPU, raised before any launch.
TEST(KvCacheGpu, BadInputNamesTheArgument) {
  REQUIRE_GPU();
  KvCase c;
  c.B = 2, c.Sq = 1, c.H = 4, c.Hk = 2, c.D = 64, c.w = 4, c.max_len = 32, c.dtype = DType::bf16, c.seed = 170;
  c.lens = {3, 5};
  KvRun r(c);
  HostTensor bad_scores(DType::f32, {2, 1, 32});
  DeviceTensor q(r.q), kc(r.k_cache), vc(r.v_cache), lens(r.seqlens), out(r.out), sc(bad_scores);
  KvCacheParams p;
  p.q = q.view(), p.k_cache = kc.view(), p.v_cache = vc.view(), p.cache_seqlens = lens.view(), p.out = out.view();
  p.score_cache = sc.view(), p.window = 4;
  try {
    kvcache_workspace_size(p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("score_cache.shape[1]"), std::string::npos) << e.what();
  }
}

// Both selection paths on every row length: the portable passes (what rows longer than one
// CTA's 8192 candidates take on Hopper, and every row elsewhere) and the cluster kernel with
// several CTAs a row (FDMA_DECODE_SELECT forces either).
TEST(KvCacheGpu, BothSelectionPaths) {
  REQUIRE_GPU();
  ScopedEnv env("FDMA_DECODE_SELECT");
  for (const char* path : {"passes", "cluster"}) {
  env.set(path);
  uint64_t seed = 190;
  for (bool ties : {false, true})
    for (int64_t Sq : {1, 4}) {
      KvCase c;
      c.B = 3, c.Sq = Sq, c.H = 8, c.Hk = 2, c.D = 64, c.w = 300, c.max_len = 40000, c.page_size = 32;
      c.dtype = DType::bf16, c.score_dtype = ties ? DType::bf16 : DType::f32, c.ties = ties, c.seed = seed++;
      c.lens = {39999, 301, 299};
      SCOPED_TRACE(path);
      check_case(c);
    }
  }
}

// select_state in generation loops: the first call selects from scratch (or grows an empty
// state over a short cache), the later ones grow it by their new keys. Every step against the
// reference and the state against the CPU's. Float16 scores in [-2, 2) differ below the high 16
// bits of their float value, which the selection must still rank.
TEST(KvCacheGpu, SelectStateDecodeLoops) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (int64_t page : {0, 16})
    for (DType sdt : {DType::f32, DType::bf16, DType::f16})
      for (int64_t Sq : {1, 4})
        for (bool causal : {true, false}) {
          KvCase c;
          c.B = 4, c.Sq = Sq, c.Snew = Sq, c.H = 8, c.Hk = 2, c.D = 64, c.w = 40, c.max_len = 640, c.page_size = page;
          c.causal = causal, c.dtype = sdt == DType::f16 ? DType::f16 : DType::bf16, c.score_dtype = sdt;
          c.ties = sdt == DType::bf16;
          c.state = true, c.seed = seed++;
          c.lens = {0, 30, 45, 500};
          check_loop(c, 5);
        }
}

// Windows long enough that each row's keys split across several CTAs, with a state: the
// split-K merge over lists the state kernel wrote, across a generation loop.
TEST(KvCacheGpu, SelectStateSplitRows) {
  REQUIRE_GPU();
  uint64_t seed = 320;
  for (int64_t page : {0, 32})
    for (int64_t Sq : {1, 3}) {
      KvCase c;
      c.B = 2, c.Sq = Sq, c.Snew = Sq, c.H = 8, c.Hk = 2, c.D = 128, c.w = 700, c.max_len = 3000, c.page_size = page;
      c.dtype = DType::bf16, c.state = true, c.seed = seed++;
      c.lens = {2500, 800};
      check_loop(c, 3);
    }
}

// Float16 scores without a state, through both selection paths (the same ranking rule).
TEST(KvCacheGpu, Float16ScoresRankBelowTheHighBits) {
  REQUIRE_GPU();
  ScopedEnv env("FDMA_DECODE_SELECT");
  uint64_t seed = 340;
  for (const char* path : {"passes", "cluster"}) {
    env.set(path);
    SCOPED_TRACE(path);
    KvCase c;
    c.B = 3, c.Sq = 2, c.H = 4, c.Hk = 2, c.D = 64, c.w = 100, c.max_len = 5000, c.page_size = 0;
    c.dtype = DType::f16, c.score_dtype = DType::f16, c.seed = seed++;
    c.lens = {4999, 700, 101};
    check_case(c);
  }
}

// States that do not describe the cache are rebuilt, never trusted: junk, a prefix longer
// than the keys before this call's appends (a rollback), positions out of order or range.
TEST(KvCacheGpu, SelectStateRebuildsWhatItCannotGrow) {
  REQUIRE_GPU();
  KvCase c;
  c.B = 3, c.Sq = 1, c.Snew = 1, c.H = 4, c.Hk = 2, c.D = 64, c.w = 20, c.max_len = 3000, c.page_size = 32;
  c.dtype = DType::bf16, c.state = true, c.seed = 360;
  c.lens = {2500, 700, 60};
  for (int kind = 0; kind < 4; ++kind) {
    SCOPED_TRACE("kind " + std::to_string(kind));
    KvRun cpu(c), gpu = cpu;
    compare_step(cpu, gpu);  // a valid state for every row
    for (KvRun* r : {&cpu, &gpu}) {
      r->advance();
      if (kind == 1)  // rolled back by two: the state describes keys this call rewrites
        for (int64_t b = 0; b < c.B; ++b) {
          r->c.lens[b] -= 2;
          r->seqlens.set(b, double(r->c.lens[b]));
        }
      const int64_t n = r->state.shape()[2], slots = (n - 1) / 2;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t hk = 0; hk < c.Hk; ++hk) {
          const int64_t row = (b * c.Hk + hk) * n;
          if (kind == 0)  // the prefix right, the positions junk
            for (int64_t i = 1; i <= slots; ++i) r->state.set(row + i, double(int64_t(i * 2654435761u % 5000) - 100));
          if (kind == 2) {  // two positions out of order
            const double x = r->state.get(row + 3);
            r->state.set(row + 3, r->state.get(row + 4));
            r->state.set(row + 4, x);
          }
          if (kind == 3) r->state.set(row + slots, 1e6);  // past the prefix
        }
      r->next_tokens(c.seed + kind);
    }
    compare_step(cpu, gpu);
  }
}

// Chunked prefill (more than 16 queries) runs the training forward over each row's compact
// range: the top-w of the keys before the chunk, then the chunk (causal), or the top-w of the
// cache (not). Lengths below the chunk (queries before position 0), 0, at and around the
// window, the whole cache; paged and contiguous; GQA 1..8; head dims 64..256; ties, NaN,
// 16-bit scores, softcap; with and without a state.
TEST(KvCacheGpu, ChunkedPrefillOverCompactRows) {
  REQUIRE_GPU();
  uint64_t seed = 400;
  struct Shape { int64_t Sq, H, Hk, D, page; DType sdt; bool ties, nan; double softcap; };
  for (const Shape& s : {Shape{17, 8, 8, 64, 0, DType::f32, false, false, 0.0},
                         Shape{64, 8, 2, 128, 16, DType::bf16, true, false, 0.0},
                         Shape{200, 8, 1, 128, 64, DType::f32, false, true, 0.0},
                         Shape{130, 4, 4, 256, 32, DType::f16, false, false, 20.0},
                         Shape{333, 16, 2, 64, 0, DType::f16, true, false, 0.0},
                         Shape{520, 8, 2, 64, 16, DType::bf16, true, false, 0.0}})  // non-causal's path too
    for (bool state : {false, true})
      for (bool causal : {true, false}) {
        KvCase c;
        c.B = 4, c.Sq = s.Sq, c.H = s.H, c.Hk = s.Hk, c.D = s.D, c.w = 60, c.max_len = 900, c.page_size = s.page;
        c.causal = causal, c.dtype = s.sdt == DType::f16 ? DType::f16 : DType::bf16, c.score_dtype = s.sdt;
        c.ties = s.ties, c.nan_scores = s.nan, c.softcap = s.softcap;
        c.state = state, c.seed = seed++;
        c.lens = {0, 10, c.w + c.Sq, 900};
        check_case(c);
      }
}

// A prompt in chunks, each appended by its own call with the state kept, then decode steps:
// the chunks grow the state from the one before (no rebuild), and the decode steps from them.
TEST(KvCacheGpu, ChunkedPrefillLoopThenDecode) {
  REQUIRE_GPU();
  for (int64_t page : {0, 32}) {
    KvCase c;
    c.B = 2, c.Sq = 96, c.Snew = 96, c.H = 8, c.Hk = 2, c.D = 128, c.w = 80, c.max_len = 1200, c.page_size = page;
    c.dtype = DType::bf16, c.state = true, c.seed = 420 + uint64_t(page);
    c.lens = {0, 37};
    KvRun cpu(c), gpu = cpu;
    for (int step = 0; step < 8; ++step) {
      SCOPED_TRACE("chunk " + std::to_string(step));
      compare_step(cpu, gpu);
      if (::testing::Test::HasFailure()) return;
      for (KvRun* r : {&cpu, &gpu}) r->advance(), r->next_tokens(c.seed * 100 + uint64_t(step));
    }
    for (KvRun* r : {&cpu, &gpu}) r->resize_step(1), r->next_tokens(c.seed * 1000);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("decode " + std::to_string(step));
      compare_step(cpu, gpu);
      if (::testing::Test::HasFailure()) return;
      for (KvRun* r : {&cpu, &gpu}) r->advance(), r->next_tokens(c.seed * 1000 + 1 + uint64_t(step));
    }
  }
}

// A chunked prefill's state, then decode steps that grow it.
TEST(KvCacheGpu, SelectStateAfterChunkedPrefill) {
  REQUIRE_GPU();
  KvCase c;
  c.B = 2, c.Sq = 100, c.Snew = 100, c.H = 8, c.Hk = 2, c.D = 128, c.w = 64, c.max_len = 2000, c.page_size = 64;
  c.dtype = DType::bf16, c.state = true, c.seed = 380;
  c.lens = {0, 1200};
  KvRun cpu(c), gpu = cpu;
  compare_step(cpu, gpu);
}

// A state that describes a prefix is grown, not recomputed: one whose set is not that
// prefix's top-w (a contract violation the call cannot see) still comes back grown from it.
TEST(KvCacheGpu, SelectStateIsGrownFromWhatItHolds) {
  REQUIRE_GPU();
  KvCase c;
  c.B = 1, c.Sq = 1, c.Snew = 1, c.H = 2, c.Hk = 1, c.D = 64, c.w = 16, c.max_len = 1000;
  c.dtype = DType::bf16, c.state = true, c.seed = 390;
  c.lens = {900};
  KvRun r(c);
  r.state.set(0, 900);
  for (int64_t i = 0; i < c.w; ++i) r.state.set(1 + i, double(i));  // claims keys 0..15 are the top 16
  run_gpu(r);
  EXPECT_EQ(r.state.get(0), 901.0);
  int64_t from_claim = 0;
  for (int64_t i = 0; i < c.w; ++i) from_claim += r.state.get(1 + i) < c.w;
  EXPECT_GE(from_claim, c.w - 1) << "the state was recomputed instead of grown";
}

// Overlapped launches (FDMA_OVERLAP_LAUNCHES, on by default from sm_90): each kernel of a step
// after the first starts while its predecessor runs. Decode loops with a state, without one and
// dense, both ways: against the reference, and (where the list order is fixed: with a state,
// dense) the same bits either way.
// The attention's pipeline two and three blocks deep (FDMA_DECODE_STAGES; dense calls take
// three, dynamic ones two): both against the reference, and bit for bit alike (the same
// summation order). Head dims 64, 128 and 256 (Q in shared memory), GQA 4, paged and not.
TEST(KvCacheGpu, PipelineDepthsAgree) {
  REQUIRE_GPU();
  ScopedEnv env("FDMA_DECODE_STAGES");
  int variant = 0;
  for (int D : {64, 128, 256})
    for (bool dynamic : {false, true}) {
      KvCase c;
      c.B = 2, c.Sq = 2, c.Snew = 2, c.H = 8, c.Hk = 2, c.D = D, c.w = 300, c.max_len = 2100;
      c.page_size = dynamic ? 0 : 64, c.dtype = DType::f16, c.state = false, c.dynamic = dynamic;
      c.seed = 470 + uint64_t(variant++);
      c.lens = {700, 2090};
      std::vector<unsigned char> outs[2];
      for (int stages : {2, 3}) {
        SCOPED_TRACE("D " + std::to_string(D) + (dynamic ? " dynamic" : " dense") + " stages " + std::to_string(stages));
        env.set(stages == 2 ? "2" : "3");
        KvRun cpu(c), gpu = cpu;
        compare_step(cpu, gpu);
        if (::testing::Test::HasFailure()) return;
        outs[stages - 2] = gpu.out.bytes();
      }
      EXPECT_TRUE(outs[0] == outs[1]) << "D " << D << (dynamic ? " dynamic" : " dense");
    }
}

TEST(KvCacheGpu, OverlappedLaunchesBothWays) {
  REQUIRE_GPU();
  ScopedEnv env("FDMA_OVERLAP_LAUNCHES");
  for (int variant = 0; variant < 3; ++variant) {
    KvCase c;
    c.B = 3, c.Sq = 1, c.Snew = 1, c.H = 8, c.Hk = 2, c.D = 128, c.w = 100, c.max_len = 3000, c.page_size = 32;
    c.dtype = DType::bf16, c.state = variant == 0, c.dynamic = variant != 2, c.seed = 450 + uint64_t(variant);
    c.lens = {0, 200, 2900};
    std::vector<std::vector<unsigned char>> outs[2];
    for (int overlap : {0, 1}) {
      SCOPED_TRACE("variant " + std::to_string(variant) + " overlap " + std::to_string(overlap));
      env.set(overlap ? "1" : "0");
      KvRun cpu(c), gpu = cpu;
      for (int s = 0; s < 4; ++s) {
        compare_step(cpu, gpu);
        if (::testing::Test::HasFailure()) return;
        outs[overlap].push_back(gpu.out.bytes());
        for (KvRun* r : {&cpu, &gpu}) r->advance(), r->next_tokens(c.seed * 100 + uint64_t(s));
      }
    }
    if (variant != 1) {
      EXPECT_TRUE(outs[0] == outs[1]) << "variant " << variant;
    }
  }
}

// The select_state update with one, two and four rows a CTA (FDMA_STATE_ROWS_PER_CTA; more
// rows than SMs take several), in each of its modes: decode and speculative steps (Sq 1, 3:
// grown key by key), 20 queries (selected by the radix passes, the state refreshed) and a
// prefill chunk of 64 (the state's prefix set); ragged rows, a row count that leaves the last
// CTA's groups partly idle, and sets junked mid-loop so that some rows of a CTA are rebuilt by
// the whole CTA while the others grow; against the reference and bit for bit alike (state and
// output).
TEST(KvCacheGpu, StateRowsPerCtaAgree) {
  REQUIRE_GPU();
  ScopedEnv env("FDMA_STATE_ROWS_PER_CTA");
  for (int64_t Sq : {1, 3, 20, 64}) {
    KvCase c;
    c.B = 5, c.Sq = Sq, c.Snew = Sq, c.H = 6, c.Hk = 3, c.D = 64, c.w = 90, c.max_len = 1200 + 4 * Sq;
    c.page_size = 16;
    c.dtype = DType::bf16, c.state = true, c.seed = 480 + uint64_t(Sq);
    c.lens = {0, 50, 89, 700, 1100};
    std::vector<std::vector<unsigned char>> outs[3], states[3];
    for (int v = 0; v < 3; ++v) {
      const char* rows = v == 0 ? "1" : v == 1 ? "2" : "4";
      SCOPED_TRACE(std::string("rows a CTA ") + rows + " Sq " + std::to_string(Sq));
      env.set(rows);
      KvRun cpu(c), gpu = cpu;
      for (int s = 0; s < 4; ++s) {
        compare_step(cpu, gpu);
        if (::testing::Test::HasFailure()) return;
        outs[v].push_back(gpu.out.bytes());
        states[v].push_back(gpu.state.bytes());
        for (KvRun* r : {&cpu, &gpu}) {
          r->advance();
          r->next_tokens(c.seed * 100 + uint64_t(s));
          if (s == 1) {  // rows 1, 5 and 9 of 15 start over; their neighbours in the CTA grow
            const int64_t n = r->state.shape()[2];
            for (int64_t row : {1, 5, 9}) r->state.set(row * n, 0.0);
          }
        }
      }
    }
    EXPECT_TRUE(outs[0] == outs[1] && outs[0] == outs[2]) << "outputs differ across rows a CTA";
    EXPECT_TRUE(states[0] == states[1] && states[0] == states[2]) << "states differ across rows a CTA";
  }
}
