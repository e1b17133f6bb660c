// FDMA_HOST_DEVICE: small arithmetic that kernels run and host tests check with the same code
// (compiled by nvcc for both sides, by the host compiler alone in the C++ tests).
#pragma once

#if defined(__CUDACC__)
#define FDMA_HOST_DEVICE __host__ __device__
#else
#define FDMA_HOST_DEVICE
#endif
