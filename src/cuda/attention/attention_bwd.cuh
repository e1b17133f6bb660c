// attention backward, with the matmuls as a policy: BwdMmaSm80 (mma.sync, any sm80+ GPU) or
// BwdMmaSm90 (wgmma, Hopper, D = 64 and 128), chosen per launch. Two kernels, neither with
// atomics, so the gradients are bitwise reproducible on every run (`deterministic` is free):
//   dq kernel   (rows):    one CTA per 64 query rows of a (batch, head); walks the key tiles,
//                          recomputes P from lse, and owns dq (and dbias when the bias has a
//                          query dim);
//   dk/dv kernel (columns): one CTA per 64 keys of a (batch, KV head); walks the G query heads
//                          of the group and their query tiles (two warp groups taking turns),
//                          so the GQA sum of dk/dv stays on chip; owns dbias when the bias
//                          broadcasts over queries.
// Both recompute S = QK^T and dP = dO V^T (seven matmuls against the five of a single-kernel
// backward with dq atomics): the price of determinism without a B*H*Sq*D fp32 temporary.
// A call that does not ask for determinism takes the fused dq where it applies (sm_90a tiles,
// keys not gathered, no dbias with a query dim, the same launch plan as the two kernels';
// AttentionBwdParams::dq_acc): no dq kernel, the dk/dv kernel reduces each step's dS K into the
// temporary with bulk reductions, and a convert kernel writes dq. The warp-specialized kernels
// take such calls: attention_bwd_ws.cuh at D 64 and 128, dense, masked (no bias), biased (a
// bias with a query dim and no mask; its dbias where each dS is one element, which the dq
// kernel otherwise owns), masked_biased (both) or gathered (given its fp32 dk/dv rows and work list:
// dynamic_mask_attention, dma/gathered_backward.cu), attention_bwd_ws_d256.cuh at D 256, dense,
// masked (no bias) or gathered.
// attention_bwd_aux.cu holds the small kernels around them (delta/lse2, dbias finish, dq convert).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/attention/attention_bwd_aux.hpp"
#include "cuda/attention/attention_bwd_dkdv.cuh"
#include "cuda/attention/attention_bwd_dq.cuh"
#include "cuda/attention/attention_bwd_ws.cuh"
#include "cuda/attention/attention_bwd_ws_d256.cuh"

namespace fdma::cuda {

// Raises a kernel's dynamic shared-memory limit when a launch needs more than the default.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes) {
  return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
                           : cudaSuccess;
}

template <class T, int kHeadDim, class Mma>
cudaError_t launch_attention_bwd_path(const AttentionBwdParams& params, int device, cudaStream_t stream) {
  using Dq = BwdDqTile<Mma, kHeadDim>;
  using Dkdv = BwdDkdvTile<Mma, kHeadDim>;
  const bool gather = params.f.lists.keys != nullptr;
  auto dq_kernel = gather ? attention_bwd_dq_kernel<T, kHeadDim, true, Mma> : attention_bwd_dq_kernel<T, kHeadDim, false, Mma>;
  auto dkdv_kernel =
      gather ? attention_bwd_dkdv_kernel<T, kHeadDim, true, Mma> : attention_bwd_dkdv_kernel<T, kHeadDim, false, Mma>;
  auto fused_kernel = dkdv_kernel;
  if constexpr (Mma::kHopperOnly) fused_kernel = attention_bwd_dkdv_kernel<T, kHeadDim, false, Mma, true>;
  int max_smem = 0;
  cudaError_t err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  // One path's launch plan: warp groups per dk/dv CTA (bwd_dkdv_groups, or FDMA_DKDV_GROUPS=1
  // or 2 for A/B runs and tests) and the params with the tiles that fit in shared memory (those
  // that do not are read per score instead: the next-active table dropped first, then the
  // bias's tiles (larger), then the mask's).
  const int forced_groups = forced_dkdv_groups();
  const bool forced = forced_groups != 0;
  struct Plan {
    int groups;
    AttentionBwdParams p;
    int dkdv_smem;
  };
  auto plan_path = [&](bool fused, Plan& plan) {
    plan.p = params;
    AttentionFwdParams& pf = plan.p.f;
    plan.groups = forced ? forced_groups : bwd_dkdv_groups(kHeadDim, Mma::kHopperOnly, gather, pf.tile_active != nullptr);
    auto smem = [&](int groups) { return fused ? Dkdv::fused_smem_bytes(groups, pf) : Dkdv::smem_bytes(groups, pf); };
    auto fits = [&] { return (fused || Dq::smem_bytes(pf) <= max_smem) && smem(plan.groups) <= max_smem; };
    auto shrink = [&] {
      if (!fits()) pf.next_active_table = false;
      if (!fits()) pf.bias_tiled = false;
      if (!fits()) pf.mask_tiled = false;
    };
    shrink();
    if (plan.groups == 1 && !forced) {  // one group pays only where two CTAs share an SM
      const auto kernel = fused ? fused_kernel : dkdv_kernel;
      int per_sm = 0;
      cudaError_t e = allow_smem(kernel, smem(1));
      if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBwdThreads, smem(1));
      if (e != cudaSuccess) return e;
      if (per_sm < 2) plan.groups = 2, shrink();
    }
    plan.dkdv_smem = smem(plan.groups);
    return cudaSuccess;
  };
  Plan two{}, fused_plan{};
  err = plan_path(false, two);
  if (err != cudaSuccess) return err;
  // The fused dq where the caller gave its temporary (params.dq_acc) and these tiles have it,
  // and only where its larger shared memory keeps the two kernels' plan: the same warp groups
  // and the same tiles on chip. (With a block mask at D = 128 it would take two groups and
  // read the mask per score: 2.5-2.7x slower than the two kernels, docs/performance.md.)
  // Otherwise the two kernels run and the temporary goes unused.
  bool fused = Mma::kHopperOnly && !gather && params.dq_acc && params.dbias_owner != DbiasOwner::rows;
  if (fused) {
    if (plan_path(true, fused_plan) != cudaSuccess) {  // its shared memory refused: the two kernels
      cudaGetLastError();
      fused = false;
    } else {
      const AttentionFwdParams &a = two.p.f, &b = fused_plan.p.f;
      fused = fused_plan.groups == two.groups && a.next_active_table == b.next_active_table &&
              a.bias_tiled == b.bias_tiled && a.mask_tiled == b.mask_tiled;
    }
  }
  const Plan& plan = fused ? fused_plan : two;
  if (fused) dkdv_kernel = fused_kernel;
  const AttentionBwdParams& p = plan.p;
  const int dkdv_groups = plan.groups;
  const AttentionFwdParams& f = p.f;
  if (gather && p.dbias_owner != DbiasOwner::none) return cudaErrorInvalidValue;  // the gathered kernels have no dbias
  const int dq_smem = Dq::smem_bytes(f), dkdv_smem = plan.dkdv_smem;
  err = fused ? cudaSuccess : allow_smem(dq_kernel, dq_smem);
  if (err == cudaSuccess) err = allow_smem(dkdv_kernel, dkdv_smem);
  if (err != cudaSuccess) return err;
  if (!fused) {
    const dim3 dq_grid((f.Sq + Dq::kBlockM - 1) / Dq::kBlockM, f.H / p.rows_heads_per_block,
                       f.B / p.rows_batches_per_block);
    err = launch_kernel(f.overlap_previous, dq_kernel, dq_grid, kBwdThreads, dq_smem, stream, p);
    if (err != cudaSuccess) return err;
  }
  // Dynamic-mask mode: kBwdWindow / 64 groups per window of kept keys (at most Sk of them).
  const int dkdv_x = f.lists.keys ? (f.Sk + kBwdWindow - 1) / kBwdWindow * (kBwdWindow / Dkdv::kBlockN)
                                  : (f.Sk + Dkdv::kBlockN - 1) / Dkdv::kBlockN;
  if (!gather && p.dkdv_splits > 1) return cudaErrorInvalidValue;  // only gathered walks split
  const dim3 dkdv_grid(dkdv_x, f.Hk * Dkdv::kChunks, f.B * std::max(1, p.dkdv_splits));
  err = launch_kernel(f.overlap_previous, dkdv_kernel, dkdv_grid, dkdv_groups * kBwdThreads, dkdv_smem, stream, p);
  if (err != cudaSuccess || !fused) return err;
  return launch_bwd_dq_convert<T>(p, kHeadDim, stream);
}

// Whether the warp-specialized backward takes p on the current device (maps filled). With key
// lists it writes fp32 dk/dv rows where the other kernels write dk and dv, so the caller asks
// first (gathered_backward.cu).
template <class T, int kHeadDim>
bool attention_bwd_ws_takes(const AttentionBwdParams& p, int device, BwdTensorMaps& maps) {
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    return p.dq_acc && wgmma_path_available(bwd_ws_kernel_of<T, kHeadDim>(bwd_ws_kind(p.f)), device) &&
           attention_bwd_ws_applies<T, kHeadDim>(p, maps);
  } else if constexpr (kHeadDim == 256) {
    return wgmma_path_available(bwd_ws256_kernel_of<T>(p.f), device) && attention_bwd_ws256_applies<T>(p, maps);
  } else {
    return false;
  }
}

template <class T, int kHeadDim>
bool attention_bwd_ws_takes(const AttentionBwdParams& p) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  BwdTensorMaps maps{};
  return attention_bwd_ws_takes<T, kHeadDim>(p, device, maps);
}

// On Hopper the warp-specialized kernel for the fused dq at D = 64, 128 and 256 where it
// applies, the wgmma kernels for D = 64 and 128 (arch_dispatch.cuh); the mma.sync kernels elsewhere.
template <class T, int kHeadDim>
cudaError_t launch_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  // The warp-specialized kernel where it applies (attention_bwd_ws.cuh; at D = 256 its own,
  // attention_bwd_ws_d256.cuh).
  if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
    BwdTensorMaps maps{};
    if (attention_bwd_ws_takes<T, kHeadDim>(p, device, maps)) {
      if constexpr (kHeadDim == 256)
        return launch_attention_bwd_ws256<T>(p, maps, device, stream);
      else
        return launch_attention_bwd_ws<T, kHeadDim>(p, maps, device, stream);
    }
    // Key lists with fp32 rows asked for: only that kernel writes them (the caller asked first).
    if (p.f.lists.keys && p.dq_acc) return cudaErrorNotSupported;
  }
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    using Sm90 = BwdMmaSm90<T, kHeadDim, kBwdThreads>;
    if (wgmma_path_available(attention_bwd_dkdv_kernel<T, kHeadDim, false, Sm90>, device))
      return launch_attention_bwd_path<T, kHeadDim, Sm90>(p, device, stream);
  }
  return launch_attention_bwd_path<T, kHeadDim, BwdMmaSm80<T, kHeadDim, kBwdThreads>>(p, device, stream);
}

}  // namespace fdma::cuda

#define FDMA_INSTANTIATE_ATTENTION_BWD(T, HD)                                                                   \
  template cudaError_t fdma::cuda::launch_attention_bwd<T, HD>(const fdma::cuda::AttentionBwdParams&, cudaStream_t); \
  template bool fdma::cuda::attention_bwd_ws_takes<T, HD>(const fdma::cuda::AttentionBwdParams&);
