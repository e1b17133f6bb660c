// The CUDA backend's entry points, called by src/core/api.cpp for device tensors. They
// check what only the GPU path requires (dtypes, alignment) and launch on params.stream.
#pragma once

#include "core/problem.hpp"

namespace fdma::cuda {

// Device workspace bytes: the mask tile summary when a mask is given, else 0.
size_t attention_workspace(const detail::AttentionProblem& prob, Pass pass);
void attention_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob);

}  // namespace fdma::cuda
