// Filling a strided view with 0 or -inf (what empty problems return), on either backend.
#pragma once

#include "fdma/fdma.hpp"

namespace fdma::detail {

void fill(const fdma_tensor& t, bool minus_inf, Backend backend, void* stream);

}  // namespace fdma::detail
