// Which kernel family runs on a device: the Hopper (wgmma) kernels need a compute capability
// 9.0 GPU and sm_90a code in this build; everything else runs the sm80 (mma.sync) kernels.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>

#include "cuda/primitives/path_switches.hpp"

namespace fdma::cuda {

constexpr int kMaxDevices = 64;  // per-device caches; devices past this re-query each call

// Whether `device` is a Hopper GPU (compute capability 9.0), cached per device.
inline bool sm90_device(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed))
    return cached[device].load(std::memory_order_relaxed) == 1;
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                  major == 9 && minor == 0;
  cudaGetLastError();  // a failed query is an answer (no), not an error for the caller
  if (device < kMaxDevices) cached[device].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

// Whether the wgmma kernels run on `device`: a Hopper GPU and a library built with sm_90a code
// for this kernel (binaryVersion is the code the device would run). FDMA_DISABLE_WGMMA=1 in the
// environment turns the path off (A/B measurements).
template <class Kernel>
inline bool wgmma_path_available(Kernel kernel, int device) {
  static const bool disabled = wgmma_disabled();
  if (disabled || !sm90_device(device)) return false;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device < kMaxDevices && cached[device].load(std::memory_order_relaxed))
    return cached[device].load(std::memory_order_relaxed) == 1;
  cudaFuncAttributes attr{};
  const bool ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
  cudaGetLastError();
  if (device < kMaxDevices) cached[device].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

}  // namespace fdma::cuda
