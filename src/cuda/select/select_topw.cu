#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda/primitives/arch_dispatch.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/select/rank_key.cuh"
#include "cuda/select/select_cluster.cuh"
#include "cuda/select/select_rows.cuh"
#include "cuda/select/select_topw.cuh"
#include "cuda/select/select_walk.cuh"
#include "cuda/primitives/path_switches.hpp"
#include "cuda/primitives/per_device.cuh"

namespace fdma::cuda {

int rank_bits(const TopwInputs& in);

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

__global__ void rank_keys_kernel(TopwInputs in, uint64_t* keys, int32_t* idx) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(t % in.Sk), row = int(t / in.Sk);
    keys[t] = rank_key(in, row, score_bits(in, row / in.Hk, row % in.Hk, j), j);
    idx[t] = j;
  }
}

__global__ void intervals_kernel(TopwInputs in, const uint64_t* keys, const int32_t* idx, int64_t w, int Sq,
                                 int32_t* begin, int64_t b0, int64_t b1, int64_t b2, int32_t* end, int64_t e0,
                                 int64_t e1, int64_t e2) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int rank = int(t % in.Sk), row = int(t / in.Sk), hk = row % in.Hk, b = row / in.Hk;
    const bool kept = rank < w && rank_key_exists(keys[t], in);
    const int j = idx[t];  // each key appears once per row, so every output is written once
    const IntervalRow r = interval_row(in, b, Sq);
    const int64_t at_b = interval_at(in, r, b, hk, j, b0, b1, b2), at_e = interval_at(in, r, b, hk, j, e0, e1, e2);
    if (at_b < 0) continue;  // past a packed sequence's keys
    begin[at_b] = 0;
    end[at_e] = kept ? r.Sq : 0;
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
  ptx::griddep_wait();  // the ranks (launch.cuh)
  ptx::griddep_launch_dependents();
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int rank = int(t % in.Sk), row = int(t / in.Sk), hk = row % in.Hk, b = row / in.Hk;
    const int j = idx[t];
    const IntervalRow r = interval_row(in, b, Sq);  // a packed sequence's own Sq and offset
    const int64_t at_b = interval_at(in, r, b, hk, j, b0, b1, b2), at_e = interval_at(in, r, b, hk, j, e0, e1, e2);
    if (at_b < 0) continue;  // past a packed sequence's keys
    const bool exists = rank_key_exists(keys[t], in);
    const int64_t x =
        exists && rank >= w ? wavelet_kth(rank0, levels, n, int64_t(row) * in.Sk, in.Sk, rank, int(w - 1)) : -1;
    const KeyInterval kept = causal_interval(r, j, exists, x);
    begin[at_b] = kept.begin;
    end[at_e] = kept.end;
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

namespace {

// The wavelet levels by kernels over all rows: per level one device-wide scan of the zero
// flags and one stable partition. Level 0 reads the ranked indices in place (the queries read
// them again); the levels after alternate between a and b. The last level's partition would
// feed no level: skipped.
cudaError_t wavelet_levels(const TopwInputs& in, const TopwScratch& s, const WaveletScratch& wv, cudaStream_t stream) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  const int32_t* cur = s.idx_out;
  int32_t* next = wv.a;
  for (int l = 0; l < wv.levels; ++l) {
    const int bit = wv.levels - 1 - l;
    int32_t* rank0 = wv.rank0 + int64_t(l) * (n + 1);
    if (l == 0)  // the later levels' flags come from the partition kernel
      wavelet_flags_kernel<<<grid_for(n + 1, 256), 256, 0, stream>>>(cur, n, bit, wv.flags);
    size_t temp = wv.scan_bytes;
    const cudaError_t err = cub::DeviceScan::ExclusiveSum(wv.scan_temp, temp, wv.flags, rank0, n + 1, stream);
    if (err != cudaSuccess || l + 1 == wv.levels) return err;
    // flags[n] stays 0 from level 0
    wavelet_partition_kernel<<<grid_for(n, 256), 256, 0, stream>>>(cur, n, in.Sk, bit, rank0, next, bit - 1, wv.flags);
    if (const cudaError_t launch = cudaGetLastError(); launch != cudaSuccess) return launch;
    cur = next;
    next = next == wv.a ? wv.b : wv.a;
  }
  return cudaGetLastError();
}

// How a selection runs (select_rows.cuh and select_cluster.cuh have the kernels):
//   cluster: a cluster of up to 8 CTAs per row (16 past 32K keys where the GPU can place
//            such a cluster; sm_90, Sk <= kClusterRowMaxKeys), sort and wavelet levels spread
//            over the cluster's shared memory;
//   shared: one CTA per row, the wavelet sequence in shared memory (Sk <= kSharedRowMaxKeys),
//           and the rank sort there too up to kRowThreads * 16 keys;
//   global: the device-wide sort, then one CTA per row builds the wavelet through global memory;
//   levels: the device-wide sort, then kernels per wavelet level over all rows.
// Measured on the H100 (docs/performance.md, "selection"): shared is the fastest of the last
// three wherever it fits; past 32K keys global wins from about SMs / 5 rows on (32 rows of 64K
// keys: 0.77 against 0.85 ms) and levels below (16 rows: 0.53 against 0.60 ms; 4 rows of 128K:
// 0.40 against 0.91 ms). FDMA_SELECT_PATH=cluster|shared|global|levels in the environment
// forces one where it applies (A/B runs and tests).
enum class SelectPath { cluster, shared, global, levels };

// Keys per thread of the in-CTA rank sort for a row of Sk keys; 0: sorted device-wide first.
int row_sort_items(int Sk) { return Sk <= kRowThreads * 4 ? 4 : Sk <= kRowThreads * 16 ? 16 : 0; }

// Shared memory select_row_kernel needs for a row of Sk keys (select_rows.cuh).
size_t select_row_bytes(int Sk) {
  switch (row_sort_items(Sk)) {
    case 4: return select_row_smem<4>();
    case 16: return select_row_smem<16>();
    default: return select_row_smem<0>();
  }
}

// A row of Sk keys in segments of a multiple of 4 keys (the levels' 16-byte copies), one per
// CTA of the cluster: eight where the row is long enough, fewer below 8 * 512 keys, sixteen
// past kClusterPortableRowKeys, or past kClusterWideRowKeys where `wide` (select_path).
int cluster_segment(int Sk, bool wide) {
  const int ctas = Sk > kClusterPortableRowKeys || (wide && Sk > kClusterWideRowKeys) ? kClusterMaxCtas
                                                                                        : kClusterPortableCtas;
  const int part = (Sk + ctas - 1) / ctas;
  return (std::max(part, std::min(Sk, 512)) + 3) / 4 * 4;
}
int cluster_ctas(int Sk, bool wide) {
  const int seg = cluster_segment(Sk, wide);
  return (Sk + seg - 1) / seg;
}

// Calls f(Shape{}) with the cluster kernel's CTA shape for segments of `seg` keys.
template <int kThreads, int kItems>
struct ClusterShape {
  static constexpr int threads = kThreads, items = kItems;
};
template <class F>
cudaError_t with_cluster_shape(int seg, F&& f) {
  if (seg <= ClusterConfig<256, 8>::kSegMax) return f(ClusterShape<256, 8>{});
  if (seg <= ClusterConfig<512, 8>::kSegMax) return f(ClusterShape<512, 8>{});
  return f(ClusterShape<512, 16>{});
}

// The launch configuration of the cluster kernel of this shape for rows of in.Sk keys (attr:
// one slot); sets the kernel's attributes on first use on a device.
template <class Shape>
cudaError_t cluster_config(const TopwInputs& in, bool wide, cudaStream_t stream, cudaLaunchConfig_t& cfg,
                           cudaLaunchAttribute* attr) {
  const auto kernel = select_cluster_kernel<Shape::threads, Shape::items>;
  constexpr size_t smem = select_cluster_smem<Shape::threads, Shape::items>();
  static std::atomic<bool> done[kMaxDevices] = {};
  if (const cudaError_t err = once_per_device(done, [&] {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        // harmless where a cluster has 8 CTAs or fewer; the 32K-128K-key rows take 16
        return e != cudaSuccess ? e : cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      });
      err != cudaSuccess)
    return err;
  const int ctas = cluster_ctas(in.Sk, wide);
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3(unsigned(ctas), unsigned(in.B * in.Hk));
  cfg.blockDim = dim3(unsigned(Shape::threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(ctas);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaSuccess;
}

// The current device's SM count, opt-in shared memory per block and whether it runs the
// cluster kernel (compute capability 9.x and sm_90 code for it in this build) with up to 8
// CTAs, and with 16 (the largest segments: a non-portable size, which the GPU may not place),
// queried once per device.
struct DeviceLimits {
  int sms = 1, smem_optin = 0;  // what a failed query answers: the device-wide paths
  bool clusters = false, clusters16 = false;
};
DeviceLimits device_limits() {
  // bit 63: known; 49: 16-CTA clusters; 48: clusters; 32-47: SMs; 0-31: shared memory
  static std::atomic<uint64_t> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  if (device < kMaxDevices)
    if (const uint64_t c = cached[device].load(std::memory_order_relaxed))
      return {int((c >> 32) & 0xffff), int(c & 0xffffffffu), ((c >> 48) & 1) != 0, ((c >> 49) & 1) != 0};
  DeviceLimits l;
  int major = 0;
  cudaFuncAttributes attr{};
  if (cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();  // a failed query is an answer, not the caller's error
    return {};
  }
  l.clusters = major >= 9 && cudaFuncGetAttributes(&attr, select_cluster_kernel<512, 8>) == cudaSuccess &&
               attr.binaryVersion >= 90 && select_cluster_smem<512, 8>() <= size_t(l.smem_optin);
  if (l.clusters && select_cluster_smem<512, 16>() <= size_t(l.smem_optin)) {
    TopwInputs probe{};
    probe.B = probe.Hk = 1, probe.Sk = kClusterRowMaxKeys;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute la[1];
    int placed = 0;
    l.clusters16 = with_cluster_shape(cluster_segment(probe.Sk, false), [&](auto shape) {
                     const cudaError_t err = cluster_config<decltype(shape)>(probe, false, nullptr, cfg, la);
                     const auto kernel = select_cluster_kernel<decltype(shape)::threads, decltype(shape)::items>;
                     return err != cudaSuccess ? err : cudaOccupancyMaxActiveClusters(&placed, kernel, &cfg);
                   }) == cudaSuccess &&
                   placed > 0;
  }
  cudaGetLastError();
  if (device < kMaxDevices)
    cached[device].store(uint64_t(1) << 63 | uint64_t(l.clusters16) << 49 | uint64_t(l.clusters) << 48 |
                         uint64_t(l.sms & 0xffff) << 32 | uint32_t(l.smem_optin));
  return l;
}

// Whether rows past kClusterWideRowKeys take sixteen CTAs a cluster: where the GPU places such
// clusters and every row's cluster fits in one wave. Each pass of the cluster's sort is a
// latency-bound chain over its segment, so halving the segment shortens it while the SMs
// would idle anyway (few rows).
bool cluster_wide(const TopwInputs& in, const DeviceLimits& l) {
  return l.clusters16 && int64_t(in.B) * in.Hk * kClusterMaxCtas <= l.sms;
}

// sort_only: the ranks without wavelet levels (non-causal, or causal ends by the walk).
SelectPath select_path(const TopwInputs& in, bool sort_only) {
  const DeviceLimits limits = device_limits();
  const auto [sms, smem_optin, clusters, clusters16] = limits;
  // The cluster path spreads a row over up to 16 SMs: for the few-row case, where the others
  // leave SMs idle (measured on the H200 at c682e7d: 8 rows of 16K keys 0.080 ms against 0.132
  // a CTA per row; 32 rows 0.178 against 0.150, 32 rows of 4K keys 0.109 against 0.078).
  const int64_t rows = int64_t(in.B) * in.Hk;
  const bool fits_cluster = (in.Sk <= kClusterPortableRowKeys ? clusters : clusters16) &&
                            in.Sk <= kClusterRowMaxKeys && rows <= 65535;
  const bool cluster_pays = fits_cluster && rows * cluster_ctas(in.Sk, cluster_wide(in, limits)) <= sms;
  // GPUs with less shared memory per block (99 KB on sm_86/89) take rows up to 16K keys here.
  const bool fits_shared = in.Sk <= kSharedRowMaxKeys && select_row_bytes(in.Sk) <= size_t(smem_optin);
  const char* forced = forced_select_path();
  if (std::strcmp(forced, "cluster") == 0 && fits_cluster) return SelectPath::cluster;
  if (std::strcmp(forced, "shared") == 0 && fits_shared) return SelectPath::shared;
  if (std::strcmp(forced, "global") == 0) return SelectPath::global;
  if (std::strcmp(forced, "levels") == 0) return SelectPath::levels;
  if (cluster_pays) return SelectPath::cluster;
  // Without levels, rows of 16K-32K keys sort faster in clusters than device-wide (the shared
  // path's sort there) even when the clusters take several waves (H100, 64 rows of 32K keys,
  // causal with the walk: 0.32 against 0.49 ms).
  if (sort_only && fits_cluster && in.Sk <= kClusterPortableRowKeys && row_sort_items(in.Sk) == 0)
    return SelectPath::cluster;
  // Many short rows (a packed batch of short sequences): a 1024-thread CTA per row of a few
  // hundred keys is mostly idle, and device-wide passes over all rows at once win (H100, 4000
  // rows of 128 keys, causal: 1226 us a CTA per row, 200 us sort + levels).
  if (in.Sk <= kRowThreads && rows >= 8 * int64_t(sms)) return SelectPath::levels;
  if (fits_shared) return SelectPath::shared;
  return int64_t(in.B) * in.Hk * 5 >= sms ? SelectPath::global : SelectPath::levels;
}

cudaError_t launch_select_cluster(const TopwInputs& in, const TopwScratch& s, int levels, int32_t* rank0,
                                  cudaStream_t stream) {
  const bool wide = cluster_wide(in, device_limits());
  const int seg = cluster_segment(in.Sk, wide);
  return with_cluster_shape(seg, [&](auto shape) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    if (const cudaError_t err = cluster_config<decltype(shape)>(in, wide, stream, cfg, attr); err != cudaSuccess)
      return err;
    const auto kernel = select_cluster_kernel<decltype(shape)::threads, decltype(shape)::items>;
    return cudaLaunchKernelEx(&cfg, kernel, in, seg, levels, s.keys_out, s.idx_out, rank0);
  });
}

template <int kSortItems, int kSkipBits>
cudaError_t launch_select_row_kernel(const TopwInputs& in, const TopwScratch& s, int levels, int32_t* rank0,
                                     cudaStream_t stream) {
  constexpr size_t smem = select_row_smem<kSortItems>();
  const auto kernel = select_row_kernel<kSortItems, kSkipBits>;
  static std::atomic<bool> done[kMaxDevices] = {};
  if (const cudaError_t err = once_per_device(
          done, [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); });
      err != cudaSuccess)
    return err;
  kernel<<<in.B * in.Hk, kRowThreads, smem, stream>>>(in, levels, s.keys_out, s.idx_out, rank0);
  return cudaGetLastError();
}

// The CTA's sort leaves out the 16 score bits bfloat16 leaves decided (select_topw.cuh); float16's
// 13 took another instantiation of cub's sort and 14 s more to compile per architecture.
template <int kSortItems>
cudaError_t launch_select_row(const TopwInputs& in, const TopwScratch& s, int levels, int32_t* rank0,
                              cudaStream_t stream) {
  if constexpr (kSortItems > 0) {
    if (score_decided_low_bits(in.score_dtype) == 16)
      return launch_select_row_kernel<kSortItems, 16>(in, s, levels, rank0, stream);
  }
  return launch_select_row_kernel<kSortItems, 0>(in, s, levels, rank0, stream);
}

// The device-wide rank sort: every row at once, ranks in keys_out/idx_out.
cudaError_t device_sort(const TopwInputs& in, const TopwScratch& s, cudaStream_t stream) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  rank_keys_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, s.keys_in, s.idx_in);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  size_t temp = s.cub_bytes;
  return cub::DeviceRadixSort::SortPairsDescending(s.cub_temp, temp, s.keys_in, s.keys_out, s.idx_in, s.idx_out, n, 0,
                                                   rank_bits(in), stream);
}

// Ranks (and for causal, the wavelet matrix in wv) by `path`.
cudaError_t rank_rows(const TopwInputs& in, const TopwScratch& s, const WaveletScratch* wv, SelectPath path,
                      cudaStream_t stream) {
  int32_t* rank0 = wv ? wv->rank0 : nullptr;
  const int levels = wv ? wv->levels : 0;
  if (path == SelectPath::cluster) return launch_select_cluster(in, s, levels, rank0, stream);
  if (path == SelectPath::shared && row_sort_items(in.Sk) == 4) return launch_select_row<4>(in, s, levels, rank0, stream);
  if (path == SelectPath::shared && row_sort_items(in.Sk) == 16)
    return launch_select_row<16>(in, s, levels, rank0, stream);
  if (const cudaError_t err = device_sort(in, s, stream); err != cudaSuccess || !wv) return err;
  if (path == SelectPath::shared) return launch_select_row<0>(in, s, levels, rank0, stream);
  if (path == SelectPath::levels) return wavelet_levels(in, s, *wv, stream);
  wavelet_rows_kernel<<<in.B * in.Hk, kRowThreads, 0, stream>>>(s.idx_out, in.B * in.Hk, in.Sk, levels, rank0, wv->a,
                                                                 wv->b);
  return cudaGetLastError();
}

// The walk (select_walk.cuh) where a row's bitmap is small: its cost grows as Sk^2 / piece
// per row (every piece copies the prefix bitmap), the wavelet's as Sk log Sk.
constexpr int kWalkMaxKeys = 1 << 18;

bool walk_applies(const TopwInputs& in) { return in.Sk <= kWalkMaxKeys && select_walk_allowed(); }

// Pieces of 64-256 positions, as many as fill the GPU about 8 times over (a piece's work is
// mostly one warp's); spans of a sixteenth of the row, or the whole row where its keys are few
// enough for every piece to place them with atomics (no prefix kernels then). The narrow ranks
// (walk_pieces.cuh) are set apart by choose_narrow_ranks.
WalkShape walk_shape(const TopwInputs& in, int sms) {
  const int64_t rows = int64_t(in.B) * in.Hk;
  WalkShape sh{};
  const int64_t want = (rows * in.Sk + 8 * int64_t(sms) - 1) / (8 * int64_t(sms));
  sh.piece = int(std::clamp<int64_t>((want + 31) / 32 * 32, 64, 256));
  sh.span = in.Sk <= 8192 ? (in.Sk + sh.piece - 1) / sh.piece * sh.piece
                          : ((in.Sk + 15) / 16 + sh.piece - 1) / sh.piece * sh.piece;
  sh.spans = (in.Sk + sh.span - 1) / sh.span;
  sh.words = (in.Sk + 31) / 32;
  return sh;
}

// CTAs of the walk kernel an SM holds with the largest bitmap (rows of kWalkMaxKeys keys; a
// smaller one leaves room for as many or more), queried once per device; 0 if the query fails.
int walk_ctas_per_sm() {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, walk_intervals_kernel, kWalkThreads,
                                                      size_t(kWalkMaxKeys / 32) * 4) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  });
}

// The 3w ranks after rank w cut narrow where the walk's grid, so cut, still runs in one wave: the
// kernel then lasts as long as its heaviest CTA, which the narrow pieces lighten. Over several
// waves each extra piece's setup (the prefix bitmap, Sk / 32 words, ORed in again) adds to the
// total instead (docs/performance.md measures both). FDMA_WALK_NARROW=k forces k * w ranks.
constexpr int kNarrowRanksPerW = 3;
void choose_narrow_ranks(WalkShape& sh, int rows, int Sk, int64_t w, int sms) {
  const int forced = walk_narrow_ranks();
  set_walk_narrow_ranks(sh, Sk, w, forced >= 0 ? forced : kNarrowRanksPerW);
  if (forced < 0 && int64_t(rows) * walk_pieces(sh, Sk) > int64_t(walk_ctas_per_sm()) * sms)
    set_walk_narrow_ranks(sh, Sk, w, 0);
}

// The causal intervals by the walk, after the sort (ranks in s); the prefix bitmaps go where
// the wavelet's zero counts would (rows * (spans - 1) * words words, less than its
// levels * (n + 1)).
// counts: the kept keys counted too, where the span kernel runs to zero them first (rows of more
// than one span) and keys are not packed (a packed key's block is not its row's).
cudaError_t walk_intervals(const TopwInputs& in, const TopwScratch& s, const WaveletScratch& wv, int64_t w, int Sq,
                           int32_t* begin, const int64_t (&bs)[3], int32_t* end, const int64_t (&es)[3],
                           cudaStream_t stream, bool overlap, const KeptCounts* counts, bool* counted) {
  const int rows = in.B * in.Hk;
  const int sms = device_limits().sms;
  WalkShape sh = walk_shape(in, sms);
  choose_narrow_ranks(sh, rows, in.Sk, w, sms);
  const size_t bitmap_bytes = size_t(sh.words) * 4;
  KeptCounts kc{};
  if (counts && sh.spans > 1 && !in.cu_k) kc = *counts;
  // Never true: pieces of at most 256, at most 16 spans of Sk / 32 words.
  if (sh.piece > kWalkThreads || sh.spans > kWalkMaxSpans ||
      int64_t(sh.spans - 1) * sh.words > int64_t(wv.levels) * in.Sk)
    return cudaErrorInvalidValue;
  if (counted) *counted = kc.counts != nullptr;
  auto* prefix = reinterpret_cast<uint32_t*>(wv.rank0);
  if (sh.spans > 1) {
    if (const cudaError_t err = launch_kernel(overlap, walk_span_bits_kernel, dim3(rows, sh.spans - 1), kWalkThreads,
                                              bitmap_bytes, stream, in.Sk, sh, s.idx_out, prefix, kc);
        err != cudaSuccess)
      return err;
    if (const cudaError_t err =
            launch_kernel(overlap, walk_prefix_or_kernel, dim3(rows, (sh.words + kWalkThreads - 1) / kWalkThreads),
                          kWalkThreads, 0, stream, sh, prefix);
        err != cudaSuccess)
      return err;
  }
  return launch_kernel(overlap, walk_intervals_kernel, dim3(rows, walk_pieces(sh, in.Sk)), kWalkThreads,
                       bitmap_bytes, stream, in, sh, s.keys_out, s.idx_out, prefix, w, Sq, begin, bs[0], bs[1], bs[2],
                       end, es[0], es[1], es[2], kc);
}

}  // namespace

cudaError_t select_intervals(const TopwInputs& in, const TopwScratch& s, const WaveletScratch* wv, int64_t w, int Sq,
                             int32_t* begin, const int64_t (&bs)[3], int32_t* end, const int64_t (&es)[3],
                             cudaStream_t stream, bool overlap, const KeptCounts* counts, bool* counted) {
  const int64_t n = int64_t(in.B) * in.Hk * in.Sk;
  if (counted) *counted = false;
  if (wv && walk_applies(in)) {  // the sort alone, then the walk
    if (const cudaError_t err = rank_rows(in, s, nullptr, select_path(in, true), stream); err != cudaSuccess)
      return err;
    return walk_intervals(in, s, *wv, w, Sq, begin, bs, end, es, stream, overlap, counts, counted);
  }
  if (const cudaError_t err = rank_rows(in, s, wv, select_path(in, wv == nullptr), stream); err != cudaSuccess)
    return err;
  if (wv)
    return launch_kernel(overlap, causal_intervals_kernel, grid_for(n, 256), 256, 0, stream, in, s.keys_out, s.idx_out,
                         wv->rank0, wv->levels, w, Sq, begin, bs[0], bs[1], bs[2], end, es[0], es[1], es[2]);
  else
    intervals_kernel<<<grid_for(n, 256), 256, 0, stream>>>(in, s.keys_out, s.idx_out, w, Sq, begin, bs[0], bs[1],
                                                           bs[2], end, es[0], es[1], es[2]);
  return cudaGetLastError();
}

void set_rank_bits(TopwInputs& in) {
  in.index_bits = 1;
  while ((int64_t(1) << in.index_bits) < in.Sk) ++in.index_bits;
  in.score_key_bits = 32 - score_decided_low_bits(in.score_dtype);
  in.row_bits = 0;
  while ((int64_t(1) << in.row_bits) < int64_t(in.B) * in.Hk) ++in.row_bits;
}

// The significant bits of a rank key: index, score, row.
int rank_bits(const TopwInputs& in) { return in.index_bits + in.score_key_bits + in.row_bits; }

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

}  // namespace fdma::cuda
