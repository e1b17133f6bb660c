// CHECK(call) for the standalone probes in this folder: prints the failing CUDA runtime call's
// error with its place and returns 1 from main.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(x)                                                             \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      return 1;                                                              \
    }                                                                        \
  } while (0)
