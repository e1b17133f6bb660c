// Launchers of the attention backward's helper kernels (attention_bwd_aux.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/attention_bwd_params.hpp"

namespace fdma::cuda {

// delta and lse2, [B, H, Sq_pad] fp32 each, as AttentionBwdParams describes them.
template <class T>
cudaError_t launch_bwd_prepare(const AttentionBwdParams& p, cudaStream_t stream);

// dbias from p.dbias_acc's slots (only when the backward reduced into them).
template <class T>
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream);

// dq from p.dq_acc (the fused backward's fp32 sums, `cols` columns: the kernel's head dim),
// converted to its dtype.
template <class T>
cudaError_t launch_bwd_dq_convert(const AttentionBwdParams& p, int cols, cudaStream_t stream);

}  // namespace fdma::cuda
