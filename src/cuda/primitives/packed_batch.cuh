// Packed variable-length batches (fdma.h, "varlen") on the device: which sequence a packed row
// belongs to, from the offsets the kernels read (no host copy of cu_seqlens).
#pragma once

#include <cstdint>

namespace fdma::cuda {

// The last s in [0, num_seqs) with cu[s] <= x: row x's sequence. For offsets that are no
// prefix sums, still some s in [0, num_seqs), so cu[s] and cu[s + 1] stay readable.
__device__ __forceinline__ int sequence_of(const int32_t* cu, int num_seqs, int x) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace fdma::cuda
