// Kernel attributes set, and device facts queried, once per device instead of on every call
// (attributes are per device and context). Devices past kMaxDevices redo the work each call.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cuda/primitives/arch_dispatch.cuh"  // kMaxDevices

namespace fdma::cuda {

// Runs `set` (a kernel's launch attributes) once per device, the current one; done holds the
// caller's per-device flags.
template <class F>
cudaError_t once_per_device(std::atomic<bool> (&done)[kMaxDevices], F&& set) {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (device < kMaxDevices && done[device].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t err = set();
  if (err == cudaSuccess && device < kMaxDevices) done[device].store(true, std::memory_order_release);
  return err;
}

// compute() (an int >= 0, the current device's) once per device, kept in cache as value + 1.
template <class F>
int cached_per_device(std::atomic<int> (&cache)[kMaxDevices], F&& compute) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return compute();
  }
  if (device < kMaxDevices)
    if (const int c = cache[device].load(std::memory_order_relaxed)) return c - 1;
  const int v = compute();
  if (device < kMaxDevices) cache[device].store(v + 1, std::memory_order_relaxed);
  return v;
}

// The current device's attribute `attr`, 0 where the query fails.
inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return value;
}

// The current device's SM count, opt-in shared memory per block and L2 bytes, queried once per
// device.
inline int device_sm_count() {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] { return device_attribute(cudaDevAttrMultiProcessorCount); });
}
inline int device_smem_optin() {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); });
}
inline int device_l2_bytes() {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, [] { return device_attribute(cudaDevAttrL2CacheSize); });
}

// Raises a kernel's shared-memory limit once per device and size, not per call (the caller's
// device guard has made the tensors' device current); granted holds the largest size granted.
template <class Kernel>
cudaError_t grant_smem_once(Kernel kernel, int smem, std::atomic<int>* granted, int device) {
  std::atomic<int>* seen_for_device = granted ? &granted[device] : nullptr;
  if (seen_for_device && smem <= seen_for_device->load(std::memory_order_relaxed)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess || !seen_for_device) return err;
  int seen = seen_for_device->load(std::memory_order_relaxed);
  while (smem > seen && !seen_for_device->compare_exchange_weak(seen, smem)) {
  }
  return cudaSuccess;
}

// The same for the current device, with the kernel's own per-device record.
template <class Kernel>
cudaError_t grant_smem_once(Kernel kernel, int smem, std::atomic<int> (&granted)[kMaxDevices]) {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  return grant_smem_once(kernel, smem, device < kMaxDevices ? granted : nullptr, device);
}

}  // namespace fdma::cuda
