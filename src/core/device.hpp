// Where a pointer lives. Implemented by src/cuda/primitives/device_runtime.cu when CUDA is built and
// by device_none.cpp otherwise, so the validation layer can refuse device memory handed to
// the CPU (which would crash) and mixed devices handed to the GPU.
#pragma once

namespace fdma::detail {

struct PointerLocation {
  bool device = false;  // true: CUDA device memory (not host-accessible)
  int ordinal = -1;     // the CUDA device for device memory
};

bool cuda_runtime_usable();
PointerLocation locate_pointer(const void* ptr);

}  // namespace fdma::detail
