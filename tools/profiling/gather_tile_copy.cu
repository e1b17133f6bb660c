// How fast one SM fills 128-row swizzled tiles (the wgmma layout, wgmma::sw128_offset) from
// scattered rows of an L2-resident [S, 128] bf16 matrix, with no attention around it: the
// producer warp group of the gathered forward against two ways of the copy engine.
//   cp.async   128 threads, 16 bytes a thread a copy, list indices passed by shuffles (the
//              gathering producer of attention_fwd_ws.cuh); arrival on the barrier when landed
//   row boxes  128 threads, each its row as tensor copies of one row by 64 columns (128 bytes),
//              at the row's place in the tile; a missing row (index -1) is a box past the end
//   tiles      one thread, 128 contiguous rows as two boxes of 64 columns (what dense calls do)
// One producer and one consumer warp group a CTA, a ring of 4 tiles; the consumer waits for a
// tile and hands it back (it reads nothing but a checksum of the first tiles, checked against
// the swizzled layout of the listed rows). Prints GB/s over all SMs per way.
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/gtc tools/profiling/gather_tile_copy.cu
//   /tmp/gtc
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tile_io_sm80.cuh"  // aligned_smem
#include "cuda/primitives/tma.cuh"
#include "cuda_check.h"

namespace mbar = fdma::cuda::mbar;
namespace tma = fdma::cuda::tma;
namespace ptx = fdma::cuda::ptx;

constexpr int kS = 16384, kD = 128, kRows = 128, kStages = 4, kTileBytes = kRows * kD * 2;
constexpr int kSmem = 1024 + kStages * kTileBytes + 2 * kStages * 8;

__device__ __forceinline__ int sw128(int r, int ch) { return (ch / 8) * kRows * 128 + r * 128 + (((ch % 8) ^ (r % 8)) << 4); }

// mode 0 cp.async, 1 row boxes, 2 contiguous tiles. list: [tiles][128] row indices (-1: none).
__global__ void __launch_bounds__(256, 1) fill(const __grid_constant__ CUtensorMap rows_map,
                                               const __grid_constant__ CUtensorMap tile_map, const uint16_t* m,
                                               const int* list, int tiles_per_cta, int mode, unsigned* bad) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = fdma::cuda::aligned_smem<1024>(smem_raw);
  const uint32_t base = ptx::smem_addr(smem), bars = base + kStages * kTileBytes;
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (kStages + s); };
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar::init(full(s), mode == 2 ? 1 : 128);
      mbar::init(empty(s), 128);
    }
    mbar::fence_init();
  }
  __syncthreads();
  const int first_tile = blockIdx.x * tiles_per_cta;
  if (tid < 128) {  // producer
    const int warp = tid / 32, lane = tid % 32;
    for (int t = 0; t < tiles_per_cta; ++t) {
      const int s = t % kStages;
      const uint32_t parity = ((t / kStages) & 1) ^ 1;
      const int tile = first_tile + t;
      const uint32_t dst = base + s * kTileBytes;
      if (mode == 0) {
        const int idx = list[tile * kRows + tid];
        mbar::wait(empty(s), parity);
#pragma unroll 4
        for (int i = 0; i < 16; ++i) {  // 2 rows a pass: 16 lanes of 16 bytes a row
          const int rl = i * 2 + lane / 16, ch = lane % 16;
          const int r_idx = __shfl_sync(0xffffffffu, idx, rl);
          ptx::cp_async_16(dst + sw128(warp * 32 + rl, ch), m + (r_idx >= 0 ? size_t(r_idx) * kD + ch * 8 : 0),
                           r_idx >= 0 ? 16 : 0);
        }
        mbar::arrive_on_cp_async(full(s));
      } else if (mode == 1) {
        const int idx = list[tile * kRows + tid];
        mbar::wait(empty(s), parity);
        mbar::arrive_expect_tx(full(s), kD * 2);
#pragma unroll
        for (int c = 0; c < kD / 64; ++c)
          tma::load_4d(dst + c * kRows * 128 + tid * 128, &rows_map, full(s), c * 64, idx >= 0 ? idx : kS, 0, 0);
      } else if (tid == 0) {
        mbar::wait(empty(s), parity);
        mbar::arrive_expect_tx(full(s), kTileBytes);
        const int row0 = (tile * kRows) % kS;
#pragma unroll
        for (int c = 0; c < kD / 64; ++c) tma::load_4d(dst + c * kRows * 128, &tile_map, full(s), c * 64, row0, 0, 0);
      }
    }
  } else {  // consumer
    const int ct = tid - 128;
    for (int t = 0; t < tiles_per_cta; ++t) {
      const int s = t % kStages;
      mbar::wait(full(s), (t / kStages) & 1);
      if (t < 2) {  // check the layout: row ct of the tile, every 16-byte chunk
        const int tile = first_tile + t;
        const int idx = mode == 2 ? (tile * kRows) % kS + ct : list[tile * kRows + ct];
        const uint4* tile_smem = reinterpret_cast<const uint4*>(smem + s * kTileBytes);
        for (int ch = 0; ch < kD / 8; ++ch) {
          const uint4 have = tile_smem[sw128(ct, ch) / 16];
          const uint4 want = idx >= 0 ? reinterpret_cast<const uint4*>(m + size_t(idx) * kD)[ch] : make_uint4(0, 0, 0, 0);
          if (have.x != want.x || have.y != want.y || have.z != want.z || have.w != want.w) atomicAdd(bad, 1u);
        }
      }
      mbar::arrive(empty(s));
    }
  }
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int ctas = sms * 8, tiles_per_cta = 32, tiles = ctas * tiles_per_cta;
  std::vector<uint16_t> host(size_t(kS) * kD);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t((i * 2654435761u) >> 13);
  // Each tile lists 128 distinct random rows in index order (a kept list's slice); every 8th
  // tile ends the list early (rows past it -1), as a list's last tile does.
  std::mt19937 rng(7);
  std::vector<int> list(size_t(tiles) * kRows);
  for (int t = 0; t < tiles; ++t) {
    std::vector<int> pick(kRows);
    for (int& x : pick) x = int(rng() % kS);
    std::sort(pick.begin(), pick.end());
    const int n = t % 8 == 7 ? 40 : kRows;
    for (int r = 0; r < kRows; ++r) list[size_t(t) * kRows + r] = r < n ? pick[r] : -1;
  }
  uint16_t* m = nullptr;
  int* dlist = nullptr;
  unsigned* bad = nullptr;
  CHECK(cudaMalloc(&m, host.size() * 2));
  CHECK(cudaMalloc(&dlist, list.size() * 4));
  CHECK(cudaMalloc(&bad, 4));
  CHECK(cudaMemcpy(m, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dlist, list.data(), list.size() * 4, cudaMemcpyHostToDevice));
  CUtensorMap rows_map{}, tile_map{};
  const int64_t stride[3] = {int64_t(kS) * kD, kD, kD};  // batch, seq, head (one each)
  if (!fdma::cuda::encode_rows_map(rows_map, m, true, kD, kS, 1, 1, stride, 1) ||
      !fdma::cuda::encode_rows_map(tile_map, m, true, kD, kS, 1, 1, stride, kRows)) {
    std::printf("tensor map refused\n");
    return 1;
  }
  CHECK(cudaFuncSetAttribute(fill, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const char* names[3] = {"cp.async", "row boxes", "tiles"};
  std::printf("%d SMs, %d CTAs x %d tiles of %d KB\n| way | GB/s | bytes a cycle an SM at 1.755 GHz | layout |\n|---|---|---|---|\n",
              sms, ctas, tiles_per_cta, kTileBytes / 1024);
  for (int mode = 0; mode < 3; ++mode) {
    CHECK(cudaMemset(bad, 0, 4));
    std::vector<float> ms;
    for (int rep = 0; rep < 7; ++rep) {
      CHECK(cudaEventRecord(e0));
      fill<<<ctas, 256, kSmem>>>(rows_map, tile_map, m, dlist, tiles_per_cta, mode, bad);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    unsigned nbad = 0;
    CHECK(cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost));
    const double gbs = double(tiles) * kTileBytes / (ms[3] * 1e-3) / 1e9;
    std::printf("| %s | %.0f | %.1f | %s (%u bad chunks) |\n", names[mode], gbs, gbs * 1e9 / sms / 1.755e9,
                nbad == 0 ? "ok" : "WRONG", nbad);
  }
  return 0;
}
