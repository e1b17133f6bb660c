// Kernel behind bwd_setup.hpp.
#include "cuda/dma/bwd_setup.hpp"

#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "cuda/attention/bwd_prepare_row.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

constexpr int kSetupThreads = 512;  // 16 warps: the sort's most
constexpr int kZeroCtasPerSm = 4;   // kSetupThreads x 4 fills an SM

// A kept key's bin: its interval's end tile counted from the last, so the latest ends sort
// first. end in [1, Sq] for a kept key (the records clamp); clamped anyway.
__device__ int end_bin(const EndOrder& o, int32_t end) {
  const int tile = int((int64_t(end) + (int64_t(1) << o.quantum_log2) - 1) >> o.quantum_log2);
  const int b = o.bins - tile;
  return b < 0 ? 0 : b >= o.bins ? o.bins - 1 : b;
}

// The bins of a warp's next kSortBatch steps of 32 keys (-1 past hi) and, with index, the keys:
// every load issued before the first is used, two L2 round trips a batch rather than two a step.
constexpr int kSortBatch = 8;
__device__ void load_bins(const EndOrder& o, const KeyInfo* info, const int32_t* kept, int first, int hi,
                          int32_t (&key)[kSortBatch], int (&bin)[kSortBatch]) {
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int k = 0; k < kSortBatch; ++k) {
    const int i = first + 32 * k + lane;
    key[k] = i < hi ? kept[i] : -1;
  }
#pragma unroll
  for (int k = 0; k < kSortBatch; ++k) bin[k] = key[k] >= 0 ? end_bin(o, info[key[k]].end) : -1;
}

// One row's kept keys (kept[i], i < n, index order) into out by bin, stable: each warp counts
// the bins of its contiguous segment, the counts become offsets (bin-major, warp-minor: every
// key of an earlier bin, then the bin's keys in earlier segments), and each warp walks its
// segment again placing keys at their offset plus their rank among the step's keys of the same
// bin (__match_any_sync), 32 keys a step. counts: o.warps * o.bins ints of shared memory.
__device__ void sort_row_by_end(const EndOrder& o, const KeyInfo* info, const int32_t* kept, int n, int32_t* out,
                                int* counts) {
  using Scan = cub::BlockScan<int, kSetupThreads, cub::BLOCK_SCAN_WARP_SCANS>;  // 96 bytes: within end_order's 256
  __shared__ typename Scan::TempStorage scan;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int i = threadIdx.x; i < o.warps * o.bins; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  const int seg = (n + o.warps - 1) / o.warps;
  const int lo = warp * seg, hi = min(n, lo + seg);
  int* mine = counts + warp * o.bins;
  int32_t key[kSortBatch];
  int bin[kSortBatch];
  if (warp < o.warps) {
    for (int first = lo; first < hi; first += 32 * kSortBatch) {
      load_bins(o, info, kept, first, hi, key, bin);
#pragma unroll
      for (int k = 0; k < kSortBatch; ++k) {
        const unsigned same = __match_any_sync(0xffffffffu, bin[k]);
        if (bin[k] >= 0 && lane == __ffs(same) - 1) mine[bin[k]] += __popc(same);
        __syncwarp();  // the next step's leader may add to the same bin
      }
    }
  }
  __syncthreads();
  // Offsets: each thread a run of bins; a block scan of the runs' totals gives its first.
  const int per = (o.bins + kSetupThreads - 1) / kSetupThreads;
  const int b0 = min(o.bins, int(threadIdx.x) * per), b1 = min(o.bins, b0 + per);
  int total = 0;
  for (int b = b0; b < b1; ++b)
    for (int w = 0; w < o.warps; ++w) total += counts[w * o.bins + b];
  int run;
  Scan(scan).ExclusiveSum(total, run);
  for (int b = b0; b < b1; ++b)
    for (int w = 0; w < o.warps; ++w) {
      const int c = counts[w * o.bins + b];
      counts[w * o.bins + b] = run;
      run += c;
    }
  __syncthreads();
  if (warp >= o.warps) return;
  for (int first = lo; first < hi; first += 32 * kSortBatch) {
    load_bins(o, info, kept, first, hi, key, bin);
#pragma unroll
    for (int k = 0; k < kSortBatch; ++k) {
      const unsigned same = __match_any_sync(0xffffffffu, bin[k]);
      if (bin[k] >= 0) out[mine[bin[k]] + __popc(same & ((1u << lane) - 1))] = key[k];
      __syncwarp();
      if (bin[k] >= 0 && lane == __ffs(same) - 1) mine[bin[k]] += __popc(same);
      __syncwarp();
    }
  }
}

// A chunk of the unkept-key zeroing, at = (b * Hk + hk, key j, chunk): one thread per 16-byte
// chunk of a key's dk and dv rows (D * elem_bytes is a multiple of 16), the key's first chunk
// also its dscores entry; walked with no 64-bit division an element (MixedRadixWalk). A warp per
// key left half its lanes idle at D = 128 (16 chunks), and about 60% of keys are unkept at 16K
// (docs/performance.md, "key lists"). Kept keys: their fp32 rows, where the kernel adds into them.
__device__ void zero_key_chunk(const DmaListShape& s, const KeyInfo* info, const BwdZeroArgs& z, int chunks,
                               const MixedRadixWalk& at) {
  const int64_t key = at.outer * s.Sk + at.mid;
  const int c = at.inner;
  const KeyInfo r = info[key];
  if (r.end > r.begin) {
    if (!z.kept_rows) return;
    float4* row = reinterpret_cast<float4*>(z.kept_rows + key * (2 * z.D));
    for (int q = c; q < z.D / 2; q += chunks) row[q] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c == 0) z.kept_dscores[key] = 0.f;
    return;
  }
  const int j = at.mid, bh = int(at.outer), hk = bh % s.Hk, b = bh / s.Hk;
  char* dk = static_cast<char*>(z.dk) + (b * z.dk_stride[0] + j * z.dk_stride[1] + hk * z.dk_stride[2]) * z.elem_bytes;
  char* dv = static_cast<char*>(z.dv) + (b * z.dv_stride[0] + j * z.dv_stride[1] + hk * z.dv_stride[2]) * z.elem_bytes;
  reinterpret_cast<int4*>(dk)[c] = make_int4(0, 0, 0, 0);
  reinterpret_cast<int4*>(dv)[c] = make_int4(0, 0, 0, 0);
  if (z.dscores && c == 0) {
    char* ds = static_cast<char*>(z.dscores) +
               (b * z.dscores_stride[0] + hk * z.dscores_stride[1] + j * z.dscores_stride[2]) * z.dscores_bytes;
    for (int i = 0; i < z.dscores_bytes; ++i) ds[i] = 0;
  }
}

// CTAs [0, rows) sort a row each; the rest prepare and zero, grid-strided. Two CTAs an SM
// bound the registers at 64 (the walks' carried digits fit; no spills).
__global__ void __launch_bounds__(kSetupThreads, 2) bwd_setup_kernel(DmaListShape s, EndOrder o, const KeyInfo* info,
                                                                  const int32_t* kept, const int32_t* kept_count,
                                                                  int32_t* kept_by_end, int rows, BwdZeroArgs z,
                                                                  BwdPrepareRows prep) {
  extern __shared__ int counts[];
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if (int(blockIdx.x) < rows) {
    const int64_t row0 = int64_t(blockIdx.x) * s.Sk;
    sort_row_by_end(o, info + row0, kept + row0, kept_count[blockIdx.x], kept_by_end + row0, counts);
    return;
  }
  const int64_t first = int64_t(blockIdx.x - rows) * kSetupThreads + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x - rows) * kSetupThreads;
  if (prep.delta) prepare_rows_strided(prep, first, stride);
  for (int64_t i = first; i < z.sum_float4s; i += stride) z.sums[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int chunks = z.D * z.elem_bytes / 16;
  const int64_t rows_bh = s.keys() / s.Sk;
  for (MixedRadixWalk at(first, stride, s.Sk, chunks); at.outer < rows_bh; at.advance())
    zero_key_chunk(s, info, z, chunks, at);
}

}  // namespace

cudaError_t bwd_setup(const DmaListShape& s, const KeyInfo* info, const int32_t* kept, const int32_t* kept_count,
                      int32_t* kept_by_end, const BwdZeroArgs& z, const BwdPrepareRows& prep, cudaStream_t stream,
                      bool overlap) {
  const EndOrder o = end_order(s.Sq);
  const int rows = kept_by_end ? s.B * s.Hk : 0;
  const int64_t unkept = s.keys() * (z.D * z.elem_bytes / 16);
  const int64_t prep_lanes = prep.delta ? int64_t(prep.B) * prep.H * prep.Sq_pad * strided_prepare_lanes(prep.D) : 0;
  const int64_t work = std::max({z.sum_float4s, unkept, prep_lanes});
  const int sms = device_sm_count();
  const int64_t most = int64_t(sms > 0 ? sms : 1) * kZeroCtasPerSm, wanted = (work + kSetupThreads - 1) / kSetupThreads;
  const int64_t grid = rows + (wanted < most ? wanted : most);
  if (grid == 0) return cudaSuccess;
  const size_t smem = rows ? size_t(o.warps) * o.bins * 4 : 0;
  return launch_kernel(overlap, bwd_setup_kernel, dim3(unsigned(grid)), dim3(kSetupThreads), smem, stream, s, o, info,
                       kept, kept_count, kept_by_end, rows, z, prep);
}

}  // namespace fdma::cuda
