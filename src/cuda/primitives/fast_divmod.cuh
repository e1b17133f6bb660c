// Division by a runtime divisor fixed for a whole kernel (or CTA) as a multiply and a shift:
// a loop's `it / n` compiles to about 20 instructions around MUFU.RCP per step, and showed in
// the dk/dv kernel's stall samples (docs/performance.md, "key lists"). Round-up multiplier (Granlund and
// Montgomery): with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (umulhi(n, m) + n) >> l, exact for 0 <= n < 2^31 (tests/test_fast_divmod.cpp).
#pragma once

#include <cstdint>

#include "cuda/primitives/host_device.cuh"

namespace fdma::cuda {

struct FastDivmod {
  int divisor = 1;
  uint32_t multiplier = 1;
  int shift = 0;

  FDMA_HOST_DEVICE explicit FastDivmod(int d) : divisor(d) {
    while ((int64_t(1) << shift) < d) ++shift;
    multiplier = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d)) / uint64_t(d) + 1);
  }
  // n in [0, 2^31).
  FDMA_HOST_DEVICE int div(int n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(uint32_t(n), multiplier);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32);
#endif
    return int((hi + uint32_t(n)) >> shift);
  }
  FDMA_HOST_DEVICE int mod(int n) const { return n - div(n) * divisor; }
};

}  // namespace fdma::cuda
