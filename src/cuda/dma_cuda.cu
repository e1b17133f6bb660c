// dynamic_mask_attention and select on the GPU. Non-causal so far: every query of a
// (batch, kv head) keeps the same top-w keys, so the forward is selection, a gather of those
// keys' K/V rows and scores, and the attention forward over them (the "floor" shape).
#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/select_topw.cuh"

namespace fdma::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void unsupported(const char* op, const std::string& msg) {
  detail::fail(Status::unsupported, std::string(op) + " (CUDA): " + msg);
}

void check_cuda(cudaError_t err, const char* op, const char* what) {
  cuda::check_cuda(err, std::string(op) + " (CUDA): " + what);
}

// What the GPU selection needs beyond validation: 16/32-bit scores, int32 sort offsets.
void check_selection_inputs(const char* op, const fdma_tensor& scores) {
  if (scores.dtype != FDMA_FLOAT32 && scores.dtype != FDMA_FLOAT16 && scores.dtype != FDMA_BFLOAT16)
    unsupported(op, std::string("key_scores has dtype ") + dtype_name(static_cast<DType>(scores.dtype)) +
                        "; the GPU takes float32, float16 or bfloat16");
  if (scores.shape[0] * scores.shape[1] * scores.shape[2] >= (int64_t(1) << 31))
    unsupported(op, "B * Hk * Sk must be below 2^31 on the GPU");
}

TopwInputs topw_inputs(const fdma_tensor& scores, const fdma_tensor& padding) {
  TopwInputs in{};
  in.scores = scores.data;
  in.score_dtype = scores.dtype;
  for (int d = 0; d < 3; ++d) in.score_stride[d] = scores.stride[d];
  if (padding.data) {
    in.padding = static_cast<const uint8_t*>(padding.data);
    in.padding_stride[0] = padding.shape[0] > 1 ? padding.stride[0] : 0;
    in.padding_stride[1] = padding.stride[1];
  }
  in.B = int(scores.shape[0]);
  in.Hk = int(scores.shape[1]);
  in.Sk = int(scores.shape[2]);
  in.index_bits = 1;
  while ((int64_t(1) << in.index_bits) < in.Sk) ++in.index_bits;
  return in;
}

void require_non_causal(const char* op, bool causal) {
  if (causal)
    unsupported(op, "causal selection has no CUDA kernels yet (non-causal runs on the GPU; the CPU backend does both)");
}

void require_device_workspace(const char* op, const void* ws) {
  if (!detail::locate_pointer(ws).device)
    detail::fail(Status::workspace, std::string(op) + " (CUDA): the workspace must be CUDA device memory");
}

// Gathered K, V and bias follow the sort scratch in the workspace.
struct DmaLayout {
  size_t topw, kv, bias;
  int W;
  size_t total() const { return topw + 2 * kv + bias; }
};

DmaLayout dma_layout(const detail::DmaProblem& prob, const TopwInputs& in) {
  const detail::Dims& d = prob.dims;
  DmaLayout l;
  l.W = int(std::min<int64_t>(prob.window, d.Sk));
  l.topw = align_up(topw_workspace(in, nullptr));
  l.kv = align_up(size_t(d.B) * l.W * d.Hk * d.D * dtype_size(prob.dtype));
  l.bias = align_up(size_t(d.B) * d.Hk * l.W * 4);
  return l;
}

}  // namespace

// select: the sort, then intervals (causal: through the wavelet matrix after the sort scratch).
size_t select_workspace(const fdma_select_params& p, const detail::SelectProblem& prob) {
  check_selection_inputs("select", p.key_scores);
  const TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  return align_up(topw_workspace(in, nullptr)) + (prob.causal ? wavelet_workspace(in, nullptr) : 0);
}

void select(const fdma_select_params& p, const detail::SelectProblem& prob) {
  check_selection_inputs("select", p.key_scores);
  require_device_workspace("select", p.workspace);
  DeviceGuard guard(p.key_scores.data);
  const TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  const TopwScratch s = carve_topw(p.workspace, in);
  auto stream = static_cast<cudaStream_t>(p.stream);
  check_cuda(topw_sort(in, s, stream), "select", "sort");
  int64_t bs[3], es[3];
  for (int d = 0; d < 3; ++d) bs[d] = p.keep_begin.stride[d], es[d] = p.keep_end.stride[d];
  auto* begin = static_cast<int32_t*>(p.keep_begin.data);
  auto* end = static_cast<int32_t*>(p.keep_end.data);
  if (prob.causal) {
    const WaveletScratch wv = carve_wavelet(static_cast<char*>(p.workspace) + align_up(topw_workspace(in, nullptr)), in);
    check_cuda(causal_intervals(in, s, wv, prob.window, int(prob.Sq), begin, bs, end, es, stream), "select",
               "causal intervals");
  } else {
    check_cuda(topw_intervals(in, s, prob.window, int(prob.Sq), begin, bs, end, es, stream), "select", "intervals");
  }
}

size_t dma_workspace(const fdma_dma_params& p, const detail::DmaProblem& prob, Pass pass) {
  if (pass != Pass::forward) unsupported("dynamic_mask_attention", "the backward has no CUDA kernels yet");
  require_non_causal("dynamic_mask_attention", prob.causal);
  check_selection_inputs("dynamic_mask_attention", p.key_scores);
  return dma_layout(prob, topw_inputs(p.key_scores, p.key_padding)).total();
}

void dma_forward(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const char* op = "dynamic_mask_attention forward";
  require_non_causal(op, prob.causal);
  if (prob.dtype != DType::bf16 && prob.dtype != DType::f16)
    unsupported(op, std::string("q has dtype ") + dtype_name(prob.dtype) + "; the GPU takes float16 or bfloat16");
  const detail::Dims& d = prob.dims;
  if (d.D % 8 != 0) unsupported(op, "head dim D must be a multiple of 8 on the GPU");
  for (const fdma_tensor* t : {&p.k, &p.v}) {
    bool ok = reinterpret_cast<uintptr_t>(t->data) % 16 == 0;
    for (int i = 0; i < 3; ++i) ok &= t->shape[i] == 1 || t->stride[i] % 8 == 0;
    if (!ok) unsupported(op, "k and v must be 16-byte aligned with strides that are multiples of 8 elements");
  }
  check_selection_inputs(op, p.key_scores);
  require_device_workspace(op, p.workspace);
  DeviceGuard guard(p.q.data);
  const TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  const DmaLayout l = dma_layout(prob, in);
  char* base = static_cast<char*>(p.workspace);
  const TopwScratch s = carve_topw(base, in);
  void* k_g = base + l.topw;
  void* v_g = base + l.topw + l.kv;
  float* bias_g = reinterpret_cast<float*>(base + l.topw + 2 * l.kv);
  auto stream = static_cast<cudaStream_t>(p.stream);

  check_cuda(topw_sort(in, s, stream), op, "sort");
  GatherArgs g{};
  g.k = p.k.data, g.v = p.v.data;
  for (int i = 0; i < 3; ++i) g.k_stride[i] = p.k.stride[i], g.v_stride[i] = p.v.stride[i];
  g.k_out = k_g, g.v_out = v_g, g.bias_out = bias_g;
  g.D = int(d.D), g.W = l.W, g.elem_bytes = int(dtype_size(prob.dtype));
  g.add_scores = prob.add_scores;
  check_cuda(topw_gather(in, s, g, stream), op, "gather");

  // Attention of every query over its (b, kv head)'s kept keys; empty slots carry -inf.
  AttentionParams a;
  a.q = p.q;
  a.k = Tensor(k_g, prob.dtype, {d.B, l.W, d.Hk, d.D});
  a.v = Tensor(v_g, prob.dtype, {d.B, l.W, d.Hk, d.D});
  a.bias = Tensor(bias_g, DType::f32, {d.B, d.Hk, 1, l.W});
  a.scale = prob.scale;
  a.softcap = prob.softcap;
  a.out = p.out;
  a.lse = p.lse;
  a.backend = FDMA_BACKEND_CUDA;
  a.stream = p.stream;
  fdma::attention_forward(a);
}

}  // namespace fdma::cuda
