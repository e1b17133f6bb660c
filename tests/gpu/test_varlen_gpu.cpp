// Packed variable-length batches of dynamic_mask_attention on the GPU against the CPU backend
// and the float64 reference on the whole packed batch (varlen_case.hpp): the intervals exactly,
// outputs and gradients with the precision rule of test_dma_gpu.cpp; every selection path;
// offsets that are no prefix sums stay inside the tensors. Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include <memory>

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
  ScopedEnv path("FDMA_SELECT_PATH");
  uint64_t seed = 100;
  for (const char* forced : {"cluster", "shared", "global", "levels"}) {
    path.set(forced);
    SCOPED_TRACE(forced);
    for (bool causal : {true, false}) {
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
  }
}
