// dynamic_mask_attention and select on the GPU against the CPU backend and the float64
// reference (non-causal: the GPU path so far). The selection is compared exactly; outputs
// with the precision rule of test_attention_gpu.cpp. Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include "device_tensor.hpp"
#include "dma_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped"

double max_err(const std::vector<double>& a, const std::vector<double>& r) {
  double m = 0;
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isfinite(r[i])) m = std::max(m, std::fabs(a[i] - r[i]));
  return m;
}

struct DeviceWorkspace {
  void* ptr = nullptr;
  explicit DeviceWorkspace(size_t bytes) {
    if (bytes) cudaMalloc(&ptr, bytes);
  }
  ~DeviceWorkspace() {
    if (ptr) cudaFree(ptr);
  }
};

void run_gpu_dma(DmaRun& r) {
  const DmaCase& c = r.c;
  SCOPED_TRACE(c.str());
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values(), cpu_lse = r.lse.values();
  const auto ref = ref::forward(r.rp);

  DeviceTensor q(r.q), k(r.k), v(r.v), scores(r.scores), pad(r.pad), out(r.out), lse(r.lse);
  DmaParams p = r.params();
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.key_scores = scores.view(), p.out = out.view(), p.lse = lse.view();
  if (c.padding) p.key_padding = pad.view();
  p.dout = Tensor(), p.dq = Tensor(), p.dk = Tensor(), p.dv = Tensor(), p.dkey_scores = Tensor();
  const size_t bytes = dma_workspace_size(p, Pass::forward);
  DeviceWorkspace ws(bytes);
  p.workspace = ws.ptr, p.workspace_bytes = bytes;
  out.poison();
  lse.poison();
  dma_forward(p);
  FDMA_CUDA_OK(cudaDeviceSynchronize());
  out.download();
  lse.download();

  const double cpu_err = max_err(cpu_out, ref.out);
  const double bound = 2 * cpu_err + unit(c.dtype) * std::max(1e-3, max_abs(ref.out));
  EXPECT_TRUE(all_close(r.out.values(), ref.out, {bound, 0.0}, "out (GPU)")) << "CPU backend error " << cpu_err;
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));
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

TEST(DmaGpu, CausalAndBackwardSayNotYet) {
  REQUIRE_GPU();
  DmaCase c;
  c.B = 1, c.Sq = 16, c.Sk = 16, c.H = 2, c.Hk = 1, c.D = 64, c.w = 4, c.dtype = DType::bf16;
  DmaRun r(c);
  DeviceTensor q(r.q), k(r.k), v(r.v), scores(r.scores), out(r.out), lse(r.lse);
  DmaParams p = r.params();
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.key_scores = scores.view(), p.out = out.view(), p.lse = lse.view();
  p.causal = 1;
  try {
    dma_workspace_size(p, Pass::forward);
    ADD_FAILURE() << "causal accepted on the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("causal selection has no CUDA kernels yet"), std::string::npos) << e.what();
  }
}
