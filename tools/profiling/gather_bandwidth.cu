// What HBM gives a decode step's access pattern, with no attention around it: per (batch,
// KV head) row, `kept` K and V rows of `row_bytes` at sorted random positions of a [B, K, Hk, D]
// cache (the kept list of a top-w selection), against the same bytes read in position order.
// Each CTA reads its share of one row's list with 16-byte loads, several in flight a thread.
//   nvcc -O3 -arch=sm_90a -o /tmp/gather tools/profiling/gather_bandwidth.cu && /tmp/gather
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// grid (splits, rows): CTA (s, r) reads entries [s * per, (s + 1) * per) of row r's list.
__global__ void __launch_bounds__(kThreads) gather(const uint4* k, const uint4* v, const int* list, int kept, int per,
                                                   int Hk, int K, int chunks, unsigned long long* sink) {
  const int row = blockIdx.y, b = row / Hk, hk = row % Hk;
  const int begin = blockIdx.x * per, end = min(kept, begin + per);
  const int rows_per_iter = kThreads / chunks, ch = threadIdx.x % chunks;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int i0 = begin + threadIdx.x / chunks; i0 < end; i0 += rows_per_iter * kUnroll) {
    uint4 x[2 * kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * rows_per_iter;
      const int pos = i < end ? list[size_t(row) * kept + i] : -1;
      const size_t off = (size_t(b) * K + (pos < 0 ? 0 : pos)) * Hk + hk;
      x[2 * u] = pos >= 0 ? k[off * chunks + ch] : make_uint4(0, 0, 0, 0);
      x[2 * u + 1] = pos >= 0 ? v[off * chunks + ch] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 2 * kUnroll; ++u) acc.x ^= x[u].x, acc.y ^= x[u].y, acc.z ^= x[u].z, acc.w ^= x[u].w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) atomicAdd(sink, 1ull);  // keeps the loads
}

int main() {
  const int B = 64, K = 32768, Hk = 8, D = 128, kept = 2048, row_bytes = D * 2, chunks = row_bytes / 16;
  const size_t cache_bytes = size_t(B) * K * Hk * row_bytes;
  uint4 *k, *v;
  int *list_random, *list_ordered;
  unsigned long long* sink;
  CHECK(cudaMalloc(&k, cache_bytes));
  CHECK(cudaMalloc(&v, cache_bytes));
  CHECK(cudaMemset(k, 1, cache_bytes));
  CHECK(cudaMemset(v, 2, cache_bytes));
  CHECK(cudaMalloc(&list_random, size_t(B) * Hk * kept * 4));
  CHECK(cudaMalloc(&list_ordered, size_t(B) * Hk * kept * 4));
  CHECK(cudaMalloc(&sink, 8));
  std::mt19937 rng(7);
  std::vector<int> h(size_t(B) * Hk * kept), all(K), ordered(size_t(B) * Hk * kept);
  for (int r = 0; r < B * Hk; ++r) {
    for (int j = 0; j < K; ++j) all[j] = j;
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + kept);
    std::copy(all.begin(), all.begin() + kept, h.begin() + size_t(r) * kept);
    for (int j = 0; j < kept; ++j) ordered[size_t(r) * kept + j] = j;  // the row's first `kept` positions
  }
  CHECK(cudaMemcpy(list_random, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(list_ordered, ordered.data(), ordered.size() * 4, cudaMemcpyHostToDevice));
  const double bytes = double(B) * Hk * kept * row_bytes * 2;
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  std::printf("B%d K%d Hk%d row %d B, %d kept a row: %.0f MB of K/V rows\n", B, K, Hk, row_bytes, kept, bytes / 1e6);
  for (const int* list : {list_random, list_ordered})
    for (int splits : {1, 2, 4, 8}) {
      const int per = (kept + splits - 1) / splits;
      const dim3 grid(splits, B * Hk);
      for (int w = 0; w < 3; ++w) gather<<<grid, kThreads>>>(k, v, list, kept, per, Hk, K, chunks, sink);
      std::vector<float> ms;
      for (int rep = 0; rep < 9; ++rep) {
        cudaEventRecord(a);
        gather<<<grid, kThreads>>>(k, v, list, kept, per, Hk, K, chunks, sink);
        cudaEventRecord(z);
        cudaEventSynchronize(z);
        float t = 0;
        cudaEventElapsedTime(&t, a, z);
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%-22s splits %d: %.4f ms, %.0f GB/s\n", list == list_random ? "random sorted positions" : "position order",
                  splits, ms[4], bytes / ms[4] / 1e6);
    }
  CHECK(cudaGetLastError());
  return 0;
}
