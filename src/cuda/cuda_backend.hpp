// The CUDA backend's entry points, called by src/core/api.cpp for device tensors. They
// check what only the GPU path requires (dtypes, alignment) and launch on params.stream.
#pragma once

#include "core/problem.hpp"
#include "cuda/attention/attention_bwd_params.hpp"

namespace fdma::cuda {

// Device workspace bytes. Forward: the mask tile summary when a mask is given, else 0.
// Backward: that summary, delta and lse2 rows, and the dbias reduction slots.
size_t attention_workspace(const detail::AttentionProblem& prob, Pass pass);
void attention_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob);
void attention_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob);

// attention over a packed variable-length batch, given its packed view (core/varlen.hpp): the
// dynamic-mask kernels keeping every key a query may see (attention_varlen.cu).
size_t attention_varlen_workspace(const fdma_attention_params& p, const detail::AttentionProblem& prob, Pass pass);
void attention_varlen_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob);
void attention_varlen_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob);

// The kernels behind both operations, from prepared params (attention_cuda.cu). The
// backward runs its prepare kernel (k.delta, k.lse2; not where `prepared`: the dynamic-mask
// backward's setup launch wrote them), dq and dk/dv, and the dbias finish.
void run_forward_kernel(const AttentionFwdParams& k, DType dtype, void* stream);
void run_backward_kernels(const AttentionBwdParams& k, DType dtype, void* stream, bool prepared = false);
// Whether the backward of k runs on the warp-specialized kernel (attention_bwd_ws.cuh) on the
// current device: with key lists it writes fp32 dk/dv rows, so their caller asks first.
bool backward_ws_takes(const AttentionBwdParams& k, DType dtype);

// select and dynamic_mask_attention (dma_cuda.cu).
size_t select_workspace(const fdma_select_params& p, const detail::SelectProblem& prob);
void select(const fdma_select_params& p, const detail::SelectProblem& prob);
size_t dma_workspace(const fdma_dma_params& p, const detail::DmaProblem& prob, Pass pass);
void dma_forward(const fdma_dma_params& p, const detail::DmaProblem& prob);
void dma_backward(const fdma_dma_params& p, const detail::DmaProblem& prob);

// Every element of a device tensor set to one bit pattern of its dtype's size (fill.cu): the
// outputs of problems with no batch, query or key.
void fill(const fdma_tensor& t, uint64_t pattern, void* stream);

// Attention against a KV cache (kvcache_cuda.cu): the decode path.
size_t kvcache_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);
void kvcache_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);

// dynamic_mask_attention's forward with at most kDecodeMaxQueries queries, no key padding, no
// intervals to write and no determinism asked for runs on the decode path, as a KV-cache call
// over full caches (its list order follows the selection's atomics). FDMA_DMA_DECODE=0 keeps
// such calls on the training kernels.
constexpr int64_t kDecodeMaxQueries = 16;
bool dma_forward_takes_decode_path(const fdma_dma_params& p, const detail::DmaProblem& prob);
size_t dma_decode_workspace(const fdma_dma_params& p, const detail::DmaProblem& prob);
void dma_decode_forward(const fdma_dma_params& p, const detail::DmaProblem& prob);

}  // namespace fdma::cuda
