// The CPU backend: the reference implementation of every operation, and the default where
// no GPU is. Computes in float32 (float64 when q is float64), multithreaded, deterministic.
#pragma once

#include <cstddef>

#include "core/problem.hpp"

namespace fdma::cpu {

size_t attention_workspace(const detail::AttentionProblem& prob, Pass pass);
void attention_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob);
void attention_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob);

size_t select_workspace(const detail::SelectProblem& prob, DType score_dtype);
void select(const fdma_select_params& p, const detail::SelectProblem& prob);

size_t dma_workspace(const detail::DmaProblem& prob, Pass pass);
void dma_forward(const fdma_dma_params& p, const detail::DmaProblem& prob);
void dma_backward(const fdma_dma_params& p, const detail::DmaProblem& prob);

// Packed variable-length batches (fdma.h, "varlen"; problems with varlen.on): one batched
// call per sequence (varlen_cpu.cpp).
size_t attention_varlen_workspace(const detail::AttentionProblem& prob, Pass pass);
void attention_varlen_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob);
void attention_varlen_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob);
size_t dma_varlen_workspace(const detail::DmaProblem& prob, Pass pass);
void dma_varlen_forward(const fdma_dma_params& p, const detail::DmaProblem& prob);
void dma_varlen_backward(const fdma_dma_params& p, const detail::DmaProblem& prob);

// Attention against a KV cache: appends the new tokens, then runs dynamic_mask_attention
// (or attention, without a score cache) per sequence over its first L_b cached keys.
size_t kvcache_workspace(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);
void kvcache_forward(const fdma_kvcache_params& p, const detail::KvCacheProblem& prob);

}  // namespace fdma::cpu
