// The finish of the warp-specialized dynamic-mask backward (attention_bwd_ws.cuh, gathered): dq
// from its fp32 sums, and dk, dv and dscores of every kept key from its fp32 rows, each written
// as soon as the backward kernel's items stop adding to it, under the kernel's last items
// instead of after them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/dma/dkdv_split.hpp"

namespace fdma::cuda {

// Launched right behind the backward kernel (overlapping it where launches overlap: its CTAs
// find room only on SMs the kernel's persistent CTAs have left), a few CTAs an SM take jobs
// range by range, lowest first, as the kernel's CTAs take items (BwdWsPlan::finish_taken): each
// 64-row dq tile of a (batch, head) of range r once range_done[r] counts every part of r's
// items, then each key group whose last range is r once group_done[g] counts all of its
// parts. k: the backward's params with the temporaries set (set_fused_temporaries); out: dk,
// dv and dscores (its partials k's, one split).
cudaError_t bwd_ws_finish(const AttentionBwdParams& k, const DkdvSplitSum& out, cudaStream_t stream);

}  // namespace fdma::cuda
