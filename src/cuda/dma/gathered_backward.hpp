// The backward of the gathered (dynamic-mask mode) kernels, shared by dynamic_mask_attention
// and dense attention over packed batches: zero the gradients of keys no query keeps (the
// dk/dv kernel visits kept keys only), run the kernels, add up split dk/dv walks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.hpp"
#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/dma/dma_lists.hpp"

namespace fdma::cuda {

// Points k's delta and lse2 at `rows` (two arrays of row_bytes, B x H x Sq padded to the
// backward's block rows, as float32), one (batch, head) a prepare CTA.
void set_gathered_rows(AttentionBwdParams& k, char* rows, size_t row_bytes);
// Points k's split partials into `partial` (dkdv_partial_bytes(splits, ...) bytes) when splits > 1.
void set_split_partials(AttentionBwdParams& k, int splits, void* partial);

// k: forward params with the lists, gradients, delta/lse2 rows and splits set; dk and dv its
// [B, Sk, Hk, D] gradients. The kernels write the kept keys' rows and k.f.lists.dscores
// entries; the others are zeroed here.
void run_gathered_backward(const char* op, const AttentionBwdParams& k, const DmaListShape& s, const fdma_tensor& dk,
                           const fdma_tensor& dv, DType dtype, cudaStream_t stream, bool overlap);

}  // namespace fdma::cuda
