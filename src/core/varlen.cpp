#include "core/varlen.hpp"

namespace fdma::detail {

namespace {

bool present(const fdma_tensor& t) { return Tensor(t).present(); }

// A size-1 dim inserted before `dim` (stride 0: it is never stepped).
fdma_tensor unsqueeze(const fdma_tensor& t, int dim) {
  if (!present(t)) return t;
  fdma_tensor r = t;
  r.ndim = t.ndim + 1;
  for (int d = t.ndim; d > dim; --d) r.shape[d] = t.shape[d - 1], r.stride[d] = t.stride[d - 1];
  r.shape[dim] = 1;
  r.stride[dim] = 0;
  return r;
}

fdma_tensor per_key_bias_view(const fdma_tensor& t) { return unsqueeze(unsqueeze(t, 0), 2); }

}  // namespace

fdma_tensor narrow(const fdma_tensor& t, int dim, int64_t start, int64_t len) {
  if (!present(t)) return t;
  fdma_tensor r = t;
  r.shape[dim] = len;
  if (len > 0 && t.data)
    r.data = static_cast<char*>(t.data) + start * t.stride[dim] * int64_t(dtype_size(static_cast<DType>(t.dtype)));
  return r;
}

fdma_attention_params packed_view(const fdma_attention_params& p) {
  fdma_attention_params v = p;
  for (fdma_tensor* t : {&v.q, &v.k, &v.v, &v.out, &v.dout, &v.dq, &v.dk, &v.dv, &v.lse}) *t = unsqueeze(*t, 0);
  for (fdma_tensor* t : {&v.mask, &v.bias, &v.dbias}) *t = per_key_bias_view(*t);
  return v;
}

fdma_dma_params packed_view(const fdma_dma_params& p) {
  fdma_dma_params v = p;
  for (fdma_tensor* t : {&v.q, &v.k, &v.v, &v.out, &v.dout, &v.dq, &v.dk, &v.dv, &v.lse, &v.key_scores,
                         &v.dkey_scores, &v.keep_begin, &v.keep_end, &v.key_padding})
    *t = unsqueeze(*t, 0);
  return v;
}

fdma_attention_params sequence_view(const fdma_attention_params& packed, int64_t q0, int64_t nq, int64_t k0,
                                    int64_t nk) {
  fdma_attention_params v = packed;
  for (fdma_tensor* t : {&v.q, &v.out, &v.dout, &v.dq}) *t = narrow(*t, 1, q0, nq);
  for (fdma_tensor* t : {&v.k, &v.v, &v.dk, &v.dv}) *t = narrow(*t, 1, k0, nk);
  v.lse = narrow(v.lse, 2, q0, nq);
  for (fdma_tensor* t : {&v.mask, &v.bias, &v.dbias}) *t = narrow(*t, 3, k0, nk);
  v.cu_seqlens_q = v.cu_seqlens_k = fdma_tensor{};
  return v;
}

fdma_dma_params sequence_view(const fdma_dma_params& packed, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  fdma_dma_params v = packed;
  for (fdma_tensor* t : {&v.q, &v.out, &v.dout, &v.dq}) *t = narrow(*t, 1, q0, nq);
  for (fdma_tensor* t : {&v.k, &v.v, &v.dk, &v.dv}) *t = narrow(*t, 1, k0, nk);
  v.lse = narrow(v.lse, 2, q0, nq);
  for (fdma_tensor* t : {&v.key_scores, &v.dkey_scores, &v.keep_begin, &v.keep_end}) *t = narrow(*t, 2, k0, nk);
  v.key_padding = narrow(v.key_padding, 1, k0, nk);
  v.cu_seqlens_q = v.cu_seqlens_k = fdma_tensor{};
  return v;
}

namespace {
void narrow_keys(Broadcast& b, int64_t nk) {
  if (!b.present) return;
  b.size[3] = nk;
  if (nk == 1) b.stride[3] = 0;
}
}  // namespace

AttentionProblem sequence_problem(const AttentionProblem& packed, int64_t nq, int64_t nk) {
  AttentionProblem p = packed;
  p.dims.Sq = nq, p.dims.Sk = nk;
  narrow_keys(p.mask, nk);
  narrow_keys(p.bias, nk);
  p.varlen = Varlen{};
  return p;
}

DmaProblem sequence_problem(const DmaProblem& packed, int64_t nq, int64_t nk) {
  DmaProblem p = packed;
  p.dims.Sq = nq, p.dims.Sk = nk;
  p.varlen = Varlen{};
  return p;
}

SeqSpan host_span(const fdma_tensor& cu, int64_t s) {
  const auto* c = static_cast<const int32_t*>(cu.data);
  const int64_t a = c[s * cu.stride[0]], b = c[(s + 1) * cu.stride[0]];
  return {a, b - a};
}

}  // namespace fdma::detail
