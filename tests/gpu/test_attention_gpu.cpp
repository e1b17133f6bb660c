// attention forward on the GPU against the CPU backend and the float64 reference, on the
// same inputs: every case of the CPU matrix that the GPU path supports (bf16/fp16, head
// dims that are multiples of 8). Tolerance from the precision (FlashAttention-3's rule):
// GPU error <= 2 x the CPU backend's error + one rounding unit of the output dtype.
// Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include "attention_case.hpp"
#include "device_tensor.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

double max_err(const std::vector<double>& a, const std::vector<double>& r) {
  double m = 0;
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isfinite(r[i])) m = std::max(m, std::fabs(a[i] - r[i]));
  return m;
}

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped"

void run_gpu_forward(AttnRun& r, cudaStream_t stream = nullptr) {
  const AttnCase& c = r.c;
  SCOPED_TRACE(c.str());
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values();
  const auto ref = ref::forward(r.rp);

  DeviceTensor q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse);
  std::unique_ptr<DeviceTensor> mask, bias;
  ASSERT_TRUE(q.ok() && k.ok() && v.ok() && out.ok() && lse.ok());
  AttentionParams p = r.params();
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view(), p.lse = lse.view();
  if (c.mask.present) {
    mask = std::make_unique<DeviceTensor>(r.mask);
    p.mask = mask->view();
  }
  if (c.bias.present) {
    bias = std::make_unique<DeviceTensor>(r.bias);
    p.bias = bias->view();
  }
  p.stream = stream;
  out.poison();
  lse.poison();
  const size_t ws_bytes = attention_workspace_size(p, Pass::forward);
  EXPECT_EQ(ws_bytes == 0, !c.mask.present);  // only the mask tile summary needs workspace
  void* ws = nullptr;
  if (ws_bytes) FDMA_CUDA_OK(cudaMalloc(&ws, ws_bytes));
  p.workspace = ws, p.workspace_bytes = ws_bytes;
  attention_forward(p);
  FDMA_CUDA_OK(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize());
  if (ws) cudaFree(ws);
  out.download();
  lse.download();

  const auto gpu_out = r.out.values();
  const double cpu_err = max_err(cpu_out, ref.out);
  const double bound = 2 * cpu_err + unit(c.dtype) * std::max(1e-3, max_abs(ref.out));
  EXPECT_TRUE(all_close(gpu_out, ref.out, {bound, 0.0}, "out (GPU)")) << "CPU backend error " << cpu_err;
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));
}

void run_gpu_forward(const AttnCase& c, cudaStream_t stream = nullptr) {
  AttnRun r(c);
  run_gpu_forward(r, stream);
}

AttnCase base(int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D, bool causal, DType dt, uint64_t seed) {
  AttnCase c;
  c.B = 2, c.Sq = Sq, c.Sk = Sk, c.H = H, c.Hk = Hk, c.D = D, c.causal = causal, c.dtype = dt, c.seed = seed;
  return c;
}

}  // namespace

TEST(AttentionGpu, RaggedLengthsHeadsCausal) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {64, 64}, {65, 65}, {100, 127},
                          {129, 63}, {1, 300}, {257, 1000}})
      for (auto [H, Hk] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}})
        for (bool causal : {false, true}) run_gpu_forward(base(Sq, Sk, H, Hk, 64, causal, dt, seed++));
}

TEST(AttentionGpu, HeadDims) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {8, 32, 40, 64, 96, 112, 128, 160, 192, 256}) run_gpu_forward(base(77, 150, 4, 2, D, true, dt, seed++));
}

TEST(AttentionGpu, EveryMaskAndBiasBroadcastShape) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (int heads : {0, 1, 2})
    for (int bits = 0; bits < 8; ++bits) {
      AttnCase c = base(70, 90, 4, 2, 32, bits & 1, DType::bf16, seed++);
      c.mask.present = true;
      c.mask.b = bits & 1, c.mask.q = bits & 2, c.mask.k = bits & 4, c.mask.heads = heads;
      c.mask.expanded = bits == 5;
      run_gpu_forward(c);
      AttnCase d = base(70, 90, 4, 2, 32, bits & 2, DType::f16, seed++);
      d.bias.present = true;
      d.bias.b = bits & 1, d.bias.q = bits & 2, d.bias.k = bits & 4, d.bias.heads = heads;
      d.bias.dtype = heads == 1 ? DType::f32 : DType::unset;
      d.bias.expanded = bits == 6;
      run_gpu_forward(d);
    }
}

TEST(AttentionGpu, MaskBiasSoftcapLayoutsEmptyRows) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (int layout : {0, 1, 3})
    for (double softcap : {0.0, 4.0}) {
      AttnCase c = base(150, 130, 4, 1, 128, true, layout == 1 ? DType::f16 : DType::bf16, seed++);
      c.layout = layout, c.softcap = softcap;
      c.mask.present = true;
      c.mask.heads = 1;
      c.empty_rows = 5;
      c.bias.present = true;
      c.bias.q = false;
      run_gpu_forward(c);
    }
}

TEST(AttentionGpu, LongSequenceOnAStream) {
  REQUIRE_GPU();
  cudaStream_t s;
  FDMA_CUDA_OK(cudaStreamCreate(&s));
  AttnCase c = base(1000, 2100, 8, 2, 128, true, DType::bf16, 400);
  c.B = 1;
  run_gpu_forward(c, s);
  cudaStreamDestroy(s);
}

TEST(AttentionGpu, ClearErrorsForWhatTheGpuPathRejects) {
  REQUIRE_GPU();
  AttnRun r(base(16, 16, 2, 2, 64, false, DType::bf16, 500));
  DeviceTensor q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse), dout(r.dout), dq(r.dq), dk(r.dk), dv(r.dv);
  AttentionParams p = r.params();
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view(), p.lse = lse.view();
  p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
  // Mixed devices: host k with device q.
  AttentionParams mixed = p;
  mixed.k = r.k.view();
  try {
    attention_forward(mixed);
    ADD_FAILURE() << "mixed host/device tensors accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("k is host memory but the CUDA backend runs this call"), std::string::npos)
        << e.what();
  }
  // Forcing the CPU backend on device memory is refused, not a crash.
  AttentionParams cpu = p;
  cpu.backend = FDMA_BACKEND_CPU;
  EXPECT_THROW(attention_forward(cpu), Error);
  // Not yet on the GPU: the backward says so.
  try {
    attention_workspace_size(p, Pass::backward);
    ADD_FAILURE() << "GPU backward claimed";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported) << e.what();
  }
}

TEST(AttentionGpu, MaskAndBiasTilesThroughSharedMemory) {
  // Key lengths whose rows are 16-byte aligned take the shared-memory tile path; 272 and 1040
  // also leave a partial last key tile.
  REQUIRE_GPU();
  uint64_t seed = 600;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{200, 256}, {333, 272}, {64, 1040}})
    for (int heads : {0, 1, 2})
      for (int bits = 0; bits < 4; ++bits) {
        AttnCase c = base(Sq, Sk, 4, 2, bits & 1 ? 128 : 64, bits & 2, bits & 1 ? DType::bf16 : DType::f16, seed++);
        c.mask.present = true;
        c.mask.heads = heads, c.mask.q = bits & 1, c.mask.b = bits & 2;
        c.bias.present = true;
        c.bias.heads = 2 - heads, c.bias.q = !(bits & 1), c.bias.b = bits & 1;
        c.bias.dtype = bits & 2 ? DType::f32 : DType::unset;
        run_gpu_forward(c);
      }
}

TEST(AttentionGpu, BlockSparseMaskSkipsEmptyTiles) {
  // 64x64 blocks kept with probability 1/8 (elements inside with 1/2): most forward tiles
  // hold no kept key and are skipped; rows whose blocks are all off must still give zeros.
  REQUIRE_GPU();
  uint64_t seed = 700;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      AttnCase c = base(700, 900, 4, 2, D, causal, DType::bf16, seed++);
      c.mask.present = true;
      c.mask.b = false, c.mask.heads = 0;
      AttnRun r(c);
      std::mt19937_64 rng(seed);
      std::bernoulli_distribution block_on(1.0 / 8), elem_on(0.5);
      const int64_t nbq = (c.Sq + 63) / 64, nbk = (c.Sk + 63) / 64;
      std::vector<char> on(nbq * nbk);
      for (auto& x : on) x = block_on(rng);
      for (int64_t i = 0; i < c.Sq; ++i)
        for (int64_t j = 0; j < c.Sk; ++j) r.mask.set(i * c.Sk + j, on[(i / 64) * nbk + j / 64] && elem_on(rng));
      auto full = expand_full(c, r.mask.values(), declared_shape(c, c.mask));
      r.rp.keep.assign(full.begin(), full.end());
      run_gpu_forward(r);
    }
}
