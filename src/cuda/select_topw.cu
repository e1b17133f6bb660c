#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/select_topw.cuh"

namespace fdma::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

__device__ __forceinline__ float load_score(const void* p, int dtype, int64_t off) {
  switch (dtype) {
    case 2: return __half2float(static_cast<const __half*>(p)[off]);
    case 3: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}

// Order-preserving map of a float to uint32, with NaN mapped to 1 (below -inf, which maps to
// 0x007fffff; 0 is left for padding) and -0.0 to +0.0's value: they compare equal, so they
// must tie (and fall back to the index).
__device__ __forceinline__ uint32_t sortable(float f) {
  if (isnan(f)) return 1u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void rank_keys_kernel(TopwInputs in, uint64_t* keys, int32_t* idx) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(t % in.Sk), row = int(t / in.Sk), hk = row % in.Hk, b = row / in.Hk;
    const float s = load_score(in.scores, in.score_dtype,
                               b * in.score_stride[0] + hk * in.score_stride[1] + j * in.score_stride[2]);
    const bool exists = !in.padding || in.padding[b * in.padding_stride[0] + j * in.padding_stride[1]] != 0;
    const uint64_t inv_index = (uint64_t(1) << in.index_bits) - 1 - uint64_t(j);
    const uint64_t inv_row = (uint64_t(1) << in.row_bits) - 1 - uint64_t(row);
    keys[t] = (inv_row << (32 + in.index_bits)) | (uint64_t(exists ? sortable(s) : 0u) << in.index_bits) | inv_index;
    idx[t] = j;
  }
}

__global__ void intervals_kernel(TopwInputs in, const uint64_t* keys, const int32_t* idx, int64_t w, int Sq,
                                 int32_t* begin, int64_t b0, int64_t b1, int64_t b2, int32_t* end, int64_t e0,
                                 int64_t e1, int64_t e2) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int rank = int(t % in.Sk), row = int(t / in.Sk), hk = row % in.Hk, b = row / in.Hk;
    const bool kept = rank < w && rank_key_exists(keys[t], in.index_bits);
    const int j = idx[t];  // each key appears once per row, so every output is written once
    begin[b * b0 + hk * b1 + j * b2] = 0;
    end[b * e0 + hk * e1 + j * e2] = kept ? Sq : 0;
  }
}

// Level `level` of the wavelet matrix: flag the values whose bit is 0 (scanned next).
__global__ void wavelet_flags_kernel(const int32_t* a, int64_t n, int bit, int32_t* flags) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t <= n; t += int64_t(gridDim.x) * blockDim.x)
    flags[t] = t < n ? ((a[t] >> bit) & 1) == 0 : 0;
}

// Stable partition of each row: zeros first, then ones, from the scanned flags. It also flags
// the next level's zeros (bit next_bit) at their new positions, which saves each level after
// the first a flags kernel (launches dominate the selection at short lengths).
__global__ void wavelet_partition_kernel(const int32_t* a, int64_t n, int Sk, int bit, const int32_t* rank0,
                                         int32_t* out, int next_bit, int32_t* next_flags) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row0 = t - t % Sk;
    const int32_t base = rank0[row0], zeros_before = rank0[t] - base, zeros = rank0[row0 + Sk] - base;
    const int64_t i = t - row0;
    const bool zero = ((a[t] >> bit) & 1) == 0;
    const int64_t dst = row0 + (zero ? zeros_before : zeros + (i - zeros_before));
    out[dst] = a[t];
    next_flags[dst] = ((a[t] >> next_bit) & 1) == 0;
  }
}

// k-th smallest (0-based) of the first `len` ranked indices of a row.
__device__ int32_t wavelet_kth(const int32_t* rank0, int levels, int64_t n, int64_t row0, int Sk, int len, int k) {
  int lo = 0, hi = len;
  int32_t value = 0;
  for (int l = 0; l < levels; ++l) {
    const int32_t* r = rank0 + int64_t(l) * (n + 1) + row0;
    const int32_t base = r[0], r_lo = r[lo] - base, r_hi = r[hi] - base;
    if (k < r_hi - r_lo) {
      lo = r_lo, hi = r_hi;
    } else {
      k -= r_hi - r_lo;
      value |= 1 << (levels - 1 - l);
      const int32_t zeros = r[Sk] - base;
      lo = zeros + (lo - r_lo), hi = zeros + (hi - r_hi);
    }
  }
  return value;
}

__global__ void causal_intervals_kernel(TopwInputs in, const uint64_t* keys, const int32_t* idx, const int32_t* rank0,
                                        int levels, int64_t w, int Sq, int32_t* begin, int64_t b0, int64_t b1,
                                        int64_t b2, int32_t* end, int64_t e0, int64_t e1, int64_t e2) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  const int64_t off = int64_t(in.Sk) - Sq;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int rank = int(t % in.Sk), row = int(t / in.Sk), hk = row % in.Hk, b = row / in.Hk;
    const int j = idx[t];
    int64_t lo = 0, hi = 0;
    if (rank_key_exists(keys[t], in.index_bits)) {  // padded keys rank last and are never kept
      lo = j - off > 0 ? j - off : 0;
      hi = Sq;
      if (rank >= w) {
        const int64_t x = wavelet_kth(rank0, levels, n, int64_t(row) * in.Sk, in.Sk, rank, int(w - 1));
        hi = x - off < Sq ? x - off : Sq;
      }
      if (hi <= lo) lo = hi = 0;
    }
    begin[b * b0 + hk * b1 + j * b2] = int32_t(lo);
    end[b * e0 + hk * e1 + j * e2] = int32_t(hi);
  }
}

int levels_for(int Sk) {
  int levels = 1;
  while ((int64_t(1) << levels) < Sk) ++levels;
  return levels;
}

int grid_for(int64_t n, int threads) { return int(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8)); }

}  // namespace

size_t wavelet_workspace(const TopwInputs& in, size_t* scan_bytes) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  size_t temp = 0;
  cub::DeviceScan::ExclusiveSum(nullptr, temp, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                n + 1);
  if (scan_bytes) *scan_bytes = temp;
  return align_up(size_t(levels_for(in.Sk)) * (n + 1) * 4) + align_up((n + 1) * 4) + 2 * align_up(n * 4) +
         align_up(temp);
}

WaveletScratch carve_wavelet(void* base, const TopwInputs& in) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  WaveletScratch w{};
  w.levels = levels_for(in.Sk);
  char* p = static_cast<char*>(base);
  w.rank0 = reinterpret_cast<int32_t*>(p), p += align_up(size_t(w.levels) * (n + 1) * 4);
  w.flags = reinterpret_cast<int32_t*>(p), p += align_up((n + 1) * 4);
  w.a = reinterpret_cast<int32_t*>(p), p += align_up(n * 4);
  w.b = reinterpret_cast<int32_t*>(p), p += align_up(n * 4);
  wavelet_workspace(in, &w.scan_bytes);
  w.scan_temp = p;
  return w;
}

cudaError_t causal_intervals(const TopwInputs& in, const TopwScratch& s, const WaveletScratch& wv, int64_t w, int Sq,
                             int32_t* begin, const int64_t (&bs)[3], int32_t* end, const int64_t (&es)[3],
                             cudaStream_t stream) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  cudaError_t err = cudaSuccess;
  // Level 0 reads the ranked indices in place (the queries read them again); the levels after
  // alternate between a and b. The last level's partition would feed no level: skipped.
  const int32_t* cur = s.idx_out;
  int32_t* next = wv.a;
  for (int l = 0; l < wv.levels && err == cudaSuccess; ++l) {
    const int bit = wv.levels - 1 - l;
    int32_t* rank0 = wv.rank0 + int64_t(l) * (n + 1);
    if (l == 0)  // the later levels' flags come from the partition kernel
      wavelet_flags_kernel<<<grid_for(n + 1, 256), 256, 0, stream>>>(cur, n, bit, wv.flags);
    size_t temp = wv.scan_bytes;
    err = cub::DeviceScan::ExclusiveSum(wv.scan_temp, temp, wv.flags, rank0, n + 1, stream);
    if (err != cudaSuccess || l + 1 == wv.levels) break;
    // flags[n] stays 0 from level 0
    wavelet_partition_kernel<<<grid_for(n, 256), 256, 0, stream>>>(cur, n, in.Sk, bit, rank0, next, bit - 1, wv.flags);
    err = cudaGetLastError();
    cur = next;
    next = next == wv.a ? wv.b : wv.a;
  }
  if (err != cudaSuccess) return err;
  causal_intervals_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, s.keys_out, s.idx_out, wv.rank0, wv.levels, w, Sq,
                                                                begin, bs[0], bs[1], bs[2], end, es[0], es[1], es[2]);
  return cudaGetLastError();
}

void set_rank_bits(TopwInputs& in) {
  in.index_bits = 1;
  while ((int64_t(1) << in.index_bits) < in.Sk) ++in.index_bits;
  in.row_bits = 0;
  while ((int64_t(1) << in.row_bits) < int64_t(in.B) * in.Hk) ++in.row_bits;
}

// The significant bits of a rank key: index, score, row.
int rank_bits(const TopwInputs& in) { return in.index_bits + 32 + in.row_bits; }

size_t topw_workspace(const TopwInputs& in, size_t* cub_bytes) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  size_t temp = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, temp, static_cast<const uint64_t*>(nullptr),
                                            static_cast<uint64_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), n, 0, rank_bits(in));
  if (cub_bytes) *cub_bytes = temp;
  return 2 * align_up(n * 8) + 2 * align_up(n * 4) + align_up(temp);
}

TopwScratch carve_topw(void* base, const TopwInputs& in) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  TopwScratch s{};
  char* p = static_cast<char*>(base);
  s.keys_in = reinterpret_cast<uint64_t*>(p), p += align_up(n * 8);
  s.keys_out = reinterpret_cast<uint64_t*>(p), p += align_up(n * 8);
  s.idx_in = reinterpret_cast<int32_t*>(p), p += align_up(n * 4);
  s.idx_out = reinterpret_cast<int32_t*>(p), p += align_up(n * 4);
  topw_workspace(in, &s.cub_bytes);
  s.cub_temp = p;
  return s;
}

cudaError_t topw_sort(const TopwInputs& in, const TopwScratch& s, cudaStream_t stream) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  rank_keys_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, s.keys_in, s.idx_in);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  size_t temp = s.cub_bytes;
  return cub::DeviceRadixSort::SortPairsDescending(s.cub_temp, temp, s.keys_in, s.keys_out, s.idx_in, s.idx_out, n, 0,
                                                   rank_bits(in), stream);
}

cudaError_t topw_intervals(const TopwInputs& in, const TopwScratch& s, int64_t w, int Sq, int32_t* begin,
                           const int64_t (&bs)[3], int32_t* end, const int64_t (&es)[3], cudaStream_t stream) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  intervals_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, s.keys_out, s.idx_out, w, Sq, begin, bs[0], bs[1], bs[2],
                                                         end, es[0], es[1], es[2]);
  return cudaGetLastError();
}

}  // namespace fdma::cuda
