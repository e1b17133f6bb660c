// Packed variable-length batches of dynamic_mask_attention and attention on the GPU against the
// CPU backend and the float64 reference on the whole packed batch (varlen_case.hpp): the
// intervals exactly, outputs and gradients (dbias included) with the precision rule of
// test_dma_gpu.cpp; every selection path; offsets that are no prefix sums stay inside the
// tensors. Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "device_tensor.hpp"
#include "varlen_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

struct GpuVarlen {
  VarlenRun& r;
  DeviceTensor cu_q, cu_k, q, k, v, scores, pad, out, lse, dout, dq, dk, dv, dscores, keep_begin, keep_end;
  explicit GpuVarlen(VarlenRun& run)
      : r(run), cu_q(r.cu_q), cu_k(r.cu_k), q(r.q), k(r.k), v(r.v), scores(r.scores), pad(r.pad), out(r.out),
        lse(r.lse), dout(r.dout), dq(r.dq), dk(r.dk), dv(r.dv), dscores(r.dscores), keep_begin(r.keep_begin),
        keep_end(r.keep_end) {}
  DmaParams params() const {
    DmaParams p = r.dma_params();
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.key_scores = scores.view();
    if (r.c.padding) p.key_padding = pad.view();
    p.out = out.view(), p.lse = lse.view(), p.dout = dout.view();
    p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view(), p.dkey_scores = dscores.view();
    p.keep_begin = keep_begin.view(), p.keep_end = keep_end.view();
    p.cu_seqlens_q = cu_q.view(), p.cu_seqlens_k = cu_k.view();
    return p;
  }
  void run(Pass pass, DmaParams p) {
    const size_t bytes = dma_workspace_size(p, pass);
    DeviceWorkspace ws(bytes);
    p.workspace = ws.ptr, p.workspace_bytes = bytes;
    if (pass == Pass::forward) {
      for (DeviceTensor* t : {&out, &lse, &keep_begin, &keep_end}) t->poison();
      dma_forward(p);
    } else {
      for (DeviceTensor* t : {&dq, &dk, &dv, &dscores}) t->poison();
      dma_backward(p);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

void run_gpu_varlen(const VarlenCase& c) {
  SCOPED_TRACE(c.str());
  VarlenRun r(c);
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values(), cpu_begin = r.keep_begin.values(), cpu_end = r.keep_end.values();
  const auto out_bytes = r.out.bytes(), lse_bytes = r.lse.bytes();
  const auto ref = ref::forward(r.rp);

  GpuVarlen gpu(r);
  gpu.run(Pass::forward, gpu.params());
  for (DeviceTensor* t : {&gpu.out, &gpu.lse, &gpu.keep_begin, &gpu.keep_end}) t->download();
  EXPECT_TRUE(within_precision(r.out.values(), cpu_out, ref.out, max_abs(ref.out), c.dtype, "out"));
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));
  EXPECT_EQ(r.keep_begin.values(), cpu_begin) << "keep_begin";
  EXPECT_EQ(r.keep_end.values(), cpu_end) << "keep_end";

  // The backward reads the CPU forward's out and lse, so both backends see the same inputs.
  r.out.bytes() = out_bytes;
  r.lse.bytes() = lse_bytes;
  gpu.out.upload();
  gpu.lse.upload();
  r.backward();
  const auto cpu_dq = r.dq.values(), cpu_dk = r.dk.values(), cpu_dv = r.dv.values(), cpu_ds = r.dscores.values();
  const auto g = ref::backward(r.rp, r.dout.values());
  const int64_t G = c.H / c.Hk;
  std::vector<double> ds(c.Hk * r.total_k, 0.0);
  if (c.add_scores)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < r.total_q; ++i)
        for (int64_t j = 0; j < r.total_k; ++j) ds[(h / G) * r.total_k + j] += g.dbias[(h * r.total_q + i) * r.total_k + j];
  const double floor = double(G) * r.max_q * c.D * 1.2e-7 * 1.5;  // w = 1 cancels exactly (test_dma_gpu.cpp)
  for (bool reuse : {true, false}) {  // the forward's intervals, or a selection again
    DmaParams p = gpu.params();
    if (!reuse) p.keep_begin = p.keep_end = Tensor();
    gpu.run(Pass::backward, p);
    for (DeviceTensor* t : {&gpu.dq, &gpu.dk, &gpu.dv, &gpu.dscores}) t->download();
    SCOPED_TRACE(reuse ? "backward given the intervals" : "backward selecting again");
    EXPECT_TRUE(within_precision(r.dq.values(), cpu_dq, g.dq, max_abs(g.dq), c.dtype, "dq", floor));
    EXPECT_TRUE(within_precision(r.dk.values(), cpu_dk, g.dk, max_abs(g.dk), c.dtype, "dk", floor));
    EXPECT_TRUE(within_precision(r.dv.values(), cpu_dv, g.dv, max_abs(g.dv), c.dtype, "dv"));
    EXPECT_TRUE(within_precision(r.dscores.values(), cpu_ds, ds, max_abs(ds), c.dtype, "dkey_scores", floor));
  }
}

// Dense attention over a packed batch (attention_varlen.cu): per-key mask and bias, dbias.
struct GpuVarlenAttention {
  VarlenRun& r;
  DeviceTensor cu_q, cu_k, q, k, v, mask, out, lse, dout, dq, dk, dv;
  std::unique_ptr<DeviceTensor> bias, dbias;
  explicit GpuVarlenAttention(VarlenRun& run)
      : r(run), cu_q(r.cu_q), cu_k(r.cu_k), q(r.q), k(r.k), v(r.v), mask(r.mask), out(r.out), lse(r.lse),
        dout(r.dout), dq(r.dq), dk(r.dk), dv(r.dv) {
    if (r.c.bias_heads) bias = std::make_unique<DeviceTensor>(r.bias), dbias = std::make_unique<DeviceTensor>(r.dbias);
  }
  AttentionParams params() const {
    AttentionParams p = r.attention_params();
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
    if (r.c.mask) p.mask = mask.view();
    if (bias) p.bias = bias->view(), p.dbias = dbias->view();
    p.cu_seqlens_q = cu_q.view(), p.cu_seqlens_k = cu_k.view();
    return p;
  }
  void run(Pass pass) {
    AttentionParams p = params();
    const size_t bytes = attention_workspace_size(p, pass);
    DeviceWorkspace ws(bytes);
    p.workspace = ws.ptr, p.workspace_bytes = bytes;
    if (pass == Pass::forward) {
      out.poison(), lse.poison();
      attention_forward(p);
    } else {
      dq.poison(), dk.poison(), dv.poison();
      if (dbias) dbias->poison();
      attention_backward(p);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

void run_gpu_varlen_attention(const VarlenCase& c) {
  SCOPED_TRACE(c.str());
  VarlenRun r(c);
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values();
  const auto out_bytes = r.out.bytes(), lse_bytes = r.lse.bytes();
  const auto ref = ref::forward(r.rp);

  GpuVarlenAttention gpu(r);
  gpu.run(Pass::forward);
  gpu.out.download(), gpu.lse.download();
  EXPECT_TRUE(within_precision(r.out.values(), cpu_out, ref.out, max_abs(ref.out), c.dtype, "out"));
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));

  r.out.bytes() = out_bytes;  // the backward reads the CPU forward's out and lse on both backends
  r.lse.bytes() = lse_bytes;
  gpu.out.upload(), gpu.lse.upload();
  r.backward();
  const auto cpu_dq = r.dq.values(), cpu_dk = r.dk.values(), cpu_dv = r.dv.values();
  const auto cpu_db = c.bias_heads ? r.dbias.values() : std::vector<double>{};
  const auto g = ref::backward(r.rp, r.dout.values());
  gpu.run(Pass::backward);
  gpu.dq.download(), gpu.dk.download(), gpu.dv.download();
  const double floor = double(c.H / c.Hk) * r.max_q * c.D * 1.2e-7 * 1.5;  // as for the dynamic mask
  EXPECT_TRUE(within_precision(r.dq.values(), cpu_dq, g.dq, max_abs(g.dq), c.dtype, "dq", floor));
  EXPECT_TRUE(within_precision(r.dk.values(), cpu_dk, g.dk, max_abs(g.dk), c.dtype, "dk", floor));
  EXPECT_TRUE(within_precision(r.dv.values(), cpu_dv, g.dv, max_abs(g.dv), c.dtype, "dv"));
  if (c.bias_heads) {
    gpu.dbias->download();
    const auto db = ref::reduce_broadcast(r.rp, g.dbias, {1, c.bias_heads, 1, r.total_k});
    const DType db_type = c.bias_dtype == DType::f32 ? c.dtype : c.bias_dtype;  // the coarser of the two roundings
    EXPECT_TRUE(within_precision(r.dbias.values(), cpu_db, db, max_abs(db), db_type, "dbias", floor * c.H));
  }
}

const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> kLengths = {
    {{5, 0, 17, 1, 90}, {5, 3, 30, 1, 70}},  // empty sides, Sq != Sk, more queries than keys
    {{1, 1, 1, 1, 1, 1, 1}, {1, 2, 3, 4, 5, 200, 9}},
    {{300, 64, 129}, {300, 64, 129}},       // across several query tiles, lengths off the tiles
};

}  // namespace

TEST(VarlenGpu, DynamicMaskAttention) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (const auto& [ql, kl] : kLengths)
    for (bool causal : {true, false})
      for (int64_t w : {1, 7, 64})
        for (int variant = 0; variant < 2; ++variant) {
          VarlenCase c;
          c.q_lens = ql, c.k_lens = kl, c.causal = causal, c.w = w, c.seed = seed++;
          c.dtype = variant ? DType::f16 : DType::bf16;
          c.H = 4, c.Hk = variant ? 1 : 2, c.D = variant ? 128 : 64;
          c.padding = variant, c.ties = !variant, c.softcap = variant ? 2.0 : 0.0, c.add_scores = w != 7;
          run_gpu_varlen(c);
        }
}

TEST(VarlenGpu, EverySelectionPath) {
  REQUIRE_GPU();
  ScopedEnv path("FDMA_SELECT_PATH"), ends("FDMA_SELECT_ENDS");
  uint64_t seed = 100;
  for (const char* forced : {"cluster", "shared", "global", "levels"})
    for (bool walk : {true, false}) {  // causal interval ends by the walk or the wavelet matrix
      path.set(forced);
      ends.set(walk ? "walk" : "wavelet");
      SCOPED_TRACE(::testing::Message() << forced << (walk ? ", walk" : ", wavelet"));
      for (bool causal : {true, false}) {
        if (!causal && !walk) continue;  // the same run as with the walk
        VarlenCase c;
        c.q_lens = {40, 0, 700, 3}, c.k_lens = {50, 9, 700, 1200}, c.causal = causal, c.w = 33, c.seed = seed++;
        c.dtype = DType::bf16, c.H = 4, c.Hk = 2, c.D = 64;
        run_gpu_varlen(c);
      }
    }
}

// Offsets the GPU cannot check without a synchronization (decreasing, past the totals, longer
// than the max lengths): the call stays inside every tensor (compute-sanitizer memcheck runs
// this test) and writes every output element.
TEST(VarlenGpu, BadOffsetsStayInBounds) {
  REQUIRE_GPU();
  VarlenCase c;
  c.q_lens = {30, 20, 50}, c.k_lens = {40, 20, 60}, c.dtype = DType::bf16, c.D = 64;
  for (int bad = 0; bad < 3; ++bad) {
    VarlenRun r(c);
    if (bad == 0) r.cu_q.set(1, 90), r.cu_k.set(2, 5);           // decreasing
    if (bad == 1) r.cu_q.set(3, 5000), r.cu_k.set(3, 9000);       // past the totals
    if (bad == 2) r.cu_k.set(1, -30), r.cu_q.set(2, 2000000000);  // negative, huge
    GpuVarlen gpu(r);
    gpu.run(Pass::forward, gpu.params());
    gpu.out.download();
    gpu.keep_begin.download();
    for (double x : r.out.values()) ASSERT_TRUE(std::isfinite(x)) << "an out element left unwritten, bad " << bad;
    for (double x : r.keep_begin.values()) EXPECT_GE(x, 0) << "bad " << bad;
    gpu.run(Pass::backward, gpu.params());
    gpu.dq.download();
    EXPECT_FALSE(r.dq.all_poisoned()) << "bad " << bad;
  }
}

// Batches with nothing to attend: no sequence, sequences without queries or without keys.
TEST(VarlenGpu, EmptyBatches) {
  REQUIRE_GPU();
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{}, {}}, {{0, 0}, {0, 4}}, {{3, 0}, {0, 0}}, {{0, 5, 0}, {3, 0, 2}}};
  for (const auto& [ql, kl] : cases) {
    VarlenCase c;
    c.q_lens = ql, c.k_lens = kl, c.dtype = DType::bf16, c.D = 64;
    run_gpu_varlen(c);
    c.dynamic = false, c.bias_heads = 1;
    run_gpu_varlen_attention(c);
  }
}

// attention_varlen: causal and not, mask and bias per KV head, shared (the dbias summed over
// heads, and Hk = 1 written directly) and per query head where H == Hk; D 64, 128, 256.
TEST(VarlenGpu, Attention) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  for (const auto& [ql, kl] : kLengths)
    for (bool causal : {true, false})
      for (int variant = 0; variant < 4; ++variant) {
        VarlenCase c;
        c.dynamic = false;
        c.q_lens = ql, c.k_lens = kl, c.causal = causal, c.seed = seed++;
        c.dtype = variant == 1 ? DType::f16 : DType::bf16;
        c.H = variant == 3 ? 2 : 4, c.Hk = variant == 1 ? 1 : 2, c.D = variant == 1 ? 128 : variant == 3 ? 256 : 64;
        c.bias_heads = variant == 0 ? 2 : variant == 3 ? 2 : 1;
        c.bias_dtype = variant == 0 ? DType::bf16 : variant == 1 ? DType::f16 : DType::f32;
        c.mask = variant != 0, c.mask_heads = variant == 2 ? 2 : 1;
        c.softcap = variant == 1 ? 2.0 : 0.0;
        run_gpu_varlen_attention(c);
      }
}

// Many short sequences: query tiles that meet several sequences, and the dk/dv walks split and
// not (FDMA_DKDV_SPLITS).
TEST(VarlenGpu, AttentionManySequences) {
  REQUIRE_GPU();
  ScopedEnv splits("FDMA_DKDV_SPLITS");
  std::mt19937_64 rng(7);
  VarlenCase c;
  c.dynamic = false, c.dtype = DType::bf16, c.H = 4, c.Hk = 2, c.D = 64;
  c.q_lens.clear(), c.k_lens.clear();
  for (int s = 0; s < 80; ++s) {
    const int64_t n = int64_t(rng() % 40);
    c.q_lens.push_back(n), c.k_lens.push_back(s % 3 ? n : int64_t(rng() % 40));
  }
  uint64_t seed = 900;
  for (const char* forced : {"1", "3"}) {
    splits.set(forced);
    for (bool causal : {true, false}) {
      c.causal = causal, c.seed = seed++, c.bias_heads = causal ? 1 : 0, c.mask = !causal;
      run_gpu_varlen_attention(c);
    }
  }
}

// Offsets the GPU cannot check (see BadOffsetsStayInBounds), with a mask and a bias: the call
// stays inside every tensor (compute-sanitizer memcheck runs this test) and writes every output.
TEST(VarlenGpu, AttentionBadOffsetsStayInBounds) {
  REQUIRE_GPU();
  VarlenCase c;
  c.dynamic = false, c.q_lens = {30, 20, 50}, c.k_lens = {40, 20, 60}, c.dtype = DType::bf16, c.D = 64;
  c.bias_heads = 1, c.mask = true;
  for (bool causal : {true, false})
    for (int bad = 0; bad < 3; ++bad) {
      c.causal = causal;
      VarlenRun r(c);
      if (bad == 0) r.cu_q.set(1, 90), r.cu_k.set(2, 5);           // decreasing
      if (bad == 1) r.cu_q.set(3, 5000), r.cu_k.set(3, 9000);       // past the totals
      if (bad == 2) r.cu_k.set(1, -30), r.cu_q.set(2, 2000000000);  // negative, huge
      GpuVarlenAttention gpu(r);
      gpu.run(Pass::forward);
      gpu.out.download();
      for (double x : r.out.values()) ASSERT_TRUE(std::isfinite(x)) << "an out element left unwritten, bad " << bad;
      gpu.run(Pass::backward);
      gpu.dq.download(), gpu.dk.download();
      EXPECT_FALSE(r.dq.all_poisoned()) << "bad " << bad;
      EXPECT_FALSE(r.dk.all_poisoned()) << "bad " << bad;
    }
}

// The key records hold one bias per KV head: a per-query-head bias with grouped heads is
// refused on the GPU with an error naming what to pass instead.
TEST(VarlenGpu, AttentionPerQueryHeadBiasWithGroupsIsRefused) {
  REQUIRE_GPU();
  VarlenCase c;
  c.dynamic = false, c.dtype = DType::bf16, c.D = 64, c.H = 4, c.Hk = 2, c.bias_heads = 4;
  VarlenRun r(c);
  GpuVarlenAttention gpu(r);
  AttentionParams p = gpu.params();
  try {
    (void)attention_workspace_size(p, Pass::forward);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("[Hk, total_k]"), std::string::npos) << e.what();
  }
}
