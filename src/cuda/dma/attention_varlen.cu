// attention over a packed variable-length batch (fdma.h, "varlen") on the GPU. Each sequence's
// dense attention is a dynamic-mask problem that keeps every key a query may see: key j of
// sequence s is visible to the queries of s from its causal position on (all of them when
// not causal), unless the per-key mask drops it. So the whole batch runs as one call of the
// gathered kernels, one launch per stage whatever the number of sequences: per-key intervals
// carry the sequence boundaries, causality and the mask; the key records carry the per-key
// bias; each query tile walks one slice of the kept keys (tile ranges, dma_lists.hpp), not a
// list of its own. dbias is the records' gradient (the kernels' dkey_scores), summed over the
// KV heads where one bias row serves them all.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"
#include "cuda/attention/kernel_params.hpp"
#include "cuda/attention/kernel_table.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/dma/dkdv_split.hpp"
#include "cuda/dma/dma_lists.hpp"
#include "cuda/dma/gathered_backward.hpp"
#include "cuda/primitives/device_guard.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/packed_batch.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/ptx.cuh"
#include "fdma/fdma.h"

namespace fdma::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

[[noreturn]] void unsupported(const char* op, const std::string& msg) {
  detail::fail(Status::unsupported, std::string(op) + " (CUDA, packed batch): " + msg);
}

// The key records hold one bias and one interval per (key, KV head): a per-query-head mask or
// bias fits them only when each KV head serves one query head.
bool per_query_head(const detail::Broadcast& b, const detail::Dims& d) {
  return b.present && b.head_mode == detail::Broadcast::per_head && d.G() > 1;
}

void check_inputs(const char* op, const fdma_attention_params& p, const detail::AttentionProblem& prob, Pass pass) {
  const detail::Dims& d = prob.dims;
  require_kernel_inputs(op, prob.dtype, d.D);
  if (d.H > 65535) unsupported(op, "H must be <= 65535");
  if (d.Hk * d.Sk >= (int64_t(1) << 31)) unsupported(op, "Hk * total_k must be below 2^31 on the GPU");
  if (per_query_head(prob.mask, d) || per_query_head(prob.bias, d))
    unsupported(op, "a per-query-head mask or bias ([H, total_k]) with grouped KV heads (H > Hk) runs on the CPU only; "
                    "pass it per KV head ([Hk, total_k]) or shared ([1, total_k])");
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}})
    require_rows_aligned(op, *t, name);
  if (pass == Pass::backward)
    for (auto [t, name] : {std::pair{&p.dout, "dout"}, {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}})
      require_rows_aligned(op, *t, name);
  if (p.lse.data && p.lse.dtype != FDMA_FLOAT32) unsupported(op, "lse must be float32");
}

// One bias row for every KV head while there are several: the kernels' per-head gradients go to
// a float32 buffer first and are summed into dbias.
bool dbias_summed_over_heads(const detail::AttentionProblem& prob) {
  return prob.has_dbias && prob.bias.head_mode == detail::Broadcast::shared && prob.dims.Hk > 1;
}

// Workspace: the intervals, the key lists, (backward) the delta/lse2 rows, the summed dbias's
// per-head buffer and the dk/dv split partials, each 256-byte aligned.
struct Layout {
  size_t intervals = 0, lists = 0, rows = 0, dscores = 0, partial = 0;
  int splits = 1;
  DmaListShape shape{};
  size_t total() const { return 2 * intervals + lists + 2 * rows + dscores + partial; }
};

Layout layout(const fdma_attention_params& p, const detail::AttentionProblem& prob, Pass pass) {
  const detail::Dims& d = prob.dims;
  Layout l;
  l.intervals = align_up(size_t(d.Hk * d.Sk) * 4);
  const int block_m = pass == Pass::forward ? kFwdListBlockM : kBwdBlockM;
  // The window only sizes the backward's split rule here: a query keeps at most max_seqlen_k keys.
  const int64_t window = prob.varlen.max_k;
  l.shape = DmaListShape{1, int(d.Hk), int(d.Sk), int(d.Sq), window, false, block_m, pass == Pass::backward};
  l.shape.tile_ranges = true;
  l.shape.causal = prob.causal;
  l.shape.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  l.shape.cu_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
  l.shape.num_seqs = int(prob.varlen.num_seqs);
  l.shape.max_k = int(prob.varlen.max_k);
  l.shape.fold_bias = lists_fold_bias(pass == Pass::forward, prob.dtype == DType::bf16, prob.softcap, prob.scale,
                                      head_dim_bucket(int(d.D)));
  l.lists = align_up(dma_lists_workspace(l.shape));
  if (pass == Pass::backward) {
    const int64_t sq_pad = (d.Sq + kBwdBlockM - 1) / kBwdBlockM * kBwdBlockM;
    l.rows = align_up(size_t(d.H * sq_pad) * 4);
    if (dbias_summed_over_heads(prob)) l.dscores = align_up(size_t(d.Hk * d.Sk) * 4);
    l.splits = dkdv_splits(1, d.Hk, d.Sk, d.D, window);
    l.partial = align_up(dkdv_partial_bytes(l.splits, 1, d.Hk, d.Sk, d.D));
  }
  return l;
}

struct IntervalArgs {
  const int32_t *cu_q, *cu_k;
  int num_seqs, Hk, total_k;
  bool causal;
  const uint8_t* mask;  // optional per-key mask, nonzero keeps
  int64_t mask_head_stride, mask_key_stride;
  int32_t *begin, *end;  // [Hk, total_k]: query indices within the key's sequence
};

// Key j of sequence s (queries [q0, q0 + nq), keys [k0, k0 + nk)) is seen by the queries of s
// from j - k0 - (nk - nq) on when causal (bottom-right), by all of them otherwise; a masked key
// by none. The key records clamp these to the sequence's queries (dma_lists.cu).
__global__ void varlen_intervals_kernel(IntervalArgs a) {
  ptx::griddep_launch_dependents();
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= int64_t(a.Hk) * a.total_k) return;
  const int j = int(e % a.total_k), hk = int(e / a.total_k);
  const int seq = sequence_of(a.cu_k, a.num_seqs, j);
  const int64_t nq = int64_t(a.cu_q[seq + 1]) - a.cu_q[seq], k0 = a.cu_k[seq], nk = int64_t(a.cu_k[seq + 1]) - k0;
  int64_t begin = a.causal ? j - k0 - (nk - nq) : 0, end = nq;
  if (a.mask && !a.mask[hk * a.mask_head_stride + j * a.mask_key_stride]) begin = end = 0;
  const int64_t top = int64_t(INT32_MAX);
  begin = begin < 0 ? 0 : begin > top ? top : begin;
  end = end < 0 ? 0 : end > top ? top : end;
  a.begin[e] = int32_t(begin);
  a.end[e] = int32_t(end);
}

// dbias[j] = the sum over KV heads of the per-head gradients (float32), in head order.
template <class T>
__global__ void dbias_head_sum_kernel(const float* per_head, int Hk, int total_k, void* dbias, int64_t dbias_stride,
                                      bool dbias_f32) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= total_k) return;
  float sum = 0.f;
  for (int hk = 0; hk < Hk; ++hk) sum += per_head[int64_t(hk) * total_k + j];
  if (dbias_f32)
    static_cast<float*>(dbias)[j * dbias_stride] = sum;
  else
    static_cast<T*>(dbias)[j * dbias_stride] = T(sum);
}

// The intervals, then the key records, kept list and tile ranges (dma_lists.hpp).
KeyLists build_lists(const char* op, const fdma_attention_params& p, const detail::AttentionProblem& prob,
                     const Layout& l, cudaStream_t stream, bool overlap) {
  const detail::Dims& d = prob.dims;
  char* base = static_cast<char*>(p.workspace);
  IntervalArgs a{};
  a.cu_q = l.shape.cu_q, a.cu_k = l.shape.cu_k;
  a.num_seqs = l.shape.num_seqs, a.Hk = int(d.Hk), a.total_k = int(d.Sk);
  a.causal = prob.causal;
  if (prob.mask.present) {  // the packed view [1, Hb, 1, total_k]
    a.mask = static_cast<const uint8_t*>(p.mask.data);
    a.mask_head_stride = prob.mask.stride[1], a.mask_key_stride = prob.mask.stride[3];
  }
  a.begin = reinterpret_cast<int32_t*>(base);
  a.end = reinterpret_cast<int32_t*>(base + l.intervals);
  check_cuda(launch_kernel(false, varlen_intervals_kernel, blocks_for(d.Hk * d.Sk, 256), 256, 0, stream, a),
             std::string(op) + " (CUDA): intervals");
  DmaListInputs in{};
  in.begin = a.begin, in.end = a.end;
  in.begin_stride[0] = in.end_stride[0] = d.Hk * d.Sk;
  in.begin_stride[1] = in.end_stride[1] = d.Sk;
  in.begin_stride[2] = in.end_stride[2] = 1;
  if (prob.bias.present) {
    in.scores = p.bias.data;
    in.score_dtype = p.bias.dtype;
    in.score_stride[0] = 0, in.score_stride[1] = prob.bias.stride[1], in.score_stride[2] = prob.bias.stride[3];
    in.add_scores = true;
  }
  in.scale = float(prob.scale);
  KeyLists lists{};
  const DmaListScratch scratch = carve_dma_lists(base + 2 * l.intervals, l.shape);
  check_cuda(build_dma_lists(l.shape, in, scratch, lists, stream, overlap), std::string(op) + " (CUDA): key lists");
  return lists;
}

AttentionFwdParams kernel_params(const fdma_attention_params& p, const detail::AttentionProblem& prob,
                                 const KeyLists& lists, bool overlap) {
  AttentionFwdParams k{};
  // causal = false: the intervals carry causality
  set_inputs_outputs(k, p.q, p.k, p.v, p.out, p.lse, prob.dims, prob.scale, prob.softcap, false);
  k.lists = lists;
  k.narrow_last_tile = narrow_last_tile();
  k.overlap_previous = overlap;
  return k;
}

}  // namespace

size_t attention_varlen_workspace(const fdma_attention_params& p, const detail::AttentionProblem& prob, Pass pass) {
  check_inputs(pass == Pass::forward ? "attention forward" : "attention backward", p, prob, pass);
  return layout(p, prob, pass).total();
}

void attention_varlen_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  const char* op = "attention forward";
  check_inputs(op, p, prob, Pass::forward);
  require_device_workspace(std::string(op) + " (CUDA)", p.workspace);
  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const Layout l = layout(p, prob, Pass::forward);
  const bool overlap = overlap_launches();
  const KeyLists lists = build_lists(op, p, prob, l, stream, overlap);
  run_forward_kernel(kernel_params(p, prob, lists, overlap), prob.dtype, p.stream);
}

void attention_varlen_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  const char* op = "attention backward";
  check_inputs(op, p, prob, Pass::backward);
  require_device_workspace(std::string(op) + " (CUDA)", p.workspace);
  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const detail::Dims& d = prob.dims;
  const Layout l = layout(p, prob, Pass::backward);
  const bool overlap = overlap_launches();
  KeyLists lists = build_lists(op, p, prob, l, stream, overlap);
  char* base = static_cast<char*>(p.workspace);
  char* rows = base + 2 * l.intervals + l.lists;
  float* summed = l.dscores ? reinterpret_cast<float*>(rows + 2 * l.rows) : nullptr;
  if (prob.has_dbias) {  // the records' bias gradient, per KV head (the packed view [1, Hb, 1, total_k])
    lists.dscores = summed ? static_cast<void*>(summed) : p.dbias.data;
    lists.dscores_f32 = summed != nullptr || p.dbias.dtype == FDMA_FLOAT32;
    lists.dscores_stride[0] = 0;
    lists.dscores_stride[1] = summed ? d.Sk : prob.bias.head_mode == detail::Broadcast::shared ? 0 : p.dbias.stride[1];
    lists.dscores_stride[2] = summed ? 1 : p.dbias.stride[3];
  }
  AttentionBwdParams k{};
  k.f = kernel_params(p, prob, lists, overlap);
  set_gradients(k, p.dout, p.dq, p.dk, p.dv);
  set_gathered_rows(k, rows, l.rows);
  set_split_partials(k, l.splits, base + l.total() - l.partial);
  // Keys no query sees (masked, or in a sequence without queries) get zero gradients there.
  run_gathered_backward(op, k, l.shape, p.dk, p.dv, prob.dtype, stream, overlap);
  if (summed) {
    const unsigned blocks = blocks_for(d.Sk, 256);
    const bool f32 = p.dbias.dtype == FDMA_FLOAT32;
    if (prob.dtype == DType::bf16)
      dbias_head_sum_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(summed, int(d.Hk), int(d.Sk), p.dbias.data,
                                                                       p.dbias.stride[3], f32);
    else
      dbias_head_sum_kernel<__half><<<blocks, 256, 0, stream>>>(summed, int(d.Hk), int(d.Sk), p.dbias.data,
                                                                p.dbias.stride[3], f32);
    check_cuda(cudaGetLastError(), std::string(op) + " (CUDA): dbias sum over heads");
  }
}

}  // namespace fdma::cuda
