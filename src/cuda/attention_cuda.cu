// Host side of the CUDA attention: GPU-only checks, params, dispatch over the generated
// kernel list (kernel_list.inc) by dtype and head-dim bucket.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"
#include "cuda/attention_fwd_params.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/kernel_table.hpp"
#include "cuda/mask_tile_summary.hpp"

namespace fdma::cuda {

template <class T, int kHeadDim>
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream);

namespace {

[[noreturn]] void unsupported(const std::string& msg) { detail::fail(Status::unsupported, "attention (CUDA): " + msg); }

void check_cuda(cudaError_t err, const char* what) { cuda::check_cuda(err, std::string("attention (CUDA): ") + what); }

// cp.async moves 16-byte chunks: rows must start on 16-byte boundaries.
void check_rows_aligned(const fdma_tensor& t, const char* name) {
  const bool base_ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  bool strides_ok = true;
  for (int d = 0; d < 3; ++d) strides_ok &= t.shape[d] == 1 || t.stride[d] % 8 == 0;
  if (!base_ok || !strides_ok)
    unsupported(std::string(name) + " must be 16-byte aligned with strides that are multiples of 8 elements");
}

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

}  // namespace

namespace {
MaskTileGrid summary_grid(const detail::AttentionProblem& prob) {
  const int hd = head_dim_bucket(int(prob.dims.D));
  return mask_tile_grid(prob.mask, prob.dims.Sq, prob.dims.Sk, fwd_block_m(hd), fwd_block_n(hd));
}
}  // namespace

size_t attention_workspace(const detail::AttentionProblem& prob, Pass pass) {
  if (pass != Pass::forward) unsupported("the backward has no CUDA kernels yet");
  return prob.mask.present ? size_t(summary_grid(prob).bytes()) : 0;
}

void attention_forward(const fdma_attention_params& p, const detail::AttentionProblem& prob) {
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

  AttentionFwdParams k{};
  k.q = p.q.data, k.k = p.k.data, k.v = p.v.data, k.out = p.out.data;
  k.lse = static_cast<float*>(p.lse.data);
  for (int i = 0; i < 3; ++i) {
    k.q_stride[i] = p.q.stride[i];
    k.k_stride[i] = p.k.stride[i];
    k.v_stride[i] = p.v.stride[i];
    k.out_stride[i] = p.out.stride[i];
    k.lse_stride[i] = p.lse.data ? p.lse.stride[i] : 0;
  }
  MaskTileGrid grid;
  if (prob.mask.present) {
    if (!detail::locate_pointer(p.workspace).device)
      detail::fail(Status::workspace, "attention (CUDA): the workspace must be CUDA device memory");
    grid = summary_grid(prob);
    k.tile_active = static_cast<const uint8_t*>(p.workspace);
    k.active_batches = int(prob.mask.size[0]);
    k.active_heads = int(prob.mask.size[1]);
    k.active_q_tiles = grid.q_tiles;
    k.active_k_tiles = grid.k_tiles;
    k.mask = static_cast<const uint8_t*>(p.mask.data);
    fill_broadcast(prob.mask, k.mask_stride, k.mask_head_mode);
    k.mask_tiled = can_tile(p.mask, prob.mask);
  }
  if (prob.bias.present) {
    k.bias = p.bias.data;
    k.bias_f32 = p.bias.dtype == FDMA_FLOAT32;
    fill_broadcast(prob.bias, k.bias_stride, k.bias_head_mode);
    k.bias_tiled = can_tile(p.bias, prob.bias);
  }
  k.B = int(d.B), k.Sq = int(d.Sq), k.Sk = int(d.Sk), k.H = int(d.H), k.Hk = int(d.Hk), k.G = int(d.G()), k.D = int(d.D);
  k.scale = float(prob.scale);
  k.softcap = float(prob.softcap);
  k.causal = prob.causal;

  DeviceGuard guard(p.q.data);
  auto stream = static_cast<cudaStream_t>(p.stream);
  const int bucket = head_dim_bucket(int(d.D));
  if (prob.mask.present)
    check_cuda(launch_mask_tile_summary(k.mask, prob.mask, fwd_block_m(bucket), fwd_block_n(bucket), grid,
                                        static_cast<uint8_t*>(p.workspace), stream),
               "mask tile summary");
  const bool bf16 = prob.dtype == DType::bf16;
  cudaError_t err = cudaErrorInvalidValue;
  bool launched = false;
#define FDMA_KERNEL(T, IS_BF16, HD)                             \
  if (!launched && bf16 == IS_BF16 && bucket == HD) {           \
    err = launch_attention_fwd<T, HD>(k, stream);               \
    launched = true;                                            \
  }
#include "kernel_list.inc"
#undef FDMA_KERNEL
  if (!launched) unsupported("no kernel compiled for head dim " + std::to_string(d.D));
  check_cuda(err, "kernel launch");
}

}  // namespace fdma::cuda
