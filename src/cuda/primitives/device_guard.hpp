// Runs a CUDA call on the device that holds its tensors and restores the caller's current
// device afterwards, so multi-GPU callers never see their device changed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/problem.hpp"

namespace fdma::cuda {

inline void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) detail::fail(Status::device, what + ": " + cudaGetErrorString(err));
}

class DeviceGuard {
 public:
  // The device of `ptr` (device memory) becomes current for the guard's lifetime.
  explicit DeviceGuard(const void* ptr) {
    cudaPointerAttributes attr{};
    check_cuda(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes");
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    changed_ = attr.device != previous_;
    if (changed_) check_cuda(cudaSetDevice(attr.device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace fdma::cuda
