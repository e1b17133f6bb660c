// Chunked prefill against a KV cache (prefill.cu): a causal dynamic-mask call with more
// queries than a decode step, run through the training forward over a compact copy of the
// only keys its queries can keep.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// Whether the call takes this path: dynamic mask, causal, more than kDecodeMaxQueries
// queries, and min(window, capacity) positions fit the prefix selection's shared memory.
bool kvcache_takes_prefill_path(const detail::KvCacheProblem& prob);

size_t prefill_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);

// After the append: selection, compaction, the training forward and (with a select_state)
// the state's update, all on `stream` with the caller's workspace.
void prefill_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob, const CacheView& cache,
                     cudaStream_t stream);

}  // namespace fdma::cuda
