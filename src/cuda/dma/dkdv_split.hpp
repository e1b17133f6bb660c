// The dk/dv kernel's split walks (AttentionBwdParams::dkdv_splits): how many shares a call
// takes, and the kernel that adds the shares' fp32 partials into dk, dv and dkey_scores.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fdma::cuda {

// Shares of each key group's query walk for a gathered backward of B * Hk rows keeping w keys
// a query. The longest group (keys every later query keeps) walks about G * Sq / 64 steps, the
// average SM about B * Hk * G * Sq * w / 64^2 / SMs: their ratio, 64 * SMs / (B * Hk * w), taken
// at 128 SMs so that the workspace size does not depend on the device, is the split, up to 8
// and to partial buffers of 256 MB. FDMA_DKDV_SPLITS forces it (path_switches.hpp).
int dkdv_splits(int64_t B, int64_t Hk, int64_t Sk, int64_t D, int64_t window);
// Bytes of the partial buffers at `splits` shares (0 for one).
size_t dkdv_partial_bytes(int splits, int64_t B, int64_t Hk, int64_t Sk, int64_t D);

struct DkdvSplitSum {
  const float *dkdv_partial, *dscores_partial;  // as in AttentionBwdParams
  int splits, B, Hk, Sk, D;
  const int32_t *kept, *kept_count;  // KeyLists: the kept keys of each (b, hk), index order
  void *dk, *dv;
  int64_t dk_stride[3], dv_stride[3];
  bool bf16;                  // dk and dv: bf16, else fp16
  void* dscores;              // optional
  bool dscores_f32;           // else dk's dtype
  int64_t dscores_stride[3];
};

// Key j of (b, hk): its dscores entry from its fp32 sum, in dscores' dtype (float32 or T).
template <class T>
__device__ __forceinline__ void store_dscores(const DkdvSplitSum& a, int b, int hk, int j, float sum) {
  const int64_t off = b * a.dscores_stride[0] + hk * a.dscores_stride[1] + int64_t(j) * a.dscores_stride[2];
  if (a.dscores_f32)
    static_cast<float*>(a.dscores)[off] = sum;
  else
    static_cast<T*>(a.dscores)[off] = T(sum);
}

// dk, dv (and dscores) of every kept key: the shares' partials added in share order, so the
// result is the same from run to run. Unkept keys are zeroed elsewhere (bwd_setup.hpp).
cudaError_t dkdv_split_sum(const DkdvSplitSum& a, cudaStream_t stream);

}  // namespace fdma::cuda
