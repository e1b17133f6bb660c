// Launcher of the attention backward's dbias finish kernel (attention_bwd_aux.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention_bwd_params.hpp"

namespace fdma::cuda {

// dbias from p.dbias_acc's slots (only when the backward reduced into them).
template <class T>
cudaError_t launch_dbias_finish(const AttentionBwdParams& p, cudaStream_t stream);

}  // namespace fdma::cuda
