// dynamic_mask_attention (forward and backward, causal and not) and select on the GPU
// against the CPU backend and the float64 reference. The selection is compared exactly;
// outputs and gradients with the precision rule of test_attention_gpu.cpp. Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <thread>

#include "device_tensor.hpp"
#include "dma_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

struct GpuDma {
  DmaRun& r;
  DeviceTensor q, k, v, scores, pad, out, lse, dout, dq, dk, dv, dscores, keep_begin, keep_end;
  std::unique_ptr<DeviceWorkspace> ws;
  size_t workspace_bytes = 0;
  explicit GpuDma(DmaRun& run)
      : r(run), q(r.q), k(r.k), v(r.v), scores(r.scores), pad(r.pad), out(r.out), lse(r.lse), dout(r.dout), dq(r.dq),
        dk(r.dk), dv(r.dv), dscores(r.dscores), keep_begin(r.keep_begin), keep_end(r.keep_end) {}
  DmaParams params() const {
    DmaParams p = r.params();
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.key_scores = scores.view(), p.out = out.view(), p.lse = lse.view();
    if (r.c.padding) p.key_padding = pad.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view(), p.dkey_scores = dscores.view();
    if (r.with_intervals) p.keep_begin = keep_begin.view(), p.keep_end = keep_end.view();
    return p;
  }
  void run(Pass pass) {
    DmaParams p = params();
    const size_t bytes = dma_workspace_size(p, pass);
    workspace_bytes = bytes;
    ws = std::make_unique<DeviceWorkspace>(bytes);
    p.workspace = ws->ptr, p.workspace_bytes = bytes;
    if (pass == Pass::forward) {
      out.poison();
      lse.poison();
      dma_forward(p);
    } else {
      for (DeviceTensor* t : {&dq, &dk, &dv, &dscores}) t->poison();
      dma_backward(p);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

// Forward and backward on the GPU against the CPU backend and the float64 reference; the
// backward reads the CPU forward's out and lse so both backends see the same stored inputs.
void run_gpu_dma(DmaRun& r, bool backward = true) {
  const DmaCase& c = r.c;
  SCOPED_TRACE(c.str());
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values();
  const auto out_bytes = r.out.bytes(), lse_bytes = r.lse.bytes();
  const auto ref = ref::forward(r.rp);

  GpuDma gpu(r);
  gpu.run(Pass::forward);
  gpu.out.download();
  gpu.lse.download();
  EXPECT_TRUE(within_precision(r.out.values(), cpu_out, ref.out, max_abs(ref.out), c.dtype, "out"));
  EXPECT_TRUE(r.out.gaps_poisoned() && r.lse.gaps_poisoned()) << "out or lse written outside its elements";
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));
  if (!backward) return;

  r.out.bytes() = out_bytes;
  r.lse.bytes() = lse_bytes;
  gpu.out.upload();
  gpu.lse.upload();
  r.backward();
  const auto cpu_dq = r.dq.values(), cpu_dk = r.dk.values(), cpu_dv = r.dv.values(), cpu_ds = r.dscores.values();
  const auto g = ref::backward(r.rp, r.dout.values());
  gpu.run(Pass::backward);
  for (DeviceTensor* t : {&gpu.dq, &gpu.dk, &gpu.dv, &gpu.dscores}) t->download();
  // dS = P (dP - delta) cancels exactly when a query keeps one key (w = 1: out = v_j), where
  // the GPU's mma sum for dP and its delta sum round differently: allow fp32 noise on each
  // of the G * Sq terms a key's gradient sums (|dP| <= D, |q| <= 1.5 here).
  const double cancel_floor = double(c.H / c.Hk) * c.Sq * c.D * 1.2e-7 * 1.5;
  EXPECT_TRUE(within_precision(r.dq.values(), cpu_dq, g.dq, max_abs(g.dq), c.dtype, "dq", cancel_floor));
  EXPECT_TRUE(within_precision(r.dk.values(), cpu_dk, g.dk, max_abs(g.dk), c.dtype, "dk", cancel_floor));
  EXPECT_TRUE(within_precision(r.dv.values(), cpu_dv, g.dv, max_abs(g.dv), c.dtype, "dv"));
  const auto ds_ref = reference_dscores(c, g.dbias, false);
  const double ds_scale = max_abs(reference_dscores(c, g.dbias, true));
  EXPECT_TRUE(within_precision(r.dscores.values(), cpu_ds, ds_ref, ds_scale,
                               c.score_dtype == DType::f32 ? c.dtype : c.score_dtype, "dkey_scores", cancel_floor));
}

// GPU select against the CPU select on the same scores: intervals compared exactly.
void run_gpu_select(HostTensor& scores, HostTensor* padding, int64_t Sq, int64_t w, bool causal) {
  const int64_t B = scores.shape()[0], Hk = scores.shape()[1], Sk = scores.shape()[2];
  SCOPED_TRACE(testing::Message() << "select B" << B << " Hk" << Hk << " Sq" << Sq << " Sk" << Sk << " w" << w
                                  << " causal" << causal << " padding" << (padding != nullptr));
  HostTensor b_cpu(DType::i32, {B, Hk, Sk}), e_cpu(DType::i32, {B, Hk, Sk});
  HostTensor b_gpu(DType::i32, {B, Hk, Sk}, {2, 0, 1}), e_gpu(DType::i32, {B, Hk, Sk});  // strided too
  SelectParams p;
  p.key_scores = scores.view();
  if (padding) p.key_padding = padding->view();
  p.num_queries = Sq, p.window = w, p.causal = causal;
  p.keep_begin = b_cpu.view(), p.keep_end = e_cpu.view();
  std::vector<unsigned char> host_ws(select_workspace_size(p));
  p.workspace = host_ws.data(), p.workspace_bytes = host_ws.size();
  select_keys(p);

  DeviceTensor d_scores(scores), bg(b_gpu), eg(e_gpu);
  std::unique_ptr<DeviceTensor> d_pad;
  p.key_scores = d_scores.view();
  if (padding) {
    d_pad = std::make_unique<DeviceTensor>(*padding);
    p.key_padding = d_pad->view();
  }
  p.keep_begin = bg.view(), p.keep_end = eg.view();
  const size_t bytes = select_workspace_size(p);
  DeviceWorkspace ws(bytes);
  p.workspace = ws.ptr, p.workspace_bytes = bytes;
  bg.poison();
  eg.poison();
  select_keys(p);
  FDMA_CUDA_OK(cudaDeviceSynchronize());
  bg.download();
  eg.download();
  const auto bc = b_cpu.values(), ec = e_cpu.values(), bgv = b_gpu.values(), egv = e_gpu.values();
  int64_t bad = 0;
  for (size_t i = 0; i < bc.size(); ++i)
    if ((bc[i] != bgv[i] || ec[i] != egv[i]) && ++bad <= 5)
      ADD_FAILURE() << "key " << i << ": CPU [" << bc[i] << ", " << ec[i] << "), GPU [" << bgv[i] << ", " << egv[i] << ")";
  EXPECT_EQ(bad, 0);
}

void run_gpu_select(DmaRun& r) {
  run_gpu_select(r.scores, r.c.padding ? &r.pad : nullptr, r.c.Sq, r.c.w, r.c.causal);
}

}  // namespace

TEST(DmaGpu, NonCausalShapesWindowsTiesPadding) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {65, 65}, {100, 127}, {129, 63}, {300, 1000}})
      for (int64_t w : {int64_t(1), int64_t(9), Sk, Sk + 4})
        for (int variant = 0; variant < 2; ++variant) {
          DmaCase c;
          c.B = 2, c.Sq = Sq, c.Sk = Sk, c.H = 4, c.Hk = variant ? 1 : 2, c.D = variant ? 128 : 64, c.w = w;
          c.causal = false, c.dtype = dt, c.seed = seed++;
          c.ties = variant, c.padding = !variant, c.add_scores = w != 9;
          c.score_dtype = variant ? dt : DType::f32;
          c.softcap = variant ? 2.0 : 0.0;
          DmaRun r(c);
          run_gpu_dma(r);
          run_gpu_select(r);
        }
}

TEST(SelectGpu, CausalMatchesTheCpuExactly) {
  REQUIRE_GPU();
  uint64_t seed = 50;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {65, 65}, {40, 129}, {129, 40},
                        {1, 300}, {1000, 1000}, {500, 3000}})
    for (int64_t w : {int64_t(1), int64_t(2), int64_t(17), Sk - 1, Sk, Sk + 3})
      for (int variant = 0; variant < 3; ++variant) {
        if (w < 1) continue;
        DmaCase c;
        c.B = 2, c.Sq = Sq, c.Sk = Sk, c.Hk = 3, c.H = 3, c.w = w, c.causal = true, c.seed = seed++;
        c.ties = variant == 1, c.padding = variant != 0;
        c.score_dtype = variant == 2 ? DType::bf16 : DType::f32;
        DmaRun r(c);
        if (variant == 2 && Sk > 5) r.scores.set(5, NAN);  // NaN ranks lowest
        run_gpu_select(r);
      }
}

TEST(SelectGpu, SignedZerosTieByIndex) {
  // -0.0 == +0.0: they tie and the lower index ranks first, as on the CPU.
  REQUIRE_GPU();
  HostTensor scores(DType::f32, {1, 1, 40});
  for (int64_t j = 0; j < 40; ++j) scores.set(j, j % 3 == 0 ? -0.0 : j % 3 == 1 ? 0.0 : -1.0);
  for (bool causal : {false, true})
    for (int64_t w : {1, 5, 13}) run_gpu_select(scores, nullptr, 40, w, causal);
}

TEST(SelectGpu, Float64ScoresAreRefusedClearly) {
  REQUIRE_GPU();
  HostTensor scores(DType::f64, {1, 1, 16}), begin(DType::i32, {1, 1, 16}), end(DType::i32, {1, 1, 16});
  DeviceTensor ds(scores), db(begin), de(end);
  SelectParams p;
  p.key_scores = ds.view(), p.keep_begin = db.view(), p.keep_end = de.view();
  p.num_queries = 16, p.window = 4;
  try {
    select_workspace_size(p);
    ADD_FAILURE() << "float64 scores accepted on the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("the GPU takes float32, float16 or bfloat16"), std::string::npos) << e.what();
  }
}

TEST(SelectGpu, CausalLongRow) {
  REQUIRE_GPU();
  std::mt19937_64 rng(77);
  HostTensor scores(DType::f32, {1, 2, 131072}), pad(DType::boolean, {1, 131072});
  scores.fill_uniform(rng, -4, 4);
  pad.fill_bool(rng, 0.95);
  run_gpu_select(scores, &pad, 131072, 2048, true);
  run_gpu_select(scores, nullptr, 100000, 2048, true);  // Sq < Sk: a prefill chunk after a cache
}

// The selection runs one of four ways (select_topw.cu: a cluster of CTAs per row on sm_90, up to
// 32768 keys; a CTA per row in shared memory, sorting there up to 16384 keys; a device-wide
// sort, then a CTA per row through global memory; or kernels per wavelet level), chosen by row
// length and count; FDMA_SELECT_PATH forces one. Causal interval ends come from the walk or the
// wavelet matrix (FDMA_SELECT_ENDS=wavelet). Each must give the CPU's selection, on rows around
// the kernels' limits (512-key cluster segments, 4096 keys sorted in a CTA and per cluster
// segment, 16384 keys sorted in a CTA, 16384-key chunks, 32768 keys in shared memory and in a
// cluster).
TEST(SelectGpu, EveryPathMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv select_path("FDMA_SELECT_PATH"), ends("FDMA_SELECT_ENDS");
  std::mt19937_64 rng(91);
  for (const char* path : {"cluster", "shared", "global", "levels"}) {
    SCOPED_TRACE(path);
    select_path.set(path);
    for (int64_t Sk : {1, 2, 33, 512, 513, 4096, 4097, 16384, 16385, 32767, 32768, 40000}) {
      HostTensor scores(DType::bf16, {2, 3, Sk}), pad(DType::boolean, {2, Sk});
      scores.fill_uniform(rng, -2, 2);  // bf16: many ties
      pad.fill_bool(rng, 0.9);
      for (int64_t w : {int64_t(1), int64_t(7), int64_t(2048)}) {
        for (const char* how : {"walk", "wavelet"}) {
          SCOPED_TRACE(how);
          ends.set(how);
          run_gpu_select(scores, &pad, Sk, w, true);
          run_gpu_select(scores, nullptr, (Sk + 1) / 2, w, true);  // Sq < Sk
        }
        ends.clear();
        run_gpu_select(scores, &pad, Sk, w, false);
      }
    }
  }
}

// The sorts leave out the low score bits that bfloat16 and float16 scores leave decided
// (select_topw.cuh, score_decided_low_bits): the cluster and CTA sorts skip their digits, the
// device-wide sort's rank keys drop them (the global and levels paths). Scores that differ
// only in their last mantissa bits (float16's sit above bfloat16's 16), ties, signed zeros,
// infinities, subnormals and NaN (which must still rank between -inf and padding: a padded key
// just before a NaN one), on each sorting path and the default one: the CPU's selection exactly.
namespace {

void check_sixteen_bit_scores(const std::vector<const char*>& paths, const std::vector<int64_t>& sizes,
                              const std::vector<int64_t>& windows) {
  const ScopedEnv select_path("FDMA_SELECT_PATH");
  std::mt19937_64 rng(99);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const double ulp = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;  // of 1.0 in the dtype
    const double tiny = dt == DType::bf16 ? 1e-39 : dt == DType::f16 ? 6e-8 : 1e-44;
    const std::vector<double> pool = {1.0,  1.0 + ulp, 1.0 + 2 * ulp, 1.0 + 7 * ulp, -1.0, -1.0 - ulp, -1.0 - 3 * ulp,
                                      0.0,  -0.0,      INFINITY,      -INFINITY,     NAN,  tiny,       -tiny,
                                      2 * tiny, 65504.0, -65504.0};
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    for (const char* path : paths) {
      SCOPED_TRACE(::testing::Message() << "dtype " << int(dt) << " path '" << path << "'");
      path[0] ? select_path.set(path) : select_path.clear();
      for (int64_t Sk : sizes) {
        HostTensor scores(dt, {2, 3, Sk}), pad(DType::boolean, {2, Sk});
        for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, pool[pick(rng)]);
        pad.fill_bool(rng, 0.9);
        pad.set(1, 0), pad.set(3, 1), scores.set(3, NAN);  // row 0: padding at 1 ties NaN at 3's high bits
        for (int64_t w : windows) {
          run_gpu_select(scores, &pad, Sk, w, true);
          run_gpu_select(scores, nullptr, (Sk + 1) / 2, w, true);
          run_gpu_select(scores, &pad, Sk, w, false);
        }
      }
    }
  }
}

}  // namespace

TEST(SelectGpu, SixteenBitScoresRankOnTheirHighBits) {
  REQUIRE_GPU();
  check_sixteen_bit_scores({"", "cluster", "shared", "global", "levels"}, {33, 4097, 16385, 32768}, {1, 7, 2048});
}

// The same, small, for compute-sanitizer.
TEST(SelectGpu, SixteenBitScoresSmall) {
  REQUIRE_GPU();
  check_sixteen_bit_scores({"cluster", "shared", "global"}, {33, 2000}, {7});
}

// The walk (select_walk.cuh) against the CPU where its steps work hardest: scores rising with
// the index (every key lands below the current end, 32 hits a step), falling (none), random,
// and in blocks; rows of one span (up to 8192 keys) and of sixteen, pieces of 64 (few rows)
// and 256 (many), windows at a piece's edge, of 1 (no index below the end), and past the row.
TEST(SelectGpu, WalkMatchesTheCpuOnOrderedScores) {
  REQUIRE_GPU();
  const ScopedEnv ends("FDMA_SELECT_ENDS");
  ends.set("walk");
  std::mt19937_64 rng(95);
  for (int64_t Sk : {31, 64, 65, 4000, 8192, 8193, 20011, 65536})
    for (int64_t rows : {int64_t(1), int64_t(48)}) {
      if (rows * Sk > 500000) continue;
      for (int order = 0; order < 4; ++order) {
        SCOPED_TRACE(::testing::Message() << "Sk " << Sk << " rows " << rows << " order " << order);
        HostTensor scores(DType::f32, {rows == 1 ? 1 : 6, rows == 1 ? 1 : 8, Sk});
        const int64_t n = scores.numel();
        if (order == 3) scores.fill_uniform(rng, -1, 1);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = i % Sk;
          if (order == 0) scores.set(i, double(j));
          if (order == 1) scores.set(i, double(Sk - j));
          if (order == 2) scores.set(i, double((j / 100) % 7) + 1e-3 * double(j % 100));
        }
        for (int64_t w : {int64_t(1), int64_t(2), int64_t(63), int64_t(64), int64_t(1000), Sk - 1, Sk + 1}) {
          run_gpu_select(scores, nullptr, Sk, w, true);
          run_gpu_select(scores, nullptr, std::max<int64_t>(1, Sk / 3), w, true);  // Sq < Sk
        }
      }
    }
}

// Past 32K keys the cluster path takes 16 CTAs per row (a non-portable cluster size; where
// the GPU cannot place one, the library falls back and this compares that path instead), and
// so do rows past 16K keys where every row's cluster fits in one wave (these two rows).
TEST(SelectGpu, SixteenCtaClustersMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv select_path("FDMA_SELECT_PATH");
  select_path.set("cluster");
  std::mt19937_64 rng(93);
  for (int64_t Sk : {16384, 16385, 32768, 32769, 65536, 100003, 131072}) {
    HostTensor scores(DType::bf16, {1, 2, Sk}), pad(DType::boolean, {1, Sk});
    scores.fill_uniform(rng, -2, 2);
    pad.fill_bool(rng, 0.9);
    for (int64_t w : {int64_t(1), int64_t(2048)}) {
      run_gpu_select(scores, &pad, Sk, w, true);
      run_gpu_select(scores, nullptr, Sk / 3, w, true);
      run_gpu_select(scores, &pad, Sk, w, false);
    }
  }
}

// The walk with the ranks after rank w cut one step (32 positions) a piece (FDMA_WALK_NARROW=k:
// k * w ranks; walk_pieces.cuh) and with none cut (these small grids take 3w by default), rows
// of one span and of several, w of 1, at a piece's edge and past the row's last narrow rank,
// scores rising with the index (every step hits) and random: the CPU's intervals exactly.
TEST(SelectGpu, NarrowWalkPiecesMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ends("FDMA_SELECT_ENDS"), narrow("FDMA_WALK_NARROW");
  ends.set("walk");
  std::mt19937_64 rng(97);
  for (const char* k : {"0", "1", "3", "64"}) {
    narrow.set(k);
    for (int64_t Sk : {int64_t(300), int64_t(8193), int64_t(20011), int64_t(65536)})
      for (int order = 0; order < 2; ++order) {
        SCOPED_TRACE(::testing::Message() << "FDMA_WALK_NARROW=" << k << " Sk " << Sk << " order " << order);
        HostTensor scores(DType::f32, {2, 2, Sk});
        if (order == 1) scores.fill_uniform(rng, -1, 1);
        else
          for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, double(i % Sk));
        for (int64_t w : {int64_t(1), int64_t(64), int64_t(1000), Sk / 2})
          run_gpu_select(scores, nullptr, Sk, w, true);
      }
  }
}

// A small case of the above for compute-sanitizer: scores rising with the index (32 hits a
// step, the bitmap searched over several rounds of words) over rows of one and of sixteen spans.
TEST(SelectGpu, WalkEveryKeyHitsSmall) {
  REQUIRE_GPU();
  const ScopedEnv ends("FDMA_SELECT_ENDS");
  ends.set("walk");
  for (int64_t Sk : {int64_t(300), int64_t(9000)}) {
    HostTensor scores(DType::f32, {2, 3, Sk});
    for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, double(i % Sk));
    for (int64_t w : {int64_t(1), int64_t(40), int64_t(1000)}) run_gpu_select(scores, nullptr, Sk, w, true);
  }
}

TEST(DmaGpu, AllKeysPaddedGivesZeros) {
  REQUIRE_GPU();
  DmaCase c;
  c.B = 2, c.Sq = 40, c.Sk = 30, c.H = 2, c.Hk = 1, c.D = 64, c.w = 5, c.causal = false, c.padding = true;
  c.dtype = DType::bf16, c.seed = 5;
  DmaRun r(c);
  for (int64_t j = 0; j < c.Sk; ++j) r.pad.set(c.Sk + j, 0);  // batch 1 has no key
  r.rebuild_reference_mask();
  run_gpu_dma(r);
}

TEST(DmaGpu, CausalShapesWindowsTiesPadding) {
  // Every case of the CPU matrix for this operation: ragged lengths, Sq != Sk both ways,
  // w = 1 and w >= Sk, ties, key padding, MHA/GQA/MQA, softcap, scores added or not.
  REQUIRE_GPU();
  uint64_t seed = 900;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {64, 64}, {65, 65}, {100, 127}, {129, 63},
                        {1, 300}, {300, 1000}, {1000, 300}})
    for (int64_t w : {int64_t(1), int64_t(17), Sk, Sk + 4})
      for (int variant = 0; variant < 3; ++variant) {
        DmaCase c;
        c.B = 2, c.Sq = Sq, c.Sk = Sk, c.w = w, c.causal = true, c.seed = seed++;
        c.H = 4, c.Hk = variant == 0 ? 4 : variant == 1 ? 2 : 1;
        c.D = variant == 2 ? 128 : 64;
        c.dtype = variant == 1 ? DType::f16 : DType::bf16;
        c.ties = variant == 1, c.padding = variant != 0, c.add_scores = variant != 2 || w != 17;
        c.score_dtype = variant == 2 ? c.dtype : DType::f32;
        c.softcap = variant == 1 ? 3.0 : 0.0;
        c.layout = variant == 2 ? 1 : 0;
        DmaRun r(c);
        run_gpu_dma(r);
      }
}

// FDMA_DKDV_GROUPS=1 in dynamic-mask mode (whose default is two): each gathered dk/dv CTA
// walks its key group's queries with one warp group; against the CPU backend, causal and not, with rows long enough
// that key groups span many query tiles.
TEST(DmaGpu, DkdvOneWarpGroupMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv groups("FDMA_DKDV_GROUPS");
  groups.set("1");
  uint64_t seed = 1400;
  for (bool causal : {true, false})
    for (int64_t w : {int64_t(40), int64_t(300)}) {
      DmaCase c;
      c.B = 2, c.Sq = 900, c.Sk = 1100, c.H = 4, c.Hk = 2, c.D = 128, c.w = w, c.causal = causal, c.seed = seed++;
      c.dtype = DType::bf16, c.padding = true, c.deterministic = true;  // the dk/dv kernel (on Hopper too)
      DmaRun r(c);
      run_gpu_dma(r);
    }
}

// Split dk/dv walks (FDMA_DKDV_SPLITS; chosen per call for few KV heads and short windows,
// dkdv_split.hpp): each share of a key group's queries writes fp32 partials, added in share
// order. Forced to 1 (one CTA a key group), 3 and 16 shares against the CPU backend, causal and
// not, GQA, key padding, the scores' gradient in float32 and in the inputs' dtype, D 64 and 128.
TEST(DmaGpu, SplitDkdvWalksMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv splits("FDMA_DKDV_SPLITS");
  uint64_t seed = 1500;
  for (const char* n : {"1", "3", "16"})
    for (bool causal : {true, false}) {
      splits.set(n);
      DmaCase c;
      c.B = 1, c.Sq = 1200, c.Sk = 1400, c.H = 4, c.Hk = causal ? 1 : 2, c.D = causal ? 64 : 128, c.w = 90;
      c.causal = causal, c.padding = true, c.seed = seed++, c.deterministic = true;  // the dk/dv kernel
      c.dtype = causal ? DType::bf16 : DType::f16;
      c.score_dtype = causal ? DType::f32 : c.dtype;
      DmaRun r(c);
      run_gpu_dma(r);
    }
}

TEST(DmaGpu, HeadDims) {
  REQUIRE_GPU();
  uint64_t seed = 950;
  for (bool causal : {true, false})
    for (int64_t D : {32, 40, 96, 192, 256}) {
      DmaCase c;
      c.B = 1, c.Sq = 150, c.Sk = 170, c.H = 4, c.Hk = 2, c.D = D, c.w = 33, c.causal = causal, c.seed = seed++;
      c.dtype = DType::bf16;
      DmaRun r(c);
      run_gpu_dma(r);
    }
}

TEST(DmaGpu, LongCausalRowsAcrossManyWindows) {
  // w far below Sk: many groups of the dk/dv kernel, long and short intervals mixed.
  REQUIRE_GPU();
  DmaCase c;
  c.B = 1, c.Sq = 1500, c.Sk = 2000, c.H = 2, c.Hk = 1, c.D = 64, c.w = 100, c.causal = true, c.seed = 990;
  c.dtype = DType::bf16, c.padding = true;
  DmaRun r(c);
  run_gpu_dma(r);
}

TEST(DmaGpu, CausalKeptKeysSpanSeveralWindows) {
  // About w (1 + ln(Sk / w)) = 2270 kept keys: nine of the dk/dv kernel's 256-key windows,
  // the last one partial.
  REQUIRE_GPU();
  DmaCase c;
  c.B = 1, c.Sq = 5000, c.Sk = 5000, c.H = 2, c.Hk = 1, c.D = 64, c.w = 800, c.causal = true, c.seed = 993;
  c.dtype = DType::bf16;
  DmaRun r(c);
  run_gpu_dma(r);
}

// Rows of more than 8192 keys, whose causal walk counts each list block's kept keys so that
// one launch writes the records and the kept list (KeptCounts, select_topw.cuh), after the
// cluster sort (the default here) and after a CTA per row (FDMA_SELECT_PATH=shared): against
// the same calls with the wavelet's interval ends
// (FDMA_SELECT_ENDS=wavelet), whose lists take the records and kept-list launches, bitwise
// (forward and deterministic backward, all selecting the same intervals), and against the
// CPU. Several rows (each zeroes its counts), key padding, more keys than queries, and keys of
// 1e38 whose terms do not fold (the fold flag, which the walk's kernels zero).
TEST(DmaGpu, CountedKeptBlocksEitherPath) {
  REQUIRE_GPU();
  const ScopedEnv ends("FDMA_SELECT_ENDS"), sort_path("FDMA_SELECT_PATH");
  for (int variant = 0; variant < 3; ++variant) {
    DmaCase c;
    c.B = 2, c.Sq = 8300, c.Sk = variant == 1 ? 9000 : 8300, c.H = 4, c.Hk = 2, c.D = 64, c.w = 400;
    c.causal = true, c.seed = 2100 + variant, c.dtype = DType::bf16, c.padding = variant == 1;
    c.deterministic = true;  // compared bitwise
    SCOPED_TRACE(testing::Message() << "variant " << variant << " " << c.str());
    DmaRun r(c);
    if (variant == 2) {
      for (int64_t i = 50; i < r.scores.numel(); i += 97) r.scores.set(i, 1e38);
      r.rebuild_reference_mask();
    }
    GpuDma gpu(r);
    std::vector<std::vector<unsigned char>> by_path[3];
    for (int how = 0; how < 3; ++how) {  // cluster prefix, span kernels, wavelet
      if (how == 1) sort_path.set("shared");
      else sort_path.clear();
      if (how == 2) ends.set("wavelet");
      else ends.clear();
      gpu.run(Pass::forward);
      for (auto [dev, host] : {std::pair{&gpu.out, &r.out}, {&gpu.lse, &r.lse}}) {
        dev->download();
        by_path[how].push_back(host->bytes());
      }
      gpu.run(Pass::backward);
      for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
        dev->download();
        by_path[how].push_back(host->bytes());
      }
    }
    for (int how = 1; how < 3; ++how)
      for (size_t i = 0; i < by_path[0].size(); ++i)
        EXPECT_TRUE(by_path[0][i] == by_path[how][i]) << "output " << i << " differs, path " << how;
    ends.clear();
    sort_path.clear();
    run_gpu_dma(r, variant == 0);  // the CPU's backward of the largest rows only once
  }
}

// Tile lists built through checkpoint lists (every 2 tiles, FDMA_TILE_CHECKPOINTS; calls of
// fewer than 1024 tiles take none by default), the forward's and the deterministic backward's,
// against the CPU: as many keys as queries, and 600 more.
TEST(DmaGpu, CheckpointedTileListsMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv checkpoints("FDMA_TILE_CHECKPOINTS");
  checkpoints.set("2");
  for (int64_t extra : {int64_t(0), int64_t(600)}) {
    DmaCase c;
    c.B = 1, c.Sq = 1900, c.Sk = 1900 + extra, c.H = 2, c.Hk = 1, c.D = 64, c.w = 300, c.causal = true;
    c.seed = 1003 + uint64_t(extra), c.dtype = DType::bf16, c.deterministic = true;
    DmaRun r(c);
    run_gpu_dma(r);
  }
}

TEST(DmaGpu, KeptListsOfSeveralLongRows) {
  // Several rows (batch, KV head) of 2500 keys, each row's kept list placed from one scan over
  // all rows (dma_lists.cu), causal (tile lists) and not (the kept list itself), key padding
  // dropping keys all along the rows.
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    DmaCase c;
    c.B = 2, c.Sq = 700, c.Sk = 2500, c.H = 4, c.Hk = 2, c.D = 64, c.w = 1500, c.causal = causal;
    c.seed = causal ? 1001 : 1002, c.dtype = DType::bf16, c.padding = true;
    DmaRun r(c);
    run_gpu_dma(r);
  }
}

TEST(DmaGpu, BackwardIsBitwiseDeterministic) {
  REQUIRE_GPU();
  DmaCase c;
  c.B = 2, c.Sq = 300, c.Sk = 400, c.H = 4, c.Hk = 1, c.D = 64, c.w = 50, c.causal = true, c.seed = 995;
  c.dtype = DType::bf16, c.deterministic = true;
  DmaRun r(c);
  r.forward();
  GpuDma gpu(r);
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 3; ++run) {
    gpu.run(Pass::backward);
    int n = 0;
    for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
      dev->download();
      if (run == 0) first.push_back(host->bytes());
      else EXPECT_TRUE(host->bytes() == first[n]) << "run " << run << " differs in gradient " << n;
      ++n;
    }
  }
}

// Both backwards against the CPU: deterministic (the dq and dk/dv kernels) and not (on Hopper
// at D 64 and 128, the warp-specialized kernel with fused dq, attention_bwd_ws.cuh: 128-key
// groups, walks cut into shares of at least 32 steps, so rows of 1500 queries take several).
// Causal and not, GQA and MQA, padding, ties, softcap, scores added or not and their gradient
// in float32 or the inputs' dtype, w from 1 to past Sk, ragged lengths.
TEST(DmaGpu, BackwardEitherPath) {
  REQUIRE_GPU();
  uint64_t seed = 1800;
  struct Shape {
    int64_t Sq, Sk, w;
  };
  for (const Shape& s : {Shape{1500, 1500, 100}, Shape{700, 1300, 1}, Shape{1300, 700, 900}, Shape{129, 200, 40}})
    for (int variant = 0; variant < 3; ++variant)
      for (bool deterministic : {false, true}) {
        DmaCase c;
        c.B = variant == 1 ? 2 : 1, c.Sq = s.Sq, c.Sk = s.Sk, c.w = s.w, c.causal = variant != 1, c.seed = seed++;
        c.H = 4, c.Hk = variant == 2 ? 1 : 2, c.D = variant == 1 ? 64 : 128;
        c.dtype = variant == 1 ? DType::f16 : DType::bf16;
        c.padding = variant != 0, c.ties = variant == 1, c.softcap = variant == 2 ? 4.0 : 0.0;
        c.add_scores = variant != 2 || s.w != 40;
        c.score_dtype = variant == 1 ? c.dtype : DType::f32;
        c.deterministic = deterministic;
        DmaRun r(c);
        run_gpu_dma(r);
      }
}

// The warp-specialized backward on a few small cases, for compute-sanitizer: D 128 causal with
// GQA, and D 64 non-causal with padding, both with rows long enough for several query ranges;
// then D 256 (attention_bwd_ws_d256.cuh, each plan item's 128 keys as two hand-outs of 64):
// causal bf16 with GQA, and non-causal fp16 with padding and softcap (530 keys: key groups
// partly filled, so second hand-outs with fewer than 64 keys or none).
TEST(DmaGpu, WarpSpecializedBackwardSmall) {
  REQUIRE_GPU();
  uint64_t seed = 1900;
  for (int variant = 0; variant < 4; ++variant) {
    const bool odd = variant % 2 == 1;
    DmaCase c;
    c.B = 1, c.Sq = odd ? 400 : 700, c.Sk = odd ? 500 : 700, c.w = odd ? 60 : 100, c.seed = seed++;
    c.causal = !odd, c.padding = odd, c.H = 4, c.Hk = odd ? 4 : 2, c.D = variant < 2 ? (odd ? 64 : 128) : 256;
    c.dtype = variant == 3 ? DType::f16 : DType::bf16;
    if (variant == 3) c.Sk = 530, c.softcap = 5.0;
    DmaRun r(c);
    run_gpu_dma(r);
  }
}

// The same forward and deterministic backward from four host threads at once, each on its own
// non-blocking stream with its own outputs and workspace: the bits of one call at a time.
TEST(DmaGpu, ConcurrentCallsOnSeveralStreams) {
  REQUIRE_GPU();
  DmaCase c;
  c.B = 2, c.Sq = 300, c.Sk = 400, c.H = 4, c.Hk = 2, c.D = 64, c.w = 50, c.causal = true, c.padding = true;
  c.dtype = DType::bf16, c.seed = 1210, c.deterministic = true;
  struct Caller {
    DmaRun r;
    GpuDma g;
    cudaStream_t stream = nullptr;
    std::unique_ptr<DeviceWorkspace> ws;
    size_t bytes = 0;
    explicit Caller(const DmaCase& c) : r(c), g(r) {
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      DmaParams p = g.params();
      bytes = std::max(dma_workspace_size(p, Pass::forward), dma_workspace_size(p, Pass::backward));
      ws = std::make_unique<DeviceWorkspace>(bytes);
    }
    ~Caller() { cudaStreamDestroy(stream); }
    std::vector<unsigned char> call() {
      DmaParams p = g.params();
      p.stream = stream, p.workspace = ws->ptr, p.workspace_bytes = bytes;
      dma_forward(p);
      dma_backward(p);
      if (cudaStreamSynchronize(stream) != cudaSuccess) return {};
      std::vector<unsigned char> all;
      for (auto [dev, host] : {std::pair{&g.out, &r.out}, {&g.lse, &r.lse}, {&g.dq, &r.dq}, {&g.dk, &r.dk},
                               {&g.dv, &r.dv}, {&g.dscores, &r.dscores}}) {
        dev->download();
        all.insert(all.end(), host->bytes().begin(), host->bytes().end());
      }
      return all;
    }
  };
  Caller alone(c);
  const std::vector<unsigned char> expected = alone.call();
  ASSERT_FALSE(expected.empty());
  constexpr int kThreads = 4, kRepeats = 3;
  std::vector<std::unique_ptr<Caller>> callers;
  for (int t = 0; t < kThreads; ++t) callers.push_back(std::make_unique<Caller>(c));
  std::vector<std::vector<unsigned char>> got(kThreads * kRepeats);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < kRepeats; ++k) got[t * kRepeats + k] = callers[t]->call();
    });
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(got[i] == expected) << "thread " << i / kRepeats << " call " << i % kRepeats;
}

// keep_begin/keep_end on the GPU: the forward writes exactly the CPU's selection, and a
// backward given them computes bitwise what it computes when it selects again, in less
// workspace (no selection scratch).
TEST(DmaGpu, BackwardReusesTheForwardsSelection) {
  REQUIRE_GPU();
  uint64_t seed = 1000;
  for (bool causal : {true, false})
    for (bool padding : {false, true}) {
      DmaCase c;
      c.B = 2, c.Sq = 700, c.Sk = 900, c.H = 4, c.Hk = 2, c.D = 64, c.w = 120, c.seed = seed++;
      c.causal = causal, c.padding = padding, c.ties = padding, c.dtype = DType::bf16;
      c.deterministic = true;  // the gradients compared bitwise
      SCOPED_TRACE(c.str());
      DmaRun r(c);
      GpuDma gpu(r);
      gpu.run(Pass::forward);  // its out and lse (the same both times) feed both backward runs
      gpu.out.download();
      const auto out_selecting = r.out.bytes();
      gpu.run(Pass::backward);
      const size_t ws_selecting = gpu.workspace_bytes;
      std::vector<std::vector<unsigned char>> grads_selecting;
      for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
        dev->download();
        grads_selecting.push_back(host->bytes());
      }

      r.with_intervals = true;
      gpu.keep_begin.poison();
      gpu.keep_end.poison();
      gpu.run(Pass::forward);
      gpu.out.download();
      EXPECT_TRUE(r.out.bytes() == out_selecting);
      gpu.keep_begin.download();
      gpu.keep_end.download();
      const auto [begin, end] = r.cpu_selection();
      EXPECT_EQ(r.keep_begin.values(), begin);
      EXPECT_EQ(r.keep_end.values(), end);

      gpu.run(Pass::backward);
      EXPECT_LT(gpu.workspace_bytes, ws_selecting);
      int n = 0;
      for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
        dev->download();
        EXPECT_TRUE(host->bytes() == grads_selecting[n]) << "gradient " << n << " differs";
        ++n;
      }
    }
}

// A NaN in a key's K row reaches only the queries that keep the key (test_dma.cpp has the CPU
// backend's case), in both forward kernels: the warp-specialized gathered one, whose covered
// tiles add the keys' biases with no per-score test and whose other tiles select on each
// score's interval, and the cp.async one (FDMA_FWD_WS=0). Causal lists hold keys that some of a
// tile's queries keep and others not.
TEST(DmaGpu, NanKeyRowsReachOnlyTheQueriesThatKeepThem) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on);
    ws.set(on);
    for (int64_t D : {64, 128}) {
      DmaCase c;
      c.B = 1, c.Sq = 700, c.Sk = 700, c.H = 4, c.Hk = 2, c.D = D, c.w = 64, c.seed = 1500 + D, c.causal = true;
      c.dtype = DType::bf16;
      DmaRun r(c);
      const int64_t nan_rows = r.poison_key_rows(6);
      ASSERT_GT(nan_rows, 0);
      ASSERT_LT(nan_rows, c.B * c.Sq * c.H);
      run_gpu_dma(r, false);
    }
  }
}

// Key terms far from 1 in magnitude, forward against the CPU: every 97th key's score 1e38 (rows
// that see one get the mean over such keys), or every score -3e38 (ties: a row's mean over its
// kept keys). The softmax's fused exponent would put 0 or inf in every such row (softmax_sm80.cuh,
// kFusedExponentLimit); the backward of such rows is not exact on any backend, their lse being
// too coarse to carry the log of the row's sum.
TEST(DmaGpu, HugeKeyTermsMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  for (const char* on : {"1", "0"}) {
    ws.set(on);
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on + " variant " + std::to_string(variant));
      DmaCase c;
      c.B = 2, c.Sq = 500, c.Sk = 500 + 64 * (variant % 2), c.H = 4, c.Hk = variant < 2 ? 2 : 1;
      c.D = variant % 2 ? 64 : 128, c.w = 200, c.causal = variant != 3, c.seed = 1900 + variant;
      c.dtype = DType::bf16, c.padding = variant == 1;
      DmaRun r(c);
      for (int64_t i = 0; i < r.scores.numel(); ++i)
        if (variant >= 2) r.scores.set(i, -3e38);
        else if (i % 97 == 50) r.scores.set(i, 1e38);
      r.rebuild_reference_mask();
      run_gpu_dma(r, false);
    }
  }
}

// The gathered forward's key terms folded into S = Q K^T (bf16, no softcap; KeyLists::bias_chunks)
// and added per score (FDMA_FWD_FOLD_BIAS=0), against the CPU: GQA, D 64 and 128, narrow last
// tiles, padding; scores of -inf (kept keys no query sees: w covers the row) and of 1e38, whose
// term over the scale overflows float, so the call must not fold (fold_off) and gives the
// CPU's mean over those keys rather than NaN. Folding rounds differently from the multiply-add,
// so the two paths' lse differ somewhere: the fold ran.
TEST(DmaGpu, FoldedKeyTermsEitherPath) {
  REQUIRE_GPU();
  const ScopedEnv fold("FDMA_FWD_FOLD_BIAS");
  for (int variant = 0; variant < 4; ++variant) {
    DmaCase c;
    c.B = 2, c.Sq = 900, c.Sk = 900 + 64 * (variant % 2), c.H = 4, c.Hk = variant < 2 ? 2 : 1;
    c.D = variant % 2 ? 64 : 128, c.w = variant == 2 ? 2000 : 300, c.causal = true, c.seed = 1800 + variant;
    c.dtype = DType::bf16, c.padding = variant == 1;
    std::vector<std::vector<unsigned char>> outs;
    for (const char* on : {"1", "0"}) {
      SCOPED_TRACE(std::string("variant ") + std::to_string(variant) + " FDMA_FWD_FOLD_BIAS=" + on);
      fold.set(on);
      DmaRun r(c);
      if (variant >= 2) {  // every 97th key's score -inf (variant 2) or 1e38 (variant 3)
        for (int64_t i = 50; i < r.scores.numel(); i += 97) r.scores.set(i, variant == 2 ? -INFINITY : 1e38);
        r.rebuild_reference_mask();
      }
      run_gpu_dma(r, false);
      outs.push_back(r.lse.bytes());  // float32: the two roundings show there first
    }
    if (variant < 2) {
      EXPECT_FALSE(outs[0] == outs[1]) << "variant " << variant << ": the fold changed no lse bit";
    }
  }
}

// Intervals that are no selection's: clamped to the queries that exist, so the kernels stay
// in bounds (compute-sanitizer's memcheck over this test finds no error) and every gradient is
// written.
// A CUDA call's workspace must be device memory and 16-byte aligned (its pieces move in 16-byte
// vectors and bulk copies): host memory and a pointer 4 bytes into a device buffer are refused
// by name before any launch, forward and backward; the aligned buffer then runs.
TEST(DmaGpu, WorkspaceMustBeAlignedDeviceMemory) {
  REQUIRE_GPU();
  DmaCase c;
  c.B = 1, c.Sq = 96, c.Sk = 96, c.H = 2, c.Hk = 1, c.D = 64, c.w = 16, c.seed = 1212, c.causal = true;
  c.dtype = DType::bf16;
  DmaRun r(c);
  GpuDma gpu(r);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    DmaParams p = gpu.params();
    const size_t bytes = dma_workspace_size(p, pass);
    DeviceWorkspace ws(bytes + 16);
    std::vector<char> host(bytes + 16);
    for (auto [where, why] : {std::pair{static_cast<void*>(host.data()), "must be CUDA device memory"},
                              {static_cast<char*>(ws.ptr) + 4, "must be 16-byte aligned"}}) {
      p.workspace = where, p.workspace_bytes = bytes;
      try {
        pass == Pass::forward ? dma_forward(p) : dma_backward(p);
        ADD_FAILURE() << why << ": accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::workspace);
        EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      }
    }
    p.workspace = ws.ptr, p.workspace_bytes = bytes;
    pass == Pass::forward ? dma_forward(p) : dma_backward(p);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

TEST(DmaGpu, MadeUpIntervalsStayInBounds) {
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    DmaCase c;
    c.B = 1, c.Sq = 300, c.Sk = 350, c.H = 2, c.Hk = 1, c.D = 64, c.w = 10, c.seed = 1010, c.causal = causal;
    c.dtype = DType::bf16;
    DmaRun r(c);
    r.forward();
    r.make_up_intervals(6);
    GpuDma gpu(r);
    gpu.run(Pass::backward);
    for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
      dev->download();
      for (int64_t i = 0; i < host->numel(); ++i) ASSERT_FALSE(std::isnan(host->get(i))) << causal << " " << i;
    }
  }
}

namespace {

// Of the forward's query tiles (128 rows) with lists longer than one key tile of `tile_keys` (128,
// or 64 for the warp-specialized kernel at D 256), how many end in a tile of at most 32 and of
// 33-64 keys: the cases a narrow last tile runs.
std::pair<int, int> narrow_tail_tiles(const DmaRun& r, int64_t tile_keys) {
  constexpr int64_t kRows = 128;
  const DmaCase& c = r.c;
  const auto [begin, end] = r.cpu_selection();
  int n32 = 0, n64 = 0;
  for (int64_t row = 0; row < c.B * c.Hk; ++row)
    for (int64_t r0 = 0; r0 < c.Sq; r0 += kRows) {
      const int64_t r1 = std::min(c.Sq, r0 + kRows);
      int64_t listed = 0;
      for (int64_t j = 0; j < c.Sk; ++j) {
        const double b = begin[row * c.Sk + j], e = end[row * c.Sk + j];
        listed += b < e && b < r1 && e > r0;
      }
      if (listed <= tile_keys) continue;
      const int64_t tail = listed - (listed - 1) / tile_keys * tile_keys;  // keys in the last tile
      if (tail <= 32) ++n32;
      else if (tail <= 64) ++n64;
    }
  return {n32, n64};
}

}  // namespace

// The narrow last tile (a list's last key tile run 32 or 64 keys wide when it holds no more) of
// the warp-specialized forward (D 64, 128 and 256) and of the cp.async wgmma forward
// (FDMA_FWD_WS=0 on Hopper), each against the CPU and bitwise against the full-width tile
// (FDMA_FWD_LAST_TILE=full): the keys it leaves out are the zero rows and -inf scores that add
// exact zeros. Off Hopper every run takes the mma.sync kernel and the comparison holds
// trivially. The cases are checked to contain lists ending in tiles of both narrow widths (of
// 128-key tiles) and of at most 32 keys (of the 64-key tiles at D 256).
TEST(DmaGpu, NarrowLastTileMatchesFullWidth) {
  REQUIRE_GPU();
  const ScopedEnv last_tile("FDMA_FWD_LAST_TILE"), ws("FDMA_FWD_WS");
  uint64_t seed = 1100;
  int tails32 = 0, tails64 = 0, tails32_d256 = 0;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on);
    ws.set(on);
    for (auto [S, w] : {std::pair<int64_t, int64_t>{700, 150}, {1200, 200}, {2000, 500}, {2500, 1000}})
      for (int variant = 0; variant < 3; ++variant) {
        DmaCase c;
        c.B = 1, c.Sq = S, c.Sk = S, c.H = 2, c.Hk = variant == 1 ? 1 : 2, c.w = w, c.causal = true, c.seed = seed++;
        c.D = variant == 0 ? 128 : variant == 1 ? 64 : 256;
        c.dtype = variant == 1 ? DType::f16 : DType::bf16;
        c.padding = variant == 1, c.softcap = variant == 1 ? 5.0 : 0.0;
        DmaRun r(c);
        if (c.D == 256) {
          tails32_d256 += narrow_tail_tiles(r, 64).first;
        } else {
          const auto [n32, n64] = narrow_tail_tiles(r, 128);
          tails32 += n32, tails64 += n64;
        }
        last_tile.set("narrow");
        run_gpu_dma(r, false);  // GPU against the CPU; r.out now holds the GPU's
        const auto out_narrow = r.out.bytes(), lse_narrow = r.lse.bytes();
        last_tile.set("full");
        GpuDma gpu(r);
        gpu.run(Pass::forward);
        gpu.out.download();
        gpu.lse.download();
        EXPECT_TRUE(r.out.bytes() == out_narrow) << c.str() << ": out differs from the full-width last tile";
        EXPECT_TRUE(r.lse.bytes() == lse_narrow) << c.str() << ": lse differs from the full-width last tile";
      }
  }
  EXPECT_GT(tails32, 0) << "no list ended in a tile of 32 keys or fewer";
  EXPECT_GT(tails64, 0) << "no list ended in a tile of 33-64 keys";
  EXPECT_GT(tails32_d256, 0) << "no list ended in a 64-key tile of 32 keys or fewer";
}

// The gathered forward on the warp-specialized kernel (the default on Hopper at D 64, 128 and
// 256) and on the cp.async kernel (FDMA_FWD_WS=0; wgmma, mma.sync at D 256), each against the
// CPU: causal and not, lists over several stages of the producer's ring, GQA/MQA, padding,
// ties, softcap, head dims below the kernel's (D 40, 112 and 200 run on the 64, 128 and 256
// kernels; the copy engine's store of O writes only D columns), and outs whose rows of D are
// padded by 8 elements (it writes none of the padding).
TEST(DmaGpu, WarpSpecializedForwardEitherPath) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  uint64_t seed = 1700;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on);
    ws.set(on);
    for (auto [S, w] : {std::pair<int64_t, int64_t>{300, 40}, {1100, 700}, {2000, 1500}})
      for (int variant = 0; variant < 6; ++variant) {
        // Variants 4 and 5: D 256 and 200 on the 64-key tiles of that head dim (causal: the gathered
        // kernels run for causal calls; with FDMA_FWD_WS=0 the cp.async kernel reads the lists of
        // 128-row tiles from its 64-row ones).
        DmaCase c;
        c.B = 2, c.Sq = S, c.Sk = S + 37 * variant, c.w = w, c.causal = variant % 2 == 0 || variant >= 4, c.seed = seed++;
        c.H = 4, c.Hk = variant == 0 || variant == 5 ? 4 : variant == 1 || variant == 4 ? 2 : 1;
        c.D = variant == 0 ? 128 : variant == 1 ? 64 : variant == 2 ? 40 : variant == 3 ? 112 : variant == 4 ? 256 : 200;
        c.dtype = variant == 1 || variant == 5 ? DType::f16 : DType::bf16;
        c.ties = variant == 2, c.padding = variant != 0, c.softcap = variant == 3 || variant == 5 ? 4.0 : 0.0;
        c.out_row_pad = S == 1100 && (variant < 2 || variant == 4) ? 8 : 0;
        DmaRun r(c);
        run_gpu_dma(r, false);
      }
  }
}

// The switches that change only when and where kernels run, not what they compute, give
// bitwise the same forward and backward either way, and the CPU's results:
//   FDMA_OVERLAP_LAUNCHES (1, the default, against 0): the selection, list, forward and backward
//     kernels launched overlapping their predecessors (programmatic dependent launch, compute
//     capability 9.0+; older GPUs launch serially either way), each waiting for its
//     predecessor on the GPU.
TEST(DmaGpu, SchedulingSwitchesGiveBitwiseTheDefault) {
  REQUIRE_GPU();
  uint64_t seed = 1200;
  for (const char* name : {"FDMA_OVERLAP_LAUNCHES"}) {
    const ScopedEnv scheduling(name);
    for (bool causal : {true, false}) {
      DmaCase c;
      c.B = 2, c.Sq = 900, c.Sk = 1100, c.H = 4, c.Hk = 2, c.D = 128, c.w = 200, c.causal = causal, c.seed = seed++;
      c.dtype = DType::bf16, c.padding = true, c.deterministic = true;  // compared bitwise
      SCOPED_TRACE(std::string(name) + " " + c.str());
      DmaRun r(c);
      GpuDma gpu(r);
      std::vector<std::vector<unsigned char>> plain;
      for (int on = 0; on < 2; ++on) {
        scheduling.set(on ? "1" : "0");
        std::vector<std::vector<unsigned char>> got;
        gpu.run(Pass::forward);
        for (DeviceTensor* t : {&gpu.out, &gpu.lse}) t->download();
        got.push_back(r.out.bytes());
        got.push_back(r.lse.bytes());
        gpu.run(Pass::backward);
        for (auto [dev, host] :
             {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {&gpu.dscores, &r.dscores}}) {
          dev->download();
          got.push_back(host->bytes());
        }
        if (!on) plain = got;
        else
          for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == plain[i]) << "output " << i << " differs";
      }
      scheduling.clear();
    }
    // And against the CPU, switched on.
    scheduling.set("1");
    DmaCase c;
    c.B = 1, c.Sq = 1500, c.Sk = 1500, c.H = 4, c.Hk = 1, c.D = 64, c.w = 300, c.causal = true, c.seed = seed++;
    c.dtype = DType::f16;
    SCOPED_TRACE(name);
    DmaRun r(c);
    run_gpu_dma(r);
  }
}

// Forward calls with at most 16 queries and no padding run on the decode path (a KV-cache call
// over full caches); FDMA_DMA_DECODE=0 keeps them on the training kernels. Both against the
// reference: causal and not, GQA, ties, softcap, scores added or not, w below and above Sk.
TEST(DmaGpu, FewQueriesEitherPath) {
  REQUIRE_GPU();
  ScopedEnv path("FDMA_DMA_DECODE");
  for (const char* setting : {"1", "0"}) {
    path.set(setting);
    SCOPED_TRACE(std::string("FDMA_DMA_DECODE=") + setting);
    uint64_t seed = 1700;
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {1, 5000}, {5, 300}, {16, 2000}, {16, 9}})
      for (int variant = 0; variant < 3; ++variant) {
        DmaCase c;
        c.B = 2, c.Sq = Sq, c.Sk = Sk, c.w = variant == 2 ? Sk + 3 : 40, c.causal = variant != 1, c.seed = seed++;
        c.H = 8, c.Hk = variant == 0 ? 8 : 2, c.D = variant == 1 ? 64 : 128;
        c.dtype = variant == 1 ? DType::f16 : DType::bf16;
        c.ties = variant == 1, c.add_scores = variant != 2, c.softcap = variant == 2 ? 5.0 : 0.0;
        c.score_dtype = variant == 1 ? c.dtype : DType::f32;
        DmaRun r(c);
        run_gpu_dma(r, false);
      }
  }
}
