// Host side of the CUDA attention: GPU-only checks, params, dispatch over the generated
// kernel list (kernel_list.inc) by dtype and head-dim bucket.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"
#include "cuda/attention/attention_bwd_aux.hpp"
#include "cuda/attention/attention_bwd_params.hpp"
#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/primitives/arch_dispatch.cuh"
#include "cuda/primitives/device_guard.hpp"
#include "cuda/attention/kernel_params.hpp"
#include "cuda/attention/kernel_table.hpp"
#include "cuda/primitives/launch.cuh"
#include "cuda/attention/mask_tile_summary.hpp"
#include "cuda/primitives/path_switches.hpp"

namespace fdma::cuda {

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream);
template <class T, int kHeadDim>
cudaError_t launch_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream);
template <class T, int kHeadDim>
bool attention_bwd_ws_takes(const AttentionBwdParams& p);

namespace {

[[noreturn]] void unsupported(const std::string& msg) { detail::fail(Status::unsupported, "attention (CUDA): " + msg); }

void check_cuda(cudaError_t err, const char* what) { cuda::check_cuda(err, std::string("attention (CUDA): ") + what); }

void check_rows_aligned(const fdma_tensor& t, const char* name) { require_rows_aligned("attention", t, name); }

// Tiles of a mask/bias can stream through shared memory in 16-byte copies when keys are
// contiguous and every row start (for any b, head, i) is 16-byte aligned.
bool can_tile(const fdma_tensor& t, const detail::Broadcast& bc) {
  const int64_t esize = static_cast<int64_t>(dtype_size(static_cast<DType>(t.dtype)));
  if (bc.size[3] > 1 && bc.stride[3] != 1) return false;
  if (bc.size[3] == 1) return false;  // a broadcast key dim has nothing to stream
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (bc.stride[d] * esize % 16 != 0) return false;
  return true;
}

void fill_broadcast(const detail::Broadcast& bc, int64_t (&stride)[4], int& head_mode) {
  for (int d = 0; d < 4; ++d) stride[d] = bc.stride[d];
  head_mode = static_cast<int>(bc.head_mode);
}

// The GPU-only requirements shared by forward and backward.
void check_gpu_inputs(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  const detail::Dims& d = prob.dims;
  if (prob.dtype != DType::bf16 && prob.dtype != DType::f16)
    unsupported(std::string("q has dtype ") + dtype_name(prob.dtype) + "; the GPU takes float16 or bfloat16");
  if (d.D % 8 != 0) unsupported("head dim D = " + std::to_string(d.D) + " must be a multiple of 8 on the GPU");
  if (d.B > 65535 || d.H > 65535) unsupported("B and H must be <= 65535");
  check_rows_aligned(p.q, "q");
  check_rows_aligned(p.k, "k");
  check_rows_aligned(p.v, "v");
  check_rows_aligned(p.out, "out");
  if (p.lse.data && p.lse.dtype != FDMA_FLOAT32) unsupported("lse must be float32");
}

// Everything the forward kernel reads, minus the mask summary (whose tile shape differs
// between forward and backward).
AttentionFwdParams forward_params(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  AttentionFwdParams k{};
  set_inputs_outputs(k, p.q, p.k, p.v, p.out, p.lse, prob.dims, prob.scale, prob.softcap, prob.causal);
  if (prob.mask.present) {
    k.mask = static_cast<const uint8_t*>(p.mask.data);
    fill_broadcast(prob.mask, k.mask_stride, k.mask_head_mode);
    k.active_batches = int(prob.mask.size[0]);
    k.active_heads = int(prob.mask.size[1]);
  }
  if (prob.bias.present) {
    k.bias = p.bias.data;
    k.bias_f32 = p.bias.dtype == FDMA_FLOAT32;
    fill_broadcast(prob.bias, k.bias_stride, k.bias_head_mode);
  }
  return k;
}

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Where the backward keeps things in the caller's workspace, and who reduces dbias.
struct BwdPlan {
  MaskTileGrid grid;  // 64 x 64 mask summary
  int64_t Sq_pad = 0;
  DbiasOwner owner = DbiasOwner::none;
  bool use_acc = false;
  int slots = 0, rows_batches = 1, rows_heads = 1;
  int64_t numel = 0;
  bool fused_dq = false;  // the dk/dv kernel reduces dq into an fp32 temporary (attention_bwd_params.hpp)
  size_t delta_off = 0, lse2_off = 0, acc_off = 0, dq_acc_off = 0, bytes = 0;
};

// Whether a backward takes the fused dq: not asked to be reproducible, a head dim with the
// wgmma tiles, and the calling thread's device a Hopper running the sm_90a code (where it is
// not, the launch takes the two kernels and the temporary goes unused). The launcher also
// declines it where its shared memory would change the two kernels' plan (attention_bwd.cuh):
// always with a mask at D 128, so no temporary is asked for there but where the
// warp-specialized kernel takes the call (D exactly 128, a mask, and no bias or one with a query
// dim in q's dtype). A dbias with a query dim is the dq kernel's but where the warp-specialized
// kernel writes it (D exactly 64 or 128, a bias of q's dtype; a dbias of q's dtype that is one
// dS an element, or one summed over batches or heads, not keys, into the fp32 slot:
// attention_bwd_ws.cuh, bwd_ws_writes_dbias). At D 256 only the warp-specialized kernel has
// it: D exactly 256, no bias with a query dim, and no bias at all with a mask.
bool fused_dq_applies(const detail::AttentionProblem& prob, const BwdPlan& plan) {
  if (prob.deterministic || !fused_dq_allowed() || wgmma_disabled()) return false;
  const detail::Dims& d = prob.dims;
  const bool keys_summed = prob.bias.size[3] == 1 && d.Sk > 1;
  const bool query_bias = prob.bias.present && prob.bias.stride[2] != 0 && prob.bias_dtype == prob.dtype;
  if (plan.owner == DbiasOwner::rows &&
      ((prob.mask.present && !query_bias) || (d.D != 64 && d.D != 128) || prob.bias_dtype != prob.dtype ||
       (plan.use_acc ? keys_summed || plan.slots != 1 || d.Sk % 4 != 0 : prob.dbias_dtype != prob.dtype)))
    return false;
  const int bucket = head_dim_bucket(int(d.D));
  const bool wide = d.D == 256 && (prob.mask.present ? !prob.bias.present : !prob.bias.present || prob.bias.size[2] == 1);
  // A mask at D 128: only the warp-specialized kernel's (no bias, or one with a query dim).
  const bool masked_ws = d.D == 128 && (!prob.bias.present || query_bias);
  if (bucket != 64 && (bucket != 128 || (prob.mask.present && !masked_ws)) && !wide) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return sm90_device(device);
}

// The fused dq's fp32 sums: [B, H, Sq_pad, D's bucket] (attention_bwd_params.hpp, dq_acc_offset).
size_t dq_acc_bytes(const detail::AttentionProblem& prob, int64_t Sq_pad) {
  const detail::Dims& d = prob.dims;
  return size_t(d.B * d.H) * size_t(Sq_pad) * size_t(head_dim_bucket(int(d.D))) * sizeof(float);
}

BwdPlan plan_backward(const detail::AttentionProblem& prob) {
  const detail::Dims& d = prob.dims;
  const detail::Broadcast& bias = prob.bias;
  BwdPlan plan;
  plan.Sq_pad = (d.Sq + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
  if (prob.mask.present) plan.grid = mask_tile_grid(prob.mask, d.Sq, d.Sk, kBwdBlockM, kBwdBlockN);
  if (prob.has_dbias) {
    plan.numel = bias.size[0] * bias.size[1] * bias.size[2] * bias.size[3];
    const bool q_reduced = bias.size[2] == 1 && d.Sq > 1, k_reduced = bias.size[3] == 1 && d.Sk > 1;
    const bool b_reduced = bias.size[0] == 1 && d.B > 1;
    if (q_reduced && !k_reduced) {
      // Broadcast over queries only: the dk/dv kernel sums each key's column; one slot per
      // (batch, KV head) that shares a dbias element, times two (one per warp group).
      plan.owner = DbiasOwner::columns;
      plan.use_acc = true;
      plan.slots = 2 * int((b_reduced ? d.B : 1) * (bias.head_mode == detail::Broadcast::shared ? d.Hk : 1));
    } else {
      plan.owner = DbiasOwner::rows;
      plan.rows_batches = b_reduced ? int(d.B) : 1;
      plan.rows_heads = bias.head_mode == detail::Broadcast::shared ? int(d.H)
                        : bias.head_mode == detail::Broadcast::per_kv_head ? int(d.G()) : 1;
      plan.use_acc = k_reduced || plan.rows_batches * plan.rows_heads > 1;
      plan.slots = q_reduced ? int((d.Sq + kBwdBlockM - 1) / kBwdBlockM) : 1;  // one per dq kernel query tile
    }
  }
  const size_t rows = size_t(d.B * d.H * plan.Sq_pad) * sizeof(float);
  plan.delta_off = align256(size_t(plan.grid.bytes()));
  plan.lse2_off = plan.delta_off + align256(rows);
  plan.acc_off = plan.lse2_off + align256(rows);
  plan.dq_acc_off = plan.acc_off + align256(plan.use_acc ? size_t(plan.slots) * size_t(plan.numel) * sizeof(float) : 0);
  plan.fused_dq = fused_dq_applies(prob, plan);
  plan.bytes = plan.dq_acc_off + (plan.fused_dq ? dq_acc_bytes(prob, plan.Sq_pad) : 0);
  return plan;
}

MaskTileGrid summary_grid(const detail::AttentionProblem& prob) {
  const int hd = head_dim_bucket(int(prob.dims.D));
  return mask_tile_grid(prob.mask, prob.dims.Sq, prob.dims.Sk, fwd_block_m(hd), fwd_block_n(hd));
}

void require_device_workspace(const fdma_attention_params& p, const char* op) {
  cuda::require_device_workspace(std::string("attention ") + op + " (CUDA)", p.workspace);
}

}  // namespace

size_t attention_workspace(const detail::AttentionProblem& prob, Pass pass) {
  if (pass == Pass::backward) return plan_backward(prob).bytes;
  return prob.mask.present ? size_t(summary_grid(prob).bytes()) : 0;
}

void attention_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  const detail::Dims& d = prob.dims;
  check_gpu_inputs(p, prob);
  AttentionFwdParams k = forward_params(p, prob);
  MaskTileGrid grid;
  if (prob.mask.present) {
    require_device_workspace(p, "forward");
    grid = summary_grid(prob);
    k.tile_active = static_cast<const uint8_t*>(p.workspace);
    k.active_q_tiles = grid.q_tiles;
    k.active_k_tiles = grid.k_tiles;
    k.mask_tiled = can_tile(p.mask, prob.mask);
    k.next_active_table = next_active_table_allowed();
  }
  if (prob.bias.present) k.bias_tiled = can_tile(p.bias, prob.bias);

  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const int bucket = head_dim_bucket(int(d.D));
  if (prob.mask.present) {
    check_cuda(launch_mask_tile_summary(k.mask, prob.mask, fwd_block_m(bucket), fwd_block_n(bucket), grid,
                                        static_cast<uint8_t*>(p.workspace), stream),
               "mask tile summary");
    k.overlap_previous = overlap_launches();  // the kernel waits for the summary on the GPU
  }
  run_forward_kernel(k, prob.dtype, p.stream);
}

void attention_backward(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
  check_gpu_inputs(p, prob);
  check_rows_aligned(p.dout, "dout");
  check_rows_aligned(p.dq, "dq");
  check_rows_aligned(p.dk, "dk");
  check_rows_aligned(p.dv, "dv");
  const BwdPlan plan = plan_backward(prob);
  if (plan.bytes > 0) require_device_workspace(p, "backward");
  auto* ws = static_cast<unsigned char*>(p.workspace);

  AttentionBwdParams k{};
  k.f = forward_params(p, prob);
  if (prob.mask.present) {
    k.f.tile_active = ws;
    k.f.active_q_tiles = plan.grid.q_tiles;
    k.f.active_k_tiles = plan.grid.k_tiles;
    k.f.mask_tiled = can_tile(p.mask, prob.mask);
    k.f.next_active_table = next_active_table_allowed();
  }
  // The backward tiles a bias with a query dim only in q's dtype (score_terms_bwd.cuh). The
  // launch may still fall back to per-score reads where the tiles would not fit in shared memory.
  if (prob.bias.present) k.f.bias_tiled = (prob.bias.size[2] == 1 || !k.f.bias_f32) && can_tile(p.bias, prob.bias);
  set_gradients(k, p.dout, p.dq, p.dk, p.dv);
  float* delta = reinterpret_cast<float*>(ws + plan.delta_off);
  float* lse2 = reinterpret_cast<float*>(ws + plan.lse2_off);
  k.delta = delta, k.lse2 = lse2;
  k.Sq_pad = int(plan.Sq_pad);
  k.dbias_owner = plan.owner;
  k.rows_batches_per_block = plan.rows_batches;
  k.rows_heads_per_block = plan.rows_heads;
  if (plan.owner != DbiasOwner::none) {
    k.dbias = p.dbias.data;
    k.dbias_f32 = p.dbias.dtype == FDMA_FLOAT32;
    for (int i = 0; i < 4; ++i) {
      k.dbias_size[i] = prob.bias.size[i];
      k.dbias_stride[i] = p.dbias.shape[i] > 1 ? p.dbias.stride[i] : 0;
    }
    if (plan.use_acc) k.dbias_acc = reinterpret_cast<float*>(ws + plan.acc_off);
    k.dbias_slots = plan.slots;
  }

  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  k.f.overlap_previous = overlap_launches();  // prepare, dq, dk/dv, finish (launch.cuh)
  if (prob.mask.present)
    check_cuda(launch_mask_tile_summary(k.f.mask, prob.mask, kBwdBlockM, kBwdBlockN, plan.grid, ws, stream),
               "mask tile summary");
  if (k.dbias_acc)
    check_cuda(cudaMemsetAsync(k.dbias_acc, 0, size_t(plan.slots) * size_t(plan.numel) * sizeof(float), stream),
               "dbias reduction slots");
  if (plan.fused_dq) {
    k.dq_acc = reinterpret_cast<float*>(ws + plan.dq_acc_off);
    check_cuda(cudaMemsetAsync(k.dq_acc, 0, dq_acc_bytes(prob, plan.Sq_pad), stream), "dq sums");
  }
  run_backward_kernels(k, prob.dtype, p.stream);
}

void run_forward_kernel(const AttentionFwdParams& k, DType dtype, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int bucket = head_dim_bucket(k.D);
  const bool bf16 = dtype == DType::bf16;
  cudaError_t err = cudaErrorInvalidValue;
  bool launched = false;
#define FDMA_KERNEL(T, IS_BF16, HD)                             \
  if (!launched && bf16 == IS_BF16 && bucket == HD) {           \
    err = launch_attention_fwd<T, HD>(k, stream);               \
    launched = true;                                            \
  }
#include "kernel_list.inc"
#undef FDMA_KERNEL
  if (!launched) unsupported("no kernel compiled for head dim " + std::to_string(k.D));
  check_cuda(err, "kernel launch");
}

bool backward_ws_takes(const AttentionBwdParams& k, DType dtype) {
  const int bucket = head_dim_bucket(k.f.D);
  const bool bf16 = dtype == DType::bf16;
  bool takes = false, found = false;
#define FDMA_KERNEL(T, IS_BF16, HD)                     \
  if (!found && bf16 == IS_BF16 && bucket == HD) {      \
    takes = attention_bwd_ws_takes<T, HD>(k);           \
    found = true;                                       \
  }
#include "kernel_list.inc"
#undef FDMA_KERNEL
  return takes;
}

void run_backward_kernels(const AttentionBwdParams& k, DType dtype, void* stream_ptr, bool prepared) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const bool bf16 = dtype == DType::bf16;
  if (!prepared)
    check_cuda(bf16 ? launch_bwd_prepare<__nv_bfloat16>(k, stream) : launch_bwd_prepare<__half>(k, stream),
               "backward prepare");
  const int bucket = head_dim_bucket(k.f.D);
  cudaError_t err = cudaErrorInvalidValue;
  bool launched = false;
#define FDMA_KERNEL(T, IS_BF16, HD)                             \
  if (!launched && bf16 == IS_BF16 && bucket == HD) {           \
    err = launch_attention_bwd<T, HD>(k, stream);               \
    launched = true;                                            \
  }
#include "kernel_list.inc"
#undef FDMA_KERNEL
  if (!launched) unsupported("no kernel compiled for head dim " + std::to_string(k.f.D));
  check_cuda(err, "backward kernel launch");
  if (k.dbias_acc)
    check_cuda(bf16 ? launch_dbias_finish<__nv_bfloat16>(k, stream) : launch_dbias_finish<__half>(k, stream),
               "dbias finish");
}

}  // namespace fdma::cuda
