// CUDA runtime queries used by validation and dispatch. Probing is cheap after the first
// call: whether a usable GPU exists is decided once per process.
#include <cuda_runtime.h>

#include <mutex>

#include "core/device.hpp"

namespace fdma::detail {

bool cuda_runtime_usable() {
  static const bool usable = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: clear the sticky-free error and say no
      return false;
    }
    return count > 0;
  }();
  return usable;
}

PointerLocation locate_pointer(const void* ptr) {
  PointerLocation loc;
  if (ptr == nullptr || !cuda_runtime_usable()) return loc;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return loc;
  }
  // Managed memory is host-accessible, so the CPU may read it; plain device memory is not.
  if (attr.type == cudaMemoryTypeDevice) {
    loc.device = true;
    loc.ordinal = attr.device;
  }
  return loc;
}

}  // namespace fdma::detail
