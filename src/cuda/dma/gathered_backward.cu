#include "cuda/dma/gathered_backward.hpp"

#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/dma/dkdv_split.hpp"
#include "cuda/primitives/device_guard.hpp"

namespace fdma::cuda {

void set_gathered_rows(AttentionBwdParams& k, char* rows, size_t row_bytes) {
  k.delta = reinterpret_cast<float*>(rows);
  k.lse2 = reinterpret_cast<float*>(rows + row_bytes);
  k.Sq_pad = (k.f.Sq + kBwdBlockM - 1) / kBwdBlockM * kBwdBlockM;
  k.rows_batches_per_block = k.rows_heads_per_block = 1;
}

void set_split_partials(AttentionBwdParams& k, int splits, void* partial) {
  k.dkdv_splits = splits;
  if (splits <= 1) return;
  const AttentionFwdParams& f = k.f;
  k.dkdv_partial = static_cast<float*>(partial);
  k.dscores_partial = k.dkdv_partial + size_t(splits) * size_t(int64_t(f.B) * f.Hk * f.Sk) * size_t(2 * f.D);
}

void run_gathered_backward(const char* op, const AttentionBwdParams& k, const DmaListShape& s, const fdma_tensor& dk,
                           const fdma_tensor& dv, DType dtype, cudaStream_t stream, bool overlap) {
  const AttentionFwdParams& f = k.f;
  UnkeptZeroArgs z{};
  z.dk = dk.data, z.dv = dv.data;
  for (int i = 0; i < 3; ++i) z.dk_stride[i] = dk.stride[i], z.dv_stride[i] = dv.stride[i];
  z.D = f.D;
  z.elem_bytes = int(dtype_size(dtype));
  z.dscores = f.lists.dscores;
  for (int i = 0; i < 3; ++i) z.dscores_stride[i] = f.lists.dscores_stride[i];
  z.dscores_bytes = f.lists.dscores_f32 ? 4 : z.elem_bytes;
  check_cuda(zero_unkept_grads(s, f.lists.info, z, stream, overlap), std::string(op) + " (CUDA): zero unkept keys");
  run_backward_kernels(k, dtype, stream);
  if (k.dkdv_splits <= 1) return;
  DkdvSplitSum a{};
  a.dkdv_partial = k.dkdv_partial, a.dscores_partial = k.dscores_partial;
  a.splits = k.dkdv_splits, a.B = f.B, a.Hk = f.Hk, a.Sk = f.Sk, a.D = f.D;
  a.kept = f.lists.kept, a.kept_count = f.lists.kept_count;
  a.dk = dk.data, a.dv = dv.data;
  for (int i = 0; i < 3; ++i) a.dk_stride[i] = dk.stride[i], a.dv_stride[i] = dv.stride[i];
  a.bf16 = dtype == DType::bf16;
  a.dscores = f.lists.dscores, a.dscores_f32 = f.lists.dscores_f32;
  for (int i = 0; i < 3; ++i) a.dscores_stride[i] = f.lists.dscores_stride[i];
  check_cuda(dkdv_split_sum(a, stream), std::string(op) + " (CUDA): dk/dv split sum");
}

}  // namespace fdma::cuda
