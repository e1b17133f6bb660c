// dynamic_mask_attention and select on the GPU: the top-w selection (select_topw.cu) gives
// each key the interval of queries that keep it; dma_lists.cu turns those into per-tile lists
// of kept keys; the attention kernels run in dynamic-mask mode over them (KeyLists), so only
// kept keys are loaded and computed. Causal and non-causal, forward and backward; the
// non-causal forward, where every query keeps the same keys, gathers them once and runs the
// dense kernel instead.
#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/primitives/device_guard.hpp"
#include "cuda/dma/dkdv_split.hpp"
#include "cuda/dma/dma_lists.hpp"
#include "cuda/dma/gathered_backward.hpp"
#include "cuda/attention/kernel_params.hpp"
#include "cuda/attention/kernel_table.hpp"
#include "cuda/primitives/arch_dispatch.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/select/select_topw.cuh"

namespace fdma::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void unsupported(const char* op, const std::string& msg) {
  detail::fail(Status::unsupported, std::string(op) + " (CUDA): " + msg);
}

void check_cuda(cudaError_t err, const char* op, const char* what) {
  cuda::check_cuda(err, std::string(op) + " (CUDA): " + what);
}

// What the GPU selection needs beyond validation: 16/32-bit scores, int32 positions in the
// sort (which also keeps a rank key's row and index bits within 32 together).
void check_selection_inputs(const char* op, const fdma_tensor& scores) {
  if (scores.dtype != FDMA_FLOAT32 && scores.dtype != FDMA_FLOAT16 && scores.dtype != FDMA_BFLOAT16)
    unsupported(op, std::string("key_scores has dtype ") + dtype_name(static_cast<DType>(scores.dtype)) +
                        "; the GPU takes float32, float16 or bfloat16");
  if (scores.shape[0] * scores.shape[1] * scores.shape[2] >= (int64_t(1) << 31))
    unsupported(op, "B * Hk * Sk must be below 2^31 on the GPU");
}

TopwInputs topw_inputs(const fdma_tensor& scores, const fdma_tensor& padding) {
  TopwInputs in{};
  in.scores = scores.data;
  in.score_dtype = scores.dtype;
  for (int d = 0; d < 3; ++d) in.score_stride[d] = scores.stride[d];
  if (padding.data) {
    in.padding = static_cast<const uint8_t*>(padding.data);
    in.padding_stride[0] = padding.shape[0] > 1 ? padding.stride[0] : 0;
    in.padding_stride[1] = padding.stride[1];
  }
  in.B = int(scores.shape[0]);
  in.Hk = int(scores.shape[1]);
  in.Sk = int(scores.shape[2]);
  set_rank_bits(in);
  return in;
}

// dynamic_mask_attention's selection. A packed batch (its packed view, core/varlen.hpp)
// selects over rows of max_seqlen_k keys, one per (sequence, KV head), reading each
// sequence's keys where they lie (TopwInputs::cu_k).
TopwInputs topw_inputs(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  if (!prob.varlen.on) return in;
  in.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  in.cu_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
  in.total_q = int(prob.dims.Sq);
  in.total_k = int(prob.dims.Sk);
  in.B = int(prob.varlen.num_seqs);
  in.Sk = int(prob.varlen.max_k);
  in.score_stride[0] = 0;
  in.padding_stride[0] = 0;
  set_rank_bits(in);
  return in;
}

void check_rows_aligned(const char* op, const fdma_tensor& t, const char* name) { require_rows_aligned(op, t, name); }

// The GPU-only requirements of dynamic_mask_attention, forward and backward.
void check_dma_inputs(const char* op, const fdma_dma_params& p, const detail::DmaProblem& prob, Pass pass) {
  const detail::Dims& d = prob.dims;
  require_kernel_inputs(op, prob.dtype, d.D);
  if (d.B > 65535 || d.H > 65535) unsupported(op, "B and H must be <= 65535");
  check_selection_inputs(op, p.key_scores);
  if (prob.varlen.on && prob.varlen.num_seqs * d.Hk * prob.varlen.max_k >= (int64_t(1) << 31))
    unsupported(op, "num_seqs * Hk * max_seqlen_k must be below 2^31 on the GPU");
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}}) check_rows_aligned(op, *t, name);
  if (pass == Pass::backward) {
    for (auto [t, name] : {std::pair{&p.dout, "dout"}, {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}})
      check_rows_aligned(op, *t, name);
  }
  if (p.lse.data && p.lse.dtype != FDMA_FLOAT32) unsupported(op, "lse must be float32");
}

// Workspace: the selection's scratch, the intervals, the key lists and (backward) the
// delta/lse2 rows, each 256-byte aligned. Caller-given intervals (keep_begin/keep_end) need
// no interval space, and a backward given them selects nothing: no selection scratch.
struct DmaLayout {
  bool selects;  // false: a backward given the forward's intervals
  size_t select, intervals, lists, rows;
  size_t kv_gathered, bias_gathered;  // non-causal forward: the kept keys' K, V and biases
  int splits;                         // backward: shares of the dk/dv walks (dkdv_split.hpp)
  bool fused;                         // backward: the warp-specialized kernel (fused_backward)
  size_t partial;                     // the split partials or the fused temporaries, last
  DmaListShape shape;
  size_t total() const { return select + 2 * intervals + lists + 2 * rows + 2 * kv_gathered + bias_gathered + partial; }
};

// Whether a backward runs on the warp-specialized kernel with fused dq (attention_bwd_ws.cuh,
// attention_bwd_ws_d256.cuh): not asked to be reproducible, D 64, 128 or 256, q on a Hopper
// running the sm_90a code, and its fp32
// temporaries (gathered_backward.hpp: 2x dq's bytes, 4x dk's and dv's, and the work list)
// within kMaxFusedBytes; otherwise the dq and dk/dv kernels run, with no temporaries.
constexpr size_t kMaxFusedBytes = size_t(4) << 30;
bool fused_backward(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const detail::Dims& d = prob.dims;
  if (prob.deterministic || (d.D != 64 && d.D != 128 && d.D != 256) || d.B * d.Hk > 65535 || !fused_dq_allowed() ||
      !bwd_ws_allowed() || wgmma_disabled())
    return false;
  if (fused_temporaries_bytes(d.B, d.H, d.Hk, d.Sq, d.Sk, d.D) > kMaxFusedBytes) return false;
  const detail::PointerLocation where = detail::locate_pointer(p.q.data);
  return where.device && sm90_device(where.ordinal);
}

// Slots per (batch, KV head) in the non-causal forward's gathered buffers.
int64_t gathered_slots(const detail::DmaProblem& prob) {
  return prob.window < prob.dims.Sk ? prob.window : prob.dims.Sk;
}

DmaLayout dma_layout(const fdma_dma_params& p, const detail::DmaProblem& prob, const TopwInputs& in, Pass pass) {
  const detail::Dims& d = prob.dims;
  DmaLayout l;
  l.selects = !(prob.has_intervals && pass == Pass::backward);
  l.select = l.selects ? align_up(topw_workspace(in, nullptr)) + (prob.causal ? align_up(wavelet_workspace(in, nullptr)) : 0)
                     : 0;
  l.intervals = prob.has_intervals ? 0 : align_up(size_t(d.B * d.Hk * d.Sk) * 4);
  const int block_m = pass == Pass::forward ? kFwdListBlockM : kBwdBlockM;
  // Tile lists for causal calls and for every packed batch (its sequences keep different keys).
  l.shape = DmaListShape{int(d.B), int(d.Hk), int(d.Sk), int(d.Sq), prob.window, prob.causal || prob.varlen.on, block_m,
                         pass == Pass::backward};
  // Tile lists: the gathered forward's (the non-causal one runs the dense kernel on gathered rows).
  l.shape.fold_bias = l.shape.tile_lists && lists_fold_bias(pass == Pass::forward, prob.dtype == DType::bf16,
                                                            prob.softcap, prob.scale, head_dim_bucket(int(d.D)));
  if (prob.varlen.on) {
    l.shape.cu_q = in.cu_q, l.shape.cu_k = in.cu_k;
    l.shape.num_seqs = int(prob.varlen.num_seqs), l.shape.max_k = int(prob.varlen.max_k);
  }
  l.fused = pass == Pass::backward && fused_backward(p, prob);
  // The warp-specialized backward walks its plan's key groups, not tile lists: the kept list
  // alone. (Were it to turn the call down after all, the dq and dk/dv kernels would read the
  // whole kept list for every tile, hiding the rest by the intervals: slower, not wrong.)
  if (l.fused && !prob.varlen.on) l.shape.tile_lists = false;
  l.shape.checkpoint_tiles = tile_checkpoints(l.shape);
  l.lists = align_up(dma_lists_workspace(l.shape));
  const int64_t sq_pad = (d.Sq + kBwdBlockM - 1) / kBwdBlockM * kBwdBlockM;
  l.rows = pass == Pass::backward ? align_up(size_t(d.B * d.H * sq_pad) * 4) : 0;
  const bool gathered = pass == Pass::forward && !prob.causal && !prob.varlen.on;
  const size_t slots = gathered ? size_t(d.B * d.Hk * gathered_slots(prob)) : 0;
  l.kv_gathered = align_up(slots * size_t(d.D) * dtype_size(prob.dtype));
  l.bias_gathered = align_up(slots * 4);
  l.splits = pass == Pass::backward && !l.fused ? dkdv_splits(d.B, d.Hk, d.Sk, d.D, prob.window) : 1;
  l.partial = align_up(l.fused ? fused_temporaries_bytes(d.B, d.H, d.Hk, d.Sq, d.Sk, d.D)
                               : dkdv_partial_bytes(l.splits, d.B, d.Hk, d.Sk, d.D));
  return l;
}

// Selection (unless a backward is given the forward's) and key lists into the workspace;
// returns the lists for the kernels.
KeyLists select_and_list(const char* op, const fdma_dma_params& p, const detail::DmaProblem& prob, const TopwInputs& in,
                         const DmaLayout& l, cudaStream_t stream, bool overlap) {
  char* base = static_cast<char*>(p.workspace);
  const int64_t Sk = prob.dims.Sk, Hk = prob.dims.Hk;
  int32_t *begin, *end;
  int64_t bs[3] = {Hk * Sk, Sk, 1}, es[3] = {Hk * Sk, Sk, 1};
  if (prob.has_intervals) {
    begin = static_cast<int32_t*>(p.keep_begin.data);
    end = static_cast<int32_t*>(p.keep_end.data);
    for (int d = 0; d < 3; ++d) bs[d] = p.keep_begin.stride[d], es[d] = p.keep_end.stride[d];
  } else {
    begin = reinterpret_cast<int32_t*>(base + l.select);
    end = reinterpret_cast<int32_t*>(base + l.select + l.intervals);
  }
  const DmaListScratch ls = carve_dma_lists(base + l.select + 2 * l.intervals, l.shape);
  bool counted = false;  // the walk counted each list block's kept keys (KeptCounts)
  if (l.selects) {
    const TopwScratch s = carve_topw(base, in);
    WaveletScratch wv{};
    if (prob.causal) wv = carve_wavelet(base + align_up(topw_workspace(in, nullptr)), in);
    if (prob.varlen.on) {  // keys outside every sequence (offsets that are no prefix sums) stay (0, 0)
      fdma_tensor tb = p.key_scores, te = p.key_scores;
      tb.data = begin, te.data = end;
      tb.dtype = te.dtype = FDMA_INT32;
      for (int d = 0; d < 3; ++d) tb.stride[d] = bs[d], te.stride[d] = es[d];
      fill(tb, 0, stream);
      fill(te, 0, stream);
    }
    const int Sq = int(prob.varlen.on ? prob.varlen.max_q : prob.dims.Sq);  // a sequence's most queries
    const KeptCounts counts{ls.block_counts, list_blocks_per_row(int(Sk)), kListBlockKeysLog2, ls.fold_off};
    check_cuda(select_intervals(in, s, prob.causal ? &wv : nullptr, prob.window, Sq, begin, bs, end, es, stream, overlap,
                                &counts, &counted),
               op, "selection");
  }
  DmaListInputs li{};
  li.begin = begin, li.end = end;
  for (int d = 0; d < 3; ++d) li.begin_stride[d] = bs[d], li.end_stride[d] = es[d];
  li.scores = p.key_scores.data;
  li.score_dtype = p.key_scores.dtype;
  for (int d = 0; d < 3; ++d) li.score_stride[d] = p.key_scores.stride[d];
  li.add_scores = prob.add_scores;
  li.scale = float(prob.scale);
  li.counted = counted;
  KeyLists lists{};
  check_cuda(build_dma_lists(l.shape, li, ls, lists, stream, overlap), op, "key lists");
  return lists;
}

// The attention kernels' view of q, k, v, out, lse in dynamic-mask mode, with the path switches
// read per call (path_switches.hpp). On Hopper a list's last key tile runs 32 or 64 keys wide
// where it holds no more (attention_fwd.cuh; 2-6% of the forward, docs/performance.md, "key lists"):
// FDMA_FWD_LAST_TILE=full turns that off.
AttentionFwdParams kernel_params(const fdma_dma_params& p, const detail::DmaProblem& prob, const KeyLists& lists) {
  AttentionFwdParams k{};
  // causal = false: the intervals carry causality
  set_inputs_outputs(k, p.q, p.k, p.v, p.out, p.lse, prob.dims, prob.scale, prob.softcap, false);
  k.lists = lists;
  k.narrow_last_tile = narrow_last_tile();
  return k;
}

}  // namespace

// select: the sort, then intervals (causal: through the wavelet matrix after the sort scratch).
size_t select_workspace(const fdma_select_params& p, const detail::SelectProblem& prob) {
  check_selection_inputs("select", p.key_scores);
  const TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  return align_up(topw_workspace(in, nullptr)) + (prob.causal ? wavelet_workspace(in, nullptr) : 0);
}

void select(const fdma_select_params& p, const detail::SelectProblem& prob) {
  check_selection_inputs("select", p.key_scores);
  require_device_workspace("select (CUDA)", p.workspace);
  DeviceGuard guard(p.key_scores.data);
  const TopwInputs in = topw_inputs(p.key_scores, p.key_padding);
  const TopwScratch s = carve_topw(p.workspace, in);
  auto stream = static_cast<cudaStream_t>(p.stream);
  int64_t bs[3], es[3];
  for (int d = 0; d < 3; ++d) bs[d] = p.keep_begin.stride[d], es[d] = p.keep_end.stride[d];
  auto* begin = static_cast<int32_t*>(p.keep_begin.data);
  auto* end = static_cast<int32_t*>(p.keep_end.data);
  WaveletScratch wv{};
  if (prob.causal)
    wv = carve_wavelet(static_cast<char*>(p.workspace) + align_up(topw_workspace(in, nullptr)), in);
  check_cuda(select_intervals(in, s, prob.causal ? &wv : nullptr, prob.window, int(prob.Sq), begin, bs, end, es, stream),
             "select", "selection");
}

size_t dma_workspace(const fdma_dma_params& p, const detail::DmaProblem& prob, Pass pass) {
  check_dma_inputs(pass == Pass::forward ? "dynamic_mask_attention forward" : "dynamic_mask_attention backward", p, prob,
                   pass);
  if (pass == Pass::forward && dma_forward_takes_decode_path(p, prob)) return dma_decode_workspace(p, prob);
  return dma_layout(p, prob, topw_inputs(p, prob), pass).total();
}

void dma_forward(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const char* op = "dynamic_mask_attention forward";
  check_dma_inputs(op, p, prob, Pass::forward);
  require_device_workspace(std::string(op) + " (CUDA)", p.workspace);
  if (dma_forward_takes_decode_path(p, prob)) return dma_decode_forward(p, prob);
  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const TopwInputs in = topw_inputs(p, prob);
  const DmaLayout l = dma_layout(p, prob, in, Pass::forward);
  const bool overlap = overlap_launches();
  const KeyLists lists = select_and_list(op, p, prob, in, l, stream, overlap);
  if (prob.causal || prob.varlen.on) {
    AttentionFwdParams k = kernel_params(p, prob, lists);
    k.overlap_previous = overlap;
    run_forward_kernel(k, prob.dtype, p.stream);
    return;
  }
  // Non-causal: every query keeps the same keys, so gather them once and run the dense
  // kernel over W slots with the scores as a per-KV-head, per-key bias (-inf on empty slots).
  const detail::Dims& d = prob.dims;
  const int64_t W = gathered_slots(prob);
  char* gathered = static_cast<char*>(p.workspace) + l.select + 2 * l.intervals + l.lists;
  KeptGatherArgs g{};
  g.k = p.k.data, g.v = p.v.data;
  for (int i = 0; i < 3; ++i) g.k_stride[i] = p.k.stride[i], g.v_stride[i] = p.v.stride[i];
  g.D = int(d.D), g.elem_bytes = int(dtype_size(prob.dtype)), g.W = int(W);
  g.k_out = gathered, g.v_out = gathered + l.kv_gathered;
  g.bias_out = reinterpret_cast<float*>(gathered + 2 * l.kv_gathered);
  check_cuda(gather_kept_keys(l.shape, lists, g, stream), op, "gather kept keys");
  fdma_tensor kg = p.k, vg = p.v;  // [B, W, Hk, D] views of the [B, Hk, W, D] buffers
  kg.data = g.k_out, vg.data = g.v_out;
  for (fdma_tensor* t : {&kg, &vg}) {
    t->shape[1] = W;
    t->stride[0] = d.Hk * W * d.D, t->stride[1] = d.D, t->stride[2] = W * d.D, t->stride[3] = 1;
  }
  detail::Dims dense = d;
  dense.Sk = W;
  AttentionFwdParams k{};
  set_inputs_outputs(k, p.q, kg, vg, p.out, p.lse, dense, prob.scale, prob.softcap, false);
  k.bias = g.bias_out;
  k.bias_f32 = true;
  k.bias_stride[0] = d.Hk * W, k.bias_stride[1] = W, k.bias_stride[2] = 0, k.bias_stride[3] = 1;
  k.bias_head_mode = 1;          // per KV head
  k.bias_tiled = W % 4 == 0;     // 16-byte bias rows stream through shared memory
  run_forward_kernel(k, prob.dtype, p.stream);
}

void dma_backward(const fdma_dma_params& p, const detail::DmaProblem& prob) {
  const char* op = "dynamic_mask_attention backward";
  check_dma_inputs(op, p, prob, Pass::backward);
  require_device_workspace(std::string(op) + " (CUDA)", p.workspace);
  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const TopwInputs in = topw_inputs(p, prob);
  const DmaLayout l = dma_layout(p, prob, in, Pass::backward);
  const bool overlap = overlap_launches();
  KeyLists lists = select_and_list(op, p, prob, in, l, stream, overlap);
  // dkey_scores: float32 or the scores' dtype, itself float32 or q's (validation), so the
  // kernel writes float32 or T.
  if (p.dkey_scores.data && prob.add_scores) {
    lists.dscores = p.dkey_scores.data;
    lists.dscores_f32 = p.dkey_scores.dtype == FDMA_FLOAT32;
    for (int i = 0; i < 3; ++i) lists.dscores_stride[i] = p.dkey_scores.stride[i];
  }
  AttentionBwdParams k{};
  k.f = kernel_params(p, prob, lists);
  k.f.overlap_previous = overlap;
  set_gradients(k, p.dout, p.dq, p.dk, p.dv);
  char* rows = static_cast<char*>(p.workspace) + l.select + 2 * l.intervals + l.lists;
  set_gathered_rows(k, rows, l.rows);
  char* last = static_cast<char*>(p.workspace) + l.total() - l.partial;
  if (l.fused)
    set_fused_temporaries(k, last, prob.window);
  else
    set_split_partials(k, l.splits, last);
  // Scores not added to the scores have a zero gradient everywhere.
  if (p.dkey_scores.data && !prob.add_scores) fill(p.dkey_scores, 0, p.stream);
  run_gathered_backward(op, k, l.shape, p.dk, p.dv, prob.dtype, stream, overlap);
}

}  // namespace fdma::cuda
