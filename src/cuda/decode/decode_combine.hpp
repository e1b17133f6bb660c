// Host entry of the split-K merge (decode_combine.cu): one CTA per (batch, head, query) row.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// overlap: launched overlapping the attention kernel (launch.cuh), which lets it in after its loop.
cudaError_t run_decode_combine(const DecodeAttentionArgs& args, int rows, bool bf16, cudaStream_t stream, bool overlap);

}  // namespace fdma::cuda
