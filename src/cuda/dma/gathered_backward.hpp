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

// The warp-specialized backward's temporaries (dma_cuda.cu, fused_backward), in this order:
// the fp32 dq sums [B, H, Sq_pad, D] (dq_acc; zeroed by the kernel, bwd_ws_dq_zero.cuh) and the
// plan's counters (zeroed before each call);
// the fp32 dk/dv rows [B * Hk * Sk][2D] and dscores rows [B * Hk * Sk], whose kept keys' rows
// are zeroed (no item adds to the others); then the plan's key groups, their
// halves and the items (BwdWsPlan). Their bytes, and k pointed at them with the plan's
// query ranges sized for a call keeping `window` keys a query.
size_t fused_temporaries_bytes(int64_t B, int64_t H, int64_t Hk, int64_t Sq, int64_t Sk, int64_t D);
void set_fused_temporaries(AttentionBwdParams& k, char* base, int64_t window);

// k: forward params with the lists, gradients, delta/lse2 rows and splits (or the fused
// temporaries) set; dk and dv its [B, Sk, Hk, D] gradients. The kernels write the kept keys'
// rows and k.f.lists.dscores entries; the others are zeroed here, in the launch that orders the
// kept keys by end (bwd_setup.hpp). With the temporaries, where the warp-specialized kernel
// runs on this device, they are zeroed in it too and the finish kernel
// (bwd_ws_finish.hpp) writes dq, dk, dv and dscores from them; elsewhere the dq and dk/dv
// kernels run without them.
void run_gathered_backward(const char* op, const AttentionBwdParams& k, const DmaListShape& s, const fdma_tensor& dk,
                           const fdma_tensor& dv, DType dtype, cudaStream_t stream, bool overlap);

}  // namespace fdma::cuda
