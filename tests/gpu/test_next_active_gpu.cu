// The next-active table alone (next_active.cuh), before the attention kernels use it: one CTA
// builds next[0..n] from a random pattern of active tiles, twice in a row in the same shared
// memory (as the dq kernel does per (batch, head)), and the host checks every entry against
// a plain scan. Skipped where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/attention/next_active.cuh"

namespace {

bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

// Two tables from patterns a and b (n tiles each); out gets both, n + 1 entries each.
__global__ void next_active_probe(const uint8_t* a, const uint8_t* b, int n, int16_t* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  int16_t* table = reinterpret_cast<int16_t*>(smem);
  const int tid = threadIdx.x;
  for (int pass = 0; pass < 2; ++pass) {
    const uint8_t* pattern = pass ? b : a;
    fdma::cuda::build_next_active(table, n, [&](int nb) { return pattern[nb] != 0; }, tid, int(blockDim.x));
    for (int i = tid; i <= n; i += blockDim.x) out[pass * (n + 1) + i] = table[i];
  }
}

std::vector<int16_t> plain_next(const std::vector<uint8_t>& active) {
  const int n = int(active.size());
  std::vector<int16_t> next(n + 1, int16_t(n));
  for (int nb = n - 1; nb >= 0; --nb) next[nb] = active[nb] ? int16_t(nb) : next[nb + 1];
  return next;
}

TEST(NextActiveGpu, TableMatchesAPlainScan) {
  if (!gpu_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped";
  std::mt19937_64 rng(42);
  for (int threads : {128, 256, 384})
    for (int n : {0, 1, 5, 31, 32, 33, 127, 128, 129, 1000, 4096})
      for (double density : {0.0, 1.0 / 64, 1.0 / 8, 0.5, 1.0}) {
        if (n > 32 * threads) continue;
        std::bernoulli_distribution on(density);
        std::vector<uint8_t> a(n), b(n);
        for (auto& x : a) x = on(rng);
        for (auto& x : b) x = on(rng);
        if (n > 0) b[n - 1] = 1;  // the second pass differs at the end at least
        uint8_t *da = nullptr, *db = nullptr;
        int16_t* dout = nullptr;
        ASSERT_EQ(cudaMalloc(&da, n + 1), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&db, n + 1), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dout, 2 * (n + 1) * sizeof(int16_t)), cudaSuccess);
        cudaMemcpy(da, a.data(), n, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), n, cudaMemcpyHostToDevice);
        cudaMemset(dout, 0xFF, 2 * (n + 1) * sizeof(int16_t));
        const int smem = fdma::cuda::next_active_table_bytes(n);
        next_active_probe<<<1, threads, smem>>>(da, db, n, dout);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int16_t> got(2 * (n + 1));
        cudaMemcpy(got.data(), dout, got.size() * sizeof(int16_t), cudaMemcpyDeviceToHost);
        cudaFree(da), cudaFree(db), cudaFree(dout);
        const auto want_a = plain_next(a), want_b = plain_next(b);
        for (int i = 0; i <= n; ++i) {
          ASSERT_EQ(got[i], want_a[i]) << "threads " << threads << " n " << n << " density " << density << " entry " << i;
          ASSERT_EQ(got[n + 1 + i], want_b[i]) << "second pass: threads " << threads << " n " << n << " entry " << i;
        }
      }
}

}  // namespace
