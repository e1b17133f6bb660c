#include "cuda/dma/bwd_ws_finish.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/attention/bwd_ws_dq_zero.cuh"
#include "cuda/primitives/launch.cuh"
#include "cuda/primitives/per_device.cuh"
#include "cuda/primitives/ptx.cuh"

namespace fdma::cuda {
namespace {

constexpr int kFinishThreads = 256, kFinishCtasPerSm = 4, kFinishTileRows = 64;

// 64-row dq tiles of range r (the plan's tiles) over every (batch, head).
__device__ __forceinline__ int finish_dq_jobs(const AttentionBwdParams& p, int r) {
  const int tiles = (p.f.Sq + kFinishTileRows - 1) / kFinishTileRows, t0 = r * p.ws.tiles_per_range;
  return max(0, min(tiles, t0 + p.ws.tiles_per_range) - t0) * p.f.B * p.f.H;
}

// Until *counter reaches target (one thread; the others wait at the barrier after).
__device__ __forceinline__ void finish_wait(const int* counter, int target) {
  while (ptx::ld_acquire_gpu(counter) < target) __nanosleep(256);
}

// The rows of dq tile `tile` of (batch, head) bh, from the sums (read from L2: another SM's
// copy engine wrote them), eight columns a thread a pass.
template <class T>
__device__ __forceinline__ void finish_dq_tile(const AttentionBwdParams& p, int tile, int bh) {
  const AttentionFwdParams& f = p.f;
  const int per_row = f.D / 8, b = bh / f.H, h = bh % f.H;
  for (int e = threadIdx.x; e < kFinishTileRows * per_row; e += kFinishThreads) {
    const int i = tile * kFinishTileRows + e / per_row, d = e % per_row * 8;
    if (i >= f.Sq) break;  // rows only grow with e
    const float4* acc = reinterpret_cast<const float4*>(p.dq_acc + dq_acc_offset(bh, i, d, p.Sq_pad, f.D));
    const float4 lo = __ldcg(acc), hi = __ldcg(acc + 1);
    const uint4 out = make_uint4(ptx::pack2<T>(lo.x, lo.y), ptx::pack2<T>(lo.z, lo.w), ptx::pack2<T>(hi.x, hi.y),
                                 ptx::pack2<T>(hi.z, hi.w));
    *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] +
                              d) = out;
  }
}

// Group g's keys: dk and dv in four columns a thread a pass, then dscores.
template <class T>
__device__ __forceinline__ void finish_key_group(const AttentionBwdParams& p, const DkdvSplitSum& o, int g, int n_keys) {
  const int D = o.D, quads = D / 4, per_key = 2 * quads + 1;
  const int bh = g / p.ws.groups_per_row, b = bh / o.Hk, hk = bh % o.Hk;
  const int32_t* keys = p.ws.keys + int64_t(g) * kBwdWsKeys;
  for (int e = threadIdx.x; e < n_keys * per_key; e += kFinishThreads) {
    const int j = keys[e / per_key], item = e % per_key;
    const int64_t row = int64_t(bh) * o.Sk + j;
    if (item == 2 * quads) {
      if (o.dscores) store_dscores<T>(o, b, hk, j, __ldcg(o.dscores_partial + row));
      continue;
    }
    const bool is_dv = item >= quads;
    const int d = 4 * (is_dv ? item - quads : item);
    const float4 x = __ldcg(reinterpret_cast<const float4*>(o.dkdv_partial + row * (2 * D) + (is_dv ? D : 0) + d));
    const int64_t* st = is_dv ? o.dv_stride : o.dk_stride;
    T* out = static_cast<T*>(is_dv ? o.dv : o.dk) + b * st[0] + int64_t(j) * st[1] + hk * st[2] + d;
    *reinterpret_cast<uint2*>(out) = make_uint2(ptx::pack2<T>(x.x, x.y), ptx::pack2<T>(x.z, x.w));
  }
}

// No griddep_wait first, unlike the library's other overlapped kernels: it would wait for the
// whole backward kernel. What this kernel reads before a counter says so (the plan, written
// before the backward kernel) is complete once it can start: that needs every backward CTA
// past its own griddep_wait. It waits for the backward kernel last, so that its completion
// still implies the kernel's.
template <class T>
__global__ void __launch_bounds__(kFinishThreads) bwd_ws_finish_kernel(const AttentionBwdParams p, const DkdvSplitSum o) {
  ptx::griddep_launch_dependents();
  const BwdWsPlan& w = p.ws;
  const int parts = bwd_ws_item_parts(p.f.D);
  __shared__ int job_range, job_index;
  int range = 0;
  for (;;) {
    if (threadIdx.x == 0) {  // the next job of the lowest range with any left
      int i = 0;
      for (; range < w.ranges; ++range) {
        i = atomicAdd(w.finish_taken + range, 1);
        if (i < finish_dq_jobs(p, range) + w.counts[range]) break;
      }
      job_range = range, job_index = i;
    }
    __syncthreads();
    const int r = job_range, i = job_index;
    __syncthreads();  // (job_range and job_index are rewritten next time round)
    if (r >= w.ranges) break;
    const int dq_jobs = finish_dq_jobs(p, r);
    if (i < dq_jobs) {
      const int bhs = p.f.B * p.f.H;
      if (threadIdx.x == 0) {
        finish_wait(w.range_done + r, w.counts[r] * parts);
        if (w.zero_done) bwd_ws_wait_dq_zeroed(p, r);  // a range no item reduces into still reads zeros
      }
      __syncthreads();
      finish_dq_tile<T>(p, r * w.tiles_per_range + i / bhs, i % bhs);
    } else {  // an item of range r: its group's keys, if r is the group's last range
      const int g = w.items[int64_t(r) * w.n_groups + (i - dq_jobs)].group;
      const BwdWsGroup grp = w.groups[g];
      const BwdWsRanges ranges = bwd_ws_group_ranges(grp, w.tiles_per_range);
      if (ranges.last != r) continue;
      if (threadIdx.x == 0) finish_wait(w.group_done + g, (ranges.last - ranges.first + 1) * parts);
      __syncthreads();
      finish_key_group<T>(p, o, g, grp.n_keys);
    }
  }
  ptx::griddep_wait();
}

}  // namespace

cudaError_t bwd_ws_finish(const AttentionBwdParams& k, const DkdvSplitSum& out, cudaStream_t stream) {
  const dim3 grid(unsigned(std::max(1, device_sm_count()) * kFinishCtasPerSm));
  const auto kernel = out.bf16 ? bwd_ws_finish_kernel<__nv_bfloat16> : bwd_ws_finish_kernel<__half>;
  return launch_kernel(k.f.overlap_previous, kernel, grid, kFinishThreads, 0, stream, k, out);
}

}  // namespace fdma::cuda
