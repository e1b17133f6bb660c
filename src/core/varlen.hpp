// Packed variable-length batches (fdma.h, "varlen"). Validation turns a varlen call into its
// packed view: the same tensors seen as one batch of the unpacked layouts (q [total_q, H, D]
// as [1, total_q, H, D], and so on), which the batched checks and the kernels understand;
// each sequence is then a window of that view.
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace fdma::detail {

// Elements [start, start + len) of dim `dim` (no copy).
fdma_tensor narrow(const fdma_tensor& t, int dim, int64_t start, int64_t len);

// q, k, v, out, dout, dq, dk, dv [total, heads, D] -> [1, total, heads, D]; lse [H, total_q] ->
// [1, H, total_q]; mask, bias, dbias [Hb, total_k] -> [1, Hb, 1, total_k]; key_scores,
// dkey_scores, keep_begin, keep_end [Hk, total_k] -> [1, Hk, total_k]; key_padding [total_k] ->
// [1, total_k]. Absent tensors stay absent; cu_seqlens stay (the CUDA backend reads them).
fdma_attention_params packed_view(const fdma_attention_params& p);
fdma_dma_params packed_view(const fdma_dma_params& p);

// Sequence s of a packed view: its queries [q0, q0 + nq) and keys [k0, k0 + nk), as a call of
// the batched layouts with B = 1 (no cu_seqlens), and its problem.
fdma_attention_params sequence_view(const fdma_attention_params& packed, int64_t q0, int64_t nq, int64_t k0, int64_t nk);
fdma_dma_params sequence_view(const fdma_dma_params& packed, int64_t q0, int64_t nq, int64_t k0, int64_t nk);
AttentionProblem sequence_problem(const AttentionProblem& packed, int64_t nq, int64_t nk);
DmaProblem sequence_problem(const DmaProblem& packed, int64_t nq, int64_t nk);

// Host cu_seqlens as (start, length) of sequence s.
struct SeqSpan {
  int64_t start, len;
};
SeqSpan host_span(const fdma_tensor& cu_seqlens, int64_t s);

}  // namespace fdma::detail
