// Host helpers of the CUDA backend: CUDA errors as fdma errors, the dtypes, head dims and row
// alignment the kernels need, and a guard that runs a call on the device holding its tensors and restores the
// caller's current device afterwards, so multi-GPU callers never see their device changed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "core/problem.hpp"

namespace fdma::cuda {

inline void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) detail::fail(Status::device, what + ": " + cudaGetErrorString(err));
}

// cp.async moves 16-byte chunks of rows: a [.., .., .., D] tensor's rows must start on 16-byte
// boundaries. `op` names the operation in the error ("attention", ...).
inline void require_rows_aligned(const std::string& op, const fdma_tensor& t, const char* name) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d < 3; ++d) ok &= t.shape[d] == 1 || t.stride[d] % 8 == 0;
  if (!ok)
    detail::fail(Status::unsupported, op + " (CUDA): " + name +
                                          " must be 16-byte aligned with strides that are multiples of 8 elements");
}

// What the attention kernels take: float16 or bfloat16 q, head dims that are multiples of 8
// up to 256. `op` names the operation in the error.
inline void require_kernel_inputs(const std::string& op, DType dtype, int64_t D) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    detail::fail(Status::unsupported, op + " (CUDA): q has dtype " + dtype_name(dtype) +
                                          "; the GPU takes float16 or bfloat16");
  if (D % 8 != 0)
    detail::fail(Status::unsupported,
                 op + " (CUDA): head dim D = " + std::to_string(D) + " must be a multiple of 8 on the GPU");
  if (D > 256) detail::fail(Status::unsupported, op + " (CUDA): head dims above 256 have no kernel");
}

// A CUDA call's workspace: device memory, 16-byte aligned, since the pieces carved from it lie
// at multiples of 256 bytes from its start and the kernels move them in 16-byte vectors and
// bulk copies (cudaMalloc and PyTorch's allocator give 256). `op` names the operation and
// backend in the error ("dynamic_mask_attention forward (CUDA)").
inline void require_device_workspace(const std::string& op, const void* ws) {
  if (!detail::locate_pointer(ws).device)
    detail::fail(Status::workspace, op + ": the workspace must be CUDA device memory");
  if (reinterpret_cast<uintptr_t>(ws) % 16 != 0)
    detail::fail(Status::workspace, op + ": the workspace must be 16-byte aligned");
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
