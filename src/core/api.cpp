// The C++ API: validate, check the workspace, dispatch to a backend.
#include <cmath>
#include <cstring>
#include <string>

#include "core/device.hpp"
#include "core/fill.hpp"
#include "core/parallel.hpp"
#include "core/problem.hpp"
#include "core/varlen.hpp"
#include "cpu/cpu_backend.hpp"
#ifdef FDMA_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

#ifndef FDMA_VERSION_STRING
#define FDMA_VERSION_STRING "0.1.0"
#endif

namespace fdma {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::boolean: return 1;
    case DType::i32: return 4;
    default: return 0;
  }
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::boolean: return "bool";
    case DType::i32: return "int32";
    case DType::unset: return "unset";
    default: return "unknown";
  }
}

namespace {
void fill_tensor(fdma_tensor& t, const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  if (shape.size() > FDMA_MAX_DIMS) throw Error(Status::invalid_argument, "Tensor: at most 4 dims");
  t.data = const_cast<void*>(data);
  t.dtype = static_cast<int32_t>(dtype);
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
}
}  // namespace

Tensor::Tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape) : fdma_tensor{} {
  fill_tensor(*this, data, dtype, shape);
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    this->stride[d] = stride;
    stride *= this->shape[d];
  }
}

Tensor::Tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape,
               std::initializer_list<int64_t> strides)
    : fdma_tensor{} {
  fill_tensor(*this, data, dtype, shape);
  if (strides.size() != shape.size()) throw Error(Status::invalid_argument, "Tensor: shape and strides differ in length");
  int d = 0;
  for (int64_t s : strides) stride[d++] = s;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

#ifndef FDMA_HAVE_CUDA
namespace {

[[noreturn]] void no_cuda_kernels(const char* op) {
  detail::fail(Status::unsupported, std::string(op) +
                                        ": this build has no CUDA kernels for this operation yet; pass host tensors "
                                        "to run it on the CPU backend");
}

}  // namespace
#endif

namespace detail {

// The bits of 0 or -inf in a dtype.
static uint64_t pattern_of(DType dtype, bool minus_inf) {
  if (!minus_inf) return 0;
  switch (dtype) {
    case DType::f32: return 0xff800000u;
    case DType::f64: return 0xfff0000000000000ull;
    case DType::f16: return 0xfc00u;
    case DType::bf16: return 0xff80u;
    default: return 0;
  }
}

void fill(const fdma_tensor& t, bool minus_inf, Backend backend, void* stream) {
  int64_t n = t.ndim > 0 ? 1 : 0;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  if (n == 0 || !t.data) return;
  const uint64_t pattern = pattern_of(static_cast<DType>(t.dtype), minus_inf);
  if (backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    cuda::fill(t, pattern, stream);
#endif
    return;
  }
  (void)stream;  // the CPU fills in place
  const size_t bytes = dtype_size(static_cast<DType>(t.dtype));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, off = 0;
    for (int d = t.ndim - 1; d >= 0; --d) off += (rest % t.shape[d]) * t.stride[d], rest /= t.shape[d];
    std::memcpy(static_cast<char*>(t.data) + off * int64_t(bytes), &pattern, bytes);  // little-endian low bytes
  }
}

}  // namespace detail

namespace {

using detail::fill;

// Problems with no batch, query or key (validation lets B, Sq and Sk be 0) run no kernel. What
// they compute, as SDPA and FlashAttention return it: outputs with no elements, or zeros for
// out and every gradient (no key is attended, no query attends) and -inf for lse (the log of
// an empty sum).
bool empty(const detail::Dims& d) { return d.B == 0 || d.Sq == 0 || d.Sk == 0; }
// A packed batch with no sequence, or max lengths of 0, has nothing to attend either (the CUDA
// backend clamps each sequence to the max lengths; the CPU checked they hold).
bool empty(const detail::Dims& d, const detail::Varlen& v) {
  return empty(d) || (v.on && (v.num_seqs == 0 || v.max_q == 0 || v.max_k == 0));
}
bool empty(const detail::DmaProblem& p) { return empty(p.dims, p.varlen); }
bool empty(const detail::AttentionProblem& p) { return empty(p.dims, p.varlen); }
bool empty(const detail::SelectProblem& s) { return s.B == 0 || s.Sq == 0 || s.Sk == 0; }
// A KV-cache call with no query appends nothing either (validation refuses that).
bool empty(const detail::KvCacheProblem& k) { return k.dims.B == 0 || k.dims.Sq == 0; }

size_t cpu_workspace(const detail::AttentionProblem& prob, Pass pass) {
  return prob.varlen.on ? cpu::attention_varlen_workspace(prob, pass) : cpu::attention_workspace(prob, pass);
}
size_t cpu_workspace(const detail::DmaProblem& prob, Pass pass) {
  return prob.varlen.on ? cpu::dma_varlen_workspace(prob, pass) : cpu::dma_workspace(prob, pass);
}

template <class P>
void empty_forward(const P& p, Backend b) {
  fill(p.out, false, b, p.stream);
  fill(p.lse, true, b, p.stream);
}

template <class P>
void empty_backward(const P& p, Backend b) {
  for (const fdma_tensor* t : {&p.dq, &p.dk, &p.dv}) fill(*t, false, b, p.stream);
}

}  // namespace

size_t attention_workspace_size(const fdma_attention_params& p, Pass pass) {
  auto prob = detail::validate_attention(p, pass);
  if (empty(prob)) return 0;
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    // A packed batch runs as its packed view (core/varlen.hpp), which keeps cu_seqlens.
    if (prob.varlen.on) return cuda::attention_varlen_workspace(detail::packed_view(p), prob, pass);
    return cuda::attention_workspace(prob, pass);
#else
    no_cuda_kernels("attention");
#endif
  }
  return cpu_workspace(prob, pass);
}

void attention_forward(const fdma_attention_params& p) {
  auto prob = detail::validate_attention(p, Pass::forward);
  if (empty(prob)) return empty_forward(p, prob.backend);
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    if (prob.varlen.on) {
      const fdma_attention_params v = detail::packed_view(p);
      detail::check_workspace("attention forward", p.workspace, p.workspace_bytes,
                              cuda::attention_varlen_workspace(v, prob, Pass::forward));
      return cuda::attention_varlen_forward(v, prob);
    }
    detail::check_workspace("attention forward", p.workspace, p.workspace_bytes, cuda::attention_workspace(prob, Pass::forward));
    return cuda::attention_forward(p, prob);
#else
    no_cuda_kernels("attention forward");
#endif
  }
  detail::check_workspace("attention forward", p.workspace, p.workspace_bytes, cpu_workspace(prob, Pass::forward));
  prob.varlen.on ? cpu::attention_varlen_forward(p, prob) : cpu::attention_forward(p, prob);
}

void attention_backward(const fdma_attention_params& p) {
  auto prob = detail::validate_attention(p, Pass::backward);
  if (empty(prob)) {
    empty_backward(p, prob.backend);
    return fill(p.dbias, false, prob.backend, p.stream);
  }
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    if (prob.varlen.on) {
      const fdma_attention_params v = detail::packed_view(p);
      detail::check_workspace("attention backward", p.workspace, p.workspace_bytes,
                              cuda::attention_varlen_workspace(v, prob, Pass::backward));
      return cuda::attention_varlen_backward(v, prob);
    }
    detail::check_workspace("attention backward", p.workspace, p.workspace_bytes,
                            cuda::attention_workspace(prob, Pass::backward));
    return cuda::attention_backward(p, prob);
#else
    no_cuda_kernels("attention backward");
#endif
  }
  detail::check_workspace("attention backward", p.workspace, p.workspace_bytes,
                          cpu_workspace(prob, Pass::backward));
  prob.varlen.on ? cpu::attention_varlen_backward(p, prob) : cpu::attention_backward(p, prob);
}

size_t select_workspace_size(const fdma_select_params& p) {
  auto prob = detail::validate_select(p);
  if (empty(prob)) return 0;
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    return cuda::select_workspace(p, prob);
#else
    no_cuda_kernels("select");
#endif
  }
  return cpu::select_workspace(prob, static_cast<DType>(p.key_scores.dtype));
}

void select_keys(const fdma_select_params& p) {
  auto prob = detail::validate_select(p);
  if (empty(prob)) {  // every key kept by no query: [0, 0)
    fill(p.keep_begin, false, prob.backend, p.stream);
    return fill(p.keep_end, false, prob.backend, p.stream);
  }
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    detail::check_workspace("select", p.workspace, p.workspace_bytes, cuda::select_workspace(p, prob));
    return cuda::select(p, prob);
#else
    no_cuda_kernels("select");
#endif
  }
  detail::check_workspace("select", p.workspace, p.workspace_bytes,
                          cpu::select_workspace(prob, static_cast<DType>(p.key_scores.dtype)));
  cpu::select(p, prob);
}

size_t dma_workspace_size(const fdma_dma_params& p, Pass pass) {
  auto prob = detail::validate_dma(p, pass);
  if (empty(prob)) return 0;
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    return prob.varlen.on ? cuda::dma_workspace(detail::packed_view(p), prob, pass) : cuda::dma_workspace(p, prob, pass);
#else
    no_cuda_kernels("dynamic_mask_attention");
#endif
  }
  return cpu_workspace(prob, pass);
}

void dma_forward(const fdma_dma_params& p) {
  auto prob = detail::validate_dma(p, Pass::forward);
  if (empty(prob)) {
    empty_forward(p, prob.backend);
    fill(p.keep_begin, false, prob.backend, p.stream);
    return fill(p.keep_end, false, prob.backend, p.stream);
  }
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    // A packed batch runs as its packed view (core/varlen.hpp), which keeps cu_seqlens.
    fdma_dma_params view;
    const fdma_dma_params& v = prob.varlen.on ? (view = detail::packed_view(p)) : p;
    detail::check_workspace("dynamic_mask_attention forward", p.workspace, p.workspace_bytes,
                            cuda::dma_workspace(v, prob, Pass::forward));
    return cuda::dma_forward(v, prob);
#else
    no_cuda_kernels("dynamic_mask_attention forward");
#endif
  }
  detail::check_workspace("dynamic_mask_attention forward", p.workspace, p.workspace_bytes,
                          cpu_workspace(prob, Pass::forward));
  prob.varlen.on ? cpu::dma_varlen_forward(p, prob) : cpu::dma_forward(p, prob);
}

void dma_backward(const fdma_dma_params& p) {
  auto prob = detail::validate_dma(p, Pass::backward);
  if (empty(prob)) {
    empty_backward(p, prob.backend);
    return fill(p.dkey_scores, false, prob.backend, p.stream);
  }
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    fdma_dma_params view;
    const fdma_dma_params& v = prob.varlen.on ? (view = detail::packed_view(p)) : p;
    detail::check_workspace("dynamic_mask_attention backward", p.workspace, p.workspace_bytes,
                            cuda::dma_workspace(v, prob, Pass::backward));
    return cuda::dma_backward(v, prob);
#else
    no_cuda_kernels("dynamic_mask_attention backward");
#endif
  }
  detail::check_workspace("dynamic_mask_attention backward", p.workspace, p.workspace_bytes,
                          cpu_workspace(prob, Pass::backward));
  prob.varlen.on ? cpu::dma_varlen_backward(p, prob) : cpu::dma_backward(p, prob);
}

size_t kvcache_workspace_size(const fdma_kvcache_params& p) {
  auto prob = detail::validate_kvcache(p);
  if (empty(prob)) return 0;
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    return cuda::kvcache_workspace(p, prob);
#else
    no_cuda_kernels("kvcache attention");
#endif
  }
  return cpu::kvcache_workspace(p, prob);
}

void kvcache_forward(const fdma_kvcache_params& p) {
  auto prob = detail::validate_kvcache(p);
  if (empty(prob)) return;
  if (prob.backend == Backend::cuda) {
#ifdef FDMA_HAVE_CUDA
    detail::check_workspace("kvcache attention", p.workspace, p.workspace_bytes, cuda::kvcache_workspace(p, prob));
    return cuda::kvcache_forward(p, prob);
#else
    no_cuda_kernels("kvcache attention");
#endif
  }
  detail::check_workspace("kvcache attention", p.workspace, p.workspace_bytes, cpu::kvcache_workspace(p, prob));
  cpu::kvcache_forward(p, prob);
}

void set_num_threads(int n) { detail::set_num_threads(n); }
int num_threads() { return detail::num_threads(); }
bool cuda_available() { return detail::cuda_runtime_usable(); }
const char* version() { return FDMA_VERSION_STRING; }

}  // namespace fdma
