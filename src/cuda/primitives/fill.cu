// One value into every element of a strided device tensor: the outputs of a problem with no
// batch, query or key (src/core/api.cpp), which runs no kernel of its own.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_backend.hpp"
#include "cuda/primitives/device_guard.hpp"

namespace fdma::cuda {
namespace {

struct FillArgs {
  char* data;
  int64_t shape[FDMA_MAX_DIMS], stride[FDMA_MAX_DIMS];  // stride in elements; unused dims 1, 0
  int64_t n;
  uint64_t pattern;
  int bytes;
};

__global__ void fill_kernel(FillArgs a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, off = 0;
    for (int d = FDMA_MAX_DIMS - 1; d >= 0; --d) {
      off += (rest % a.shape[d]) * a.stride[d];
      rest /= a.shape[d];
    }
    char* p = a.data + off * a.bytes;
    switch (a.bytes) {
      case 1: *reinterpret_cast<uint8_t*>(p) = uint8_t(a.pattern); break;
      case 2: *reinterpret_cast<uint16_t*>(p) = uint16_t(a.pattern); break;
      case 4: *reinterpret_cast<uint32_t*>(p) = uint32_t(a.pattern); break;
      default: *reinterpret_cast<uint64_t*>(p) = a.pattern; break;
    }
  }
}

}  // namespace

void fill(const fdma_tensor& t, uint64_t pattern, void* stream) {
  FillArgs a{};
  a.data = static_cast<char*>(t.data);
  a.n = 1;
  for (int d = 0; d < FDMA_MAX_DIMS; ++d) {
    a.shape[d] = d < t.ndim ? t.shape[d] : 1;
    a.stride[d] = d < t.ndim ? t.stride[d] : 0;
    a.n *= a.shape[d];
  }
  if (a.n == 0) return;
  a.pattern = pattern;
  a.bytes = int(dtype_size(static_cast<DType>(t.dtype)));
  DeviceGuard guard(t.data);
  const int64_t blocks = (a.n + 255) / 256;
  fill_kernel<<<unsigned(blocks < 1024 ? blocks : 1024), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
  check_cuda(cudaGetLastError(), "fill");
}

}  // namespace fdma::cuda
