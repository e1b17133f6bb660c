#include "cuda/dma/dkdv_split.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {

int dkdv_splits(int64_t B, int64_t Hk, int64_t Sk, int64_t D, int64_t window) {
  if (const int forced = forced_dkdv_splits()) return B * Hk > 65535 ? 1 : forced;
  constexpr int64_t kSms = 128, kMaxSplits = 8, kMaxBytes = int64_t(256) << 20;
  const int64_t w = std::max<int64_t>(1, std::min(window, Sk)), rows = std::max<int64_t>(1, B * Hk);
  if (rows > 65535) return 1;  // the sum kernel's grid holds a row per y
  int64_t splits = std::min(kMaxSplits, 64 * kSms / (rows * w));
  while (splits > 1 && int64_t(dkdv_partial_bytes(int(splits), B, Hk, Sk, D)) > kMaxBytes) --splits;
  return int(std::max<int64_t>(1, splits));
}

size_t dkdv_partial_bytes(int splits, int64_t B, int64_t Hk, int64_t Sk, int64_t D) {
  return splits > 1 ? size_t(splits) * size_t(B * Hk * Sk) * size_t(2 * D + 1) * 4 : 0;
}

namespace {

// One thread per (kept key, item): items 0..D/2-1 are dk's column pairs, D/2..D-1 dv's, D the
// key's dscores.
template <class T>
__global__ void dkdv_split_sum_kernel(DkdvSplitSum a) {
  const int bh = blockIdx.y, items = a.D + 1;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int i = int(e / items), item = int(e % items);
  if (i >= a.kept_count[bh]) return;
  const int j = a.kept[int64_t(bh) * a.Sk + i], b = bh / a.Hk, hk = bh % a.Hk;
  const int64_t share_stride = int64_t(a.B) * a.Hk * a.Sk;
  if (item == a.D) {
    if (!a.dscores) return;
    float sum = 0.f;
    for (int s = 0; s < a.splits; ++s) sum += a.dscores_partial[s * share_stride + int64_t(bh) * a.Sk + j];
    store_dscores<T>(a, b, hk, j, sum);
    return;
  }
  const bool is_dv = item >= a.D / 2;
  const int d = 2 * (is_dv ? item - a.D / 2 : item);
  float2 sum = make_float2(0.f, 0.f);
  for (int s = 0; s < a.splits; ++s) {
    const float2 x = *reinterpret_cast<const float2*>(
        a.dkdv_partial + (s * share_stride + int64_t(bh) * a.Sk + j) * (2 * a.D) + (is_dv ? a.D : 0) + d);
    sum.x += x.x, sum.y += x.y;
  }
  const int64_t* st = is_dv ? a.dv_stride : a.dk_stride;
  T* out = static_cast<T*>(is_dv ? a.dv : a.dk) + b * st[0] + int64_t(j) * st[1] + hk * st[2] + d;
  *reinterpret_cast<uint32_t*>(out) = ptx::pack2<T>(sum.x, sum.y);
}

}  // namespace

cudaError_t dkdv_split_sum(const DkdvSplitSum& a, cudaStream_t stream) {
  const int64_t n = int64_t(a.Sk) * (a.D + 1);
  const dim3 grid(unsigned((n + 255) / 256), unsigned(a.B * a.Hk));
  if (a.bf16)
    dkdv_split_sum_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(a);
  else
    dkdv_split_sum_kernel<__half><<<grid, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace fdma::cuda
