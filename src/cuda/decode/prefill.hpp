// Chunked prefill against a KV cache (prefill.cu): a dynamic-mask call with more queries
// than a decode step, run through the training forward over a compact copy of the
// only keys its queries can keep.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// Below these query counts the decode kernels are faster. H100, B1 H16 Hk4 D128 w2048, a chunk
// at the end of 32K keys, ms, decode kernels against this path without a state: causal 32
// queries 0.126 / 0.228, 64: 0.190 / about 0.21, 128: 0.328 / about 0.20; non-causal 256:
// 0.137 / about 0.16, 1024: 0.346 / 0.166 (docs/benchmarks.md).
constexpr int64_t kPrefillMinQueriesCausal = 64;
constexpr int64_t kPrefillMinQueriesNonCausal = 512;

// Whether the call takes this path: dynamic mask, at least the query count above, and
// min(window, capacity) positions fit the prefix selection's shared memory.
bool kvcache_takes_prefill_path(const detail::KvCacheProblem& prob);

size_t prefill_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);

// After the append: selection, compaction, the training forward and (with a select_state)
// the state's update, all on `stream` with the caller's workspace.
void prefill_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob, const CacheView& cache,
                     cudaStream_t stream);

}  // namespace fdma::cuda
