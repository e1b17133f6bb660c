// Packed variable-length batches on the CPU backend: each sequence runs as its own batched
// call on a window of the packed view (core/varlen.hpp), one after another, each using every
// thread. The workspace of the longest sequence serves them all.
#include "core/fill.hpp"
#include "core/varlen.hpp"
#include "cpu/cpu_backend.hpp"

namespace fdma::cpu {

using detail::AttentionProblem;
using detail::DmaProblem;

namespace {

// Calls f(view, problem) for every sequence with both queries and keys; `empty` handles the
// others (their outputs are what an empty problem returns).
template <class P, class Prob, class Run, class Empty>
void for_each_sequence(const P& p, const Prob& prob, Run&& run, Empty&& empty) {
  const P packed = detail::packed_view(p);
  for (int64_t s = 0; s < prob.varlen.num_seqs; ++s) {
    const auto q = detail::host_span(p.cu_seqlens_q, s), k = detail::host_span(p.cu_seqlens_k, s);
    const P view = detail::sequence_view(packed, q.start, q.len, k.start, k.len);
    if (q.len == 0 || k.len == 0)
      empty(view);
    else
      run(view, detail::sequence_problem(prob, q.len, k.len));
  }
}

void zero(const fdma_tensor& t) { detail::fill(t, false, Backend::cpu, nullptr); }

}  // namespace

size_t attention_varlen_workspace(const AttentionProblem& prob, Pass pass) {
  return attention_workspace(detail::sequence_problem(prob, prob.varlen.max_q, prob.varlen.max_k), pass);
}

void attention_varlen_forward(const fdma_attention_params& p, const AttentionProblem& prob) {
  for_each_sequence(
      p, prob, [](const fdma_attention_params& v, const AttentionProblem& sp) { attention_forward(v, sp); },
      [](const fdma_attention_params& v) {
        zero(v.out);
        detail::fill(v.lse, true, Backend::cpu, nullptr);
      });
}

void attention_varlen_backward(const fdma_attention_params& p, const AttentionProblem& prob) {
  for_each_sequence(
      p, prob, [](const fdma_attention_params& v, const AttentionProblem& sp) { attention_backward(v, sp); },
      [](const fdma_attention_params& v) {
        for (const fdma_tensor* t : {&v.dq, &v.dk, &v.dv, &v.dbias}) zero(*t);
      });
}

size_t dma_varlen_workspace(const DmaProblem& prob, Pass pass) {
  return dma_workspace(detail::sequence_problem(prob, prob.varlen.max_q, prob.varlen.max_k), pass);
}

void dma_varlen_forward(const fdma_dma_params& p, const DmaProblem& prob) {
  for_each_sequence(
      p, prob, [](const fdma_dma_params& v, const DmaProblem& sp) { dma_forward(v, sp); },
      [](const fdma_dma_params& v) {
        zero(v.out);
        detail::fill(v.lse, true, Backend::cpu, nullptr);
        zero(v.keep_begin);  // keys no query keeps: [0, 0)
        zero(v.keep_end);
      });
}

void dma_varlen_backward(const fdma_dma_params& p, const DmaProblem& prob) {
  for_each_sequence(
      p, prob, [](const fdma_dma_params& v, const DmaProblem& sp) { dma_backward(v, sp); },
      [](const fdma_dma_params& v) {
        for (const fdma_tensor* t : {&v.dq, &v.dk, &v.dv, &v.dkey_scores}) zero(*t);
      });
}

}  // namespace fdma::cpu
