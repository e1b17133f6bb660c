// Built when CUDA is not: every pointer is host memory.
#include "core/device.hpp"

namespace fdma::detail {
bool cuda_runtime_usable() { return false; }
PointerLocation locate_pointer(const void*) { return {}; }
}  // namespace fdma::detail
