// The Hopper copy primitives alone (tma.cuh, tensor_map.hpp, mbarrier.cuh), before any kernel
// uses them: one thread arms an mbarrier and copies a box of a (batch, seq, head, D) tensor
// (tensor_map.hpp's rows map: 64 columns x 128 rows a box, two boxes for D = 128) into shared
// memory, every thread waits on the barrier's phase, and the tile goes back to the host. The
// tile must be the tensor's rows in the 128-byte swizzled layout the wgmma descriptors read
// (wgmma::sw128_offset), rows past the sequence zero-filled; the copy's bytes complete the
// phase even where it filled zeros. The same barrier then takes a second copy at parity 1,
// and a per-key row map (encode_key_rows_map) copies a bias row past its end. Layouts the copy
// engine cannot read are refused on the host before the driver's encoder is called (its
// refusals would show as API errors under compute-sanitizer). Skipped off Hopper (compute
// capability 9.0).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/primitives/mbarrier.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tensor_map.hpp"
#include "cuda/primitives/tile_io_sm80.cuh"  // aligned_smem
#include "cuda/primitives/tma.cuh"

namespace {

namespace mbar = fdma::cuda::mbar;
namespace tma = fdma::cuda::tma;
constexpr int kB = 2, kS = 100, kH = 3, kD = 128, kRows = 128;
constexpr int kTileBytes = kRows * kD * 2;  // two 64-column boxes of 128 rows
constexpr int kKeys = 200, kBox = 128;      // the bias row: 200 keys, boxes of 128

struct Maps {
  CUtensorMap rows, keys;
};

// Copy 0: rows [row0, row0 + 128) of head h, batch b; copy 1 (parity 1): the next 128 rows;
// copy 2 (a second barrier): keys [key0, key0 + 128) of the bias row of (bias_head, b).
__global__ void tma_probe(const __grid_constant__ Maps maps, int row0, int h, int b, int key0, int bias_head,
                          uint16_t* out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = fdma::cuda::aligned_smem<1024>(smem_raw);  // the swizzle's alignment
  const uint32_t tile = fdma::cuda::ptx::smem_addr(smem), keys = tile + kTileBytes;
  const uint32_t bar = keys + kBox * 4, key_bar = bar + 8;
  if (threadIdx.x == 0) {
    mbar::init(bar, 1);
    mbar::init(key_bar, 1);
    mbar::fence_init();
  }
  __syncthreads();
  for (int copy = 0; copy < 2; ++copy) {
    if (threadIdx.x == 0) {
      mbar::arrive_expect_tx(bar, kTileBytes);
      for (int c = 0; c < kD / 64; ++c)
        tma::load_4d(tile + c * kRows * 128, &maps.rows, bar, c * 64, row0 + copy * kRows, h, b);
    }
    mbar::wait(bar, copy);  // phase `copy` completes when the bytes land
    const uint16_t* src = reinterpret_cast<const uint16_t*>(smem);
    for (int i = threadIdx.x; i < kTileBytes / 2; i += blockDim.x) out[copy * kTileBytes / 2 + i] = src[i];
    __syncthreads();  // everyone has read the tile before the next copy overwrites it
  }
  if (threadIdx.x == 0) {
    mbar::arrive_expect_tx(key_bar, kBox * 4);
    tma::load_3d(keys, &maps.keys, key_bar, key0, bias_head, b);
  }
  mbar::wait(key_bar, 0);
  const uint32_t* k32 = reinterpret_cast<const uint32_t*>(smem + kTileBytes);
  for (int i = threadIdx.x; i < kBox; i += blockDim.x) reinterpret_cast<uint32_t*>(out + kTileBytes)[i] = k32[i];
}

bool hopper_available() {
  int n = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

// The swizzled byte offset of 16-byte chunk ch of row r (wgmma::sw128_offset, on the host).
int sw128(int r, int ch) { return (ch / 8) * kRows * 128 + r * 128 + (((ch % 8) ^ (r % 8)) << 4); }

}  // namespace

TEST(TmaGpu, BoxesLandSwizzledZeroFilledAndCompletePhases) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU: TMA tests skipped";
  // q-like tensor [B, S, H, D] with its batch stride padded (strides in elements: batch, seq, head).
  const int64_t stride[3] = {int64_t(kS) * kH * kD + 64, kH * kD, kD};
  std::vector<uint16_t> host(size_t(stride[0]) * kB);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t((i * 2654435761u) >> 16);
  // A float32 bias [B, Hb, 1, K] with Hb = 2.
  const int kHb = 2;
  std::vector<float> bias(size_t(kB) * kHb * kKeys);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = float(i) + 0.5f;

  uint16_t *dev = nullptr, *out = nullptr;
  float* dbias = nullptr;
  const size_t out_elems = 2 * kTileBytes / 2 + 2 * kBox;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dbias, bias.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, out_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dbias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);

  Maps maps{};
  ASSERT_TRUE(fdma::cuda::encode_rows_map(maps.rows, dev, true, kD, kS, kH, kB, stride, kRows));
  ASSERT_TRUE(fdma::cuda::encode_key_rows_map(maps.keys, dbias, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kKeys, kHb, kB,
                                              int64_t(kHb) * kKeys, kKeys, kBox));
  const int row0 = -30, h = 1, b = 1, key0 = 128, bias_head = 1;  // rows -30..225: both ends out of range
  const int smem = fdma::cuda::align_slack<1024>() + kTileBytes + kBox * 4 + 16;
  ASSERT_EQ(cudaFuncSetAttribute(tma_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  tma_probe<<<1, 128, smem>>>(maps, row0, h, b, key0, bias_head, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(out_elems);
  ASSERT_EQ(cudaMemcpy(got.data(), out, out_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);

  int bad = 0;
  for (int copy = 0; copy < 2; ++copy)
    for (int r = 0; r < kRows; ++r)
      for (int ch = 0; ch < kD / 8; ++ch)
        for (int e = 0; e < 8; ++e) {
          const int row = row0 + copy * kRows + r, col = ch * 8 + e;
          const uint16_t want = row >= 0 && row < kS ? host[b * stride[0] + row * stride[1] + h * stride[2] + col] : 0;
          const uint16_t have = got[copy * kTileBytes / 2 + sw128(r, ch) / 2 + e];
          if (have != want && bad++ < 5) ADD_FAILURE() << "copy " << copy << " row " << r << " col " << col;
        }
  EXPECT_EQ(bad, 0);
  const float* keys = reinterpret_cast<const float*>(got.data() + kTileBytes);
  for (int i = 0; i < kBox; ++i) {
    const int key = key0 + i;
    const float want = key < kKeys ? bias[(size_t(b) * kHb + bias_head) * kKeys + key] : 0.f;
    EXPECT_EQ(keys[i], want) << "key " << key;
  }
  cudaFree(dev);
  cudaFree(dbias);
  cudaFree(out);
}

TEST(TmaGpu, EncoderRefusesWhatTheCopyEngineCannotRead) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU: TMA tests skipped";
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
  CUtensorMap map{};
  const int64_t odd[3] = {kS * kH * kD, kH * kD + 4, kD};  // a row stride of 8 bytes past 16-byte alignment
  EXPECT_FALSE(fdma::cuda::encode_rows_map(map, dev, true, kD, kS, kH, 1 + 1, odd, kRows));
  const int64_t ok[3] = {kS * kH * kD, kH * kD, kD};
  EXPECT_FALSE(fdma::cuda::encode_rows_map(map, static_cast<char*>(dev) + 8, true, kD, kS, kH, 2, ok, kRows));
  EXPECT_TRUE(fdma::cuda::encode_rows_map(map, dev, true, kD, kS, kH, 2, ok, kRows));
  cudaFree(dev);
}
