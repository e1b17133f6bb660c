// The Hopper primitives alone (wgmma.cuh, tile_io_sm90.cuh), before any kernel uses them:
// one warpgroup loads A [64 x 128] and B [128 x 128] into swizzled tiles, computes
// S = A B^T with chained K-major wgmmas, then O = P V with P = S rounded to bf16 from
// registers and V read N-major, exactly as the forward kernel's policy does. Compared with a
// double-precision product on the host. Also with S over the first 32 or 64 rows of B only
// (and P V over those keys), as the forward's narrow last tile reads its 128-row tiles. And
// the fused backward's dq step (bwd_mma_sm90.cuh): dS^T from registers stored transposed, dS K
// with K read N-major, staged and added into global memory by bulk reductions, twice. And one
// wgmma over 16-column slices in the 32-byte swizzle (sw32_offset, desc_k_major_sw32), A from
// the second 64 rows of its block, as the gathered forward's folded terms. Skipped off Hopper.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/attention/bwd_mma_sm90.cuh"
#include "cuda/primitives/ptx.cuh"
#include "cuda/primitives/tile_io_sm90.cuh"
#include "cuda/primitives/tma.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace {

using fdma::cuda::ptx::pack2;
namespace wg = fdma::cuda::wgmma;
using T = __nv_bfloat16;
constexpr int kD = 128, kN = 128, kM = 64;

// kNS: the keys S covers (the first kNS rows of B and of V).
template <int kNS>
__global__ void wgmma_probe(const T* a, const T* b, const T* v, float* s_out, float* o_out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_a = fdma::cuda::ptx::smem_addr(smem);
  const uint32_t s_b = s_a + wg::sw128_tile_bytes(kM, kD), s_v = s_b + wg::sw128_tile_bytes(kN, kD);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  fdma::cuda::load_rows_sw128_async<128, kD, kM>(s_a, a, kD, 0, kM, kD, tid);
  fdma::cuda::load_rows_sw128_async<128, kD, kN>(s_b, b, kD, 0, kN, kD, tid);
  fdma::cuda::load_rows_sw128_async<128, kD, kN>(s_v, v, kD, 0, kN, kD, tid);
  fdma::cuda::ptx::cp_async_commit();
  fdma::cuda::ptx::cp_async_wait<0>();
  wg::fence_proxy_async_smem();
  __syncthreads();

  float s[kNS / 8][4];
  wg::fence();
  for (int kk = 0; kk < kD / 16; ++kk)
    wg::mma_ss<T, kNS>(s, wg::desc_k_major(s_a + (kk / 4) * kM * 128 + (kk % 4) * 32),
                      wg::desc_k_major(s_b + (kk / 4) * kN * 128 + (kk % 4) * 32), kk > 0);
  wg::commit_group();
  wg::wait_group<0>();
  wg::fence_operands(s);

  float o[kD / 8][4] = {};
  uint32_t p[kNS / 16][4];
  for (int kk = 0; kk < kNS / 16; ++kk) {
    p[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  wg::fence();
  for (int kk = 0; kk < kNS / 16; ++kk) wg::mma_rs_n_major<T, kD>(o, p[kk], wg::desc_n_major(s_v + kk * 16 * 128, kN * 128), 1);
  wg::commit_group();
  wg::wait_group<0>();
  wg::fence_operands(o);

  for (int nt = 0; nt < kD / 8; ++nt)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + g + 8 * (e >> 1), col = 8 * nt + 2 * t + (e & 1);
      if (nt < kNS / 8) s_out[row * kNS + col] = s[nt][e];
      o_out[row * kD + col] = o[nt][e];
    }
}

// The fused dq's step alone: dst [64 keys][64 queries] fp32 into the accumulator layout,
// store_ds_t, ds_times_k over both 64-column blocks of K [64 keys][128], each block staged by
// store_dq_block and added into dq (dq_acc's tile layout, 64 queries x 128) by bulk reductions.
__global__ void ds_k_probe(const float* dst_in, const T* k, float* dq) {
  using Mma = fdma::cuda::BwdMmaSm90<T, kD, 128>;
  namespace fc = fdma::cuda;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_k = fc::ptx::smem_addr(smem);
  unsigned char* ds = smem + wg::sw128_tile_bytes(64, kD);
  float* stage = reinterpret_cast<float*>(ds + 64 * 64 * 2);  // 4 tiles of [32][64] fp32
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  fc::load_rows_sw128_async<128, kD, 64>(s_k, k, kD, 0, 64, kD, tid);
  fc::ptx::cp_async_commit();
  fc::ptx::cp_async_wait<0>();
  float dst[8][4];
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e) dst[nt][e] = dst_in[(16 * warp + g + 8 * (e >> 1)) * 64 + 8 * nt + 2 * t + (e & 1)];
  fc::store_ds_t<T>(ds, dst, warp, lane);
  wg::fence_proxy_async_smem();
  __syncthreads();
  constexpr int kTile = fc::kDqAccTileRows * fc::kDqAccTileCols;
  for (int block = 0; block < kD / 64; ++block) {
    float acc[8][4];
    Mma::ds_times_k(acc, fc::ptx::smem_addr(ds), s_k, block);
    fc::store_dq_block(fc::ptx::smem_addr(stage + 2 * block * kTile), acc, warp, lane);
  }
  wg::fence_proxy_async_smem();
  __syncthreads();
  if (tid == 0) {
    for (int block = 0; block < kD / 64; ++block)
      for (int half = 0; half < 2; ++half)
        fc::tma::reduce_add_f32(dq + fc::dq_acc_offset(0, 32 * half, 64 * block, 64, kD),
                                fc::ptx::smem_addr(stage + (2 * block + half) * kTile), fc::kDqAccTileBytes);
    fc::tma::bulk_commit_group();
    fc::tma::bulk_wait_group<0>();
  }
}

// S = A[64:128] B^T over 16-column slices: A [128 x 16] and B [128 x 16] written chunk by chunk
// at sw32_offset, one m64n128k16 with both descriptors in the 32-byte swizzle.
__global__ void sw32_probe(const T* a, const T* b, float* s_out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_a = fdma::cuda::ptx::smem_addr(smem), s_b = s_a + 128 * wg::kSw32RowBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int i = tid; i < 2 * 128 * 2; i += 128) {  // (operand, row, chunk)
    const int op = i / 256, row = i / 2 % 128, chunk = i % 2;
    const uint4 v = reinterpret_cast<const uint4*>(op == 0 ? a : b)[row * 2 + chunk];
    fdma::cuda::ptx::st_shared_v4((op == 0 ? s_a : s_b) + wg::sw32_offset(row, chunk), v);
  }
  wg::fence_proxy_async_smem();
  __syncthreads();
  float s[kN / 8][4];
  wg::fence();
  wg::mma_ss<T, kN>(s, wg::desc_k_major_sw32(s_a + 64 * wg::kSw32RowBytes), wg::desc_k_major_sw32(s_b), 0);
  wg::commit_group();
  wg::wait_group<0>();
  wg::fence_operands(s);
  for (int nt = 0; nt < kN / 8; ++nt)
    for (int e = 0; e < 4; ++e) s_out[(16 * warp + g + 8 * (e >> 1)) * kN + 8 * nt + 2 * t + (e & 1)] = s[nt][e];
}

bool hopper_available() {
  int n = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  cudaFuncAttributes attr{};
  return major == 9 && minor == 0 && cudaFuncGetAttributes(&attr, wgmma_probe<kN>) == cudaSuccess &&
         attr.binaryVersion == 90;
}

template <int kNS>
void check_probe() {
  SCOPED_TRACE(kNS);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto fill = [&](int n, float scale) {
    std::vector<T> x(n);
    for (auto& e : x) e = __float2bfloat16(dist(rng) * scale);
    return x;
  };
  const auto a = fill(kM * kD, 0.25f), b = fill(kN * kD, 0.25f), v = fill(kN * kD, 1.f);
  T *da, *db, *dv;
  float *ds, *dout;
  ASSERT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, v.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, kM * kNS * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, kM * kD * 4), cudaSuccess);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  const int smem = wg::sw128_tile_bytes(kM, kD) + 2 * wg::sw128_tile_bytes(kN, kD);
  ASSERT_EQ(cudaFuncSetAttribute(wgmma_probe<kNS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  wgmma_probe<kNS><<<1, 128, smem>>>(da, db, dv, ds, dout);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> s(kM * kNS), o(kM * kD);
  cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(da), cudaFree(db), cudaFree(dv), cudaFree(ds), cudaFree(dout);

  int bad_s = 0, bad_o = 0;
  std::vector<float> p(kM * kNS);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kNS; ++j) {
      double ref = 0;
      for (int d = 0; d < kD; ++d) ref += double(__bfloat162float(a[i * kD + d])) * __bfloat162float(b[j * kD + d]);
      bad_s += std::fabs(s[i * kNS + j] - ref) > 1e-3 * (1 + std::fabs(ref));
      p[i * kNS + j] = __bfloat162float(__float2bfloat16(s[i * kNS + j]));  // the kernel's rounding of P
    }
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kD; ++d) {
      double ref = 0;
      for (int j = 0; j < kNS; ++j) ref += double(p[i * kNS + j]) * __bfloat162float(v[j * kD + d]);
      bad_o += std::fabs(o[i * kD + d] - ref) > 1e-3 * (1 + std::fabs(ref));
    }
  EXPECT_EQ(bad_s, 0) << "S = A B^T elements off";
  EXPECT_EQ(bad_o, 0) << "O = P V elements off";
}

TEST(WgmmaGpu, SwizzledTilesAndBothOperandForms) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU with sm_90a code: wgmma tests skipped";
  check_probe<kN>();
}

// The forward's narrow last tile: S over the first 32 or 64 rows of a 128-row K tile.
TEST(WgmmaGpu, NarrowWgmmasReadTheFirstRowsOfATile) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU with sm_90a code: wgmma tests skipped";
  check_probe<32>();
  check_probe<64>();
}

TEST(WgmmaGpu, FusedDqStepStoresDsAndReducesDsK) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU with sm_90a code: wgmma tests skipped";
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> dst(64 * 64);
  for (auto& x : dst) x = dist(rng);
  std::vector<T> k(64 * kD);
  for (auto& x : k) x = __float2bfloat16(dist(rng));
  float *d_dst, *d_dq;
  T* d_k;
  ASSERT_EQ(cudaMalloc(&d_dst, dst.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_k, k.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_dq, 64 * kD * 4), cudaSuccess);
  cudaMemcpy(d_dst, dst.data(), dst.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_k, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(d_dq, 0, 64 * kD * 4);
  const int smem = wg::sw128_tile_bytes(64, kD) + 64 * 64 * 2 + 64 * kD * 4;
  ASSERT_EQ(cudaFuncSetAttribute(ds_k_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  for (int launch = 0; launch < 2; ++launch) ds_k_probe<<<1, 128, smem>>>(d_dst, d_k, d_dq);  // reduced twice
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> dq(64 * kD);
  cudaMemcpy(dq.data(), d_dq, dq.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(d_dst), cudaFree(d_k), cudaFree(d_dq);
  int bad = 0;
  for (int q = 0; q < 64; ++q)
    for (int d = 0; d < kD; ++d) {
      double ref = 0;  // dS[q][key] = dS^T[key][q], rounded to bf16 as the kernel stores it
      for (int key = 0; key < 64; ++key)
        ref += double(__bfloat162float(__float2bfloat16(dst[key * 64 + q]))) * __bfloat162float(k[key * kD + d]);
      bad += std::fabs(dq[fdma::cuda::dq_acc_offset(0, q, d, 64, kD)] - 2 * ref) > 1e-3 * (1 + std::fabs(2 * ref));
    }
  EXPECT_EQ(bad, 0) << "dq = 2 dS K elements off";
}

TEST(WgmmaGpu, ThirtyTwoByteSwizzledSlices) {
  if (!hopper_available()) GTEST_SKIP() << "no Hopper GPU with sm_90a code: wgmma tests skipped";
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<T> a(128 * 16), b(128 * 16);
  for (auto& x : a) x = __float2bfloat16(dist(rng));
  for (auto& x : b) x = __float2bfloat16(dist(rng));
  T *d_a, *d_b;
  float* d_s;
  ASSERT_EQ(cudaMalloc(&d_a, a.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_b, b.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_s, 64 * kN * 4), cudaSuccess);
  cudaMemcpy(d_a, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_b, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  sw32_probe<<<1, 128, 2 * 128 * wg::kSw32RowBytes>>>(d_a, d_b, d_s);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> s(64 * kN);
  cudaMemcpy(s.data(), d_s, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(d_a), cudaFree(d_b), cudaFree(d_s);
  int bad = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < kN; ++j) {
      double ref = 0;
      for (int c = 0; c < 16; ++c)
        ref += double(__bfloat162float(a[(64 + i) * 16 + c])) * __bfloat162float(b[j * 16 + c]);
      bad += std::fabs(s[i * kN + j] - ref) > 1e-3 * (1 + std::fabs(ref));
    }
  EXPECT_EQ(bad, 0) << "S over 32-byte swizzled slices: elements off";
}

}  // namespace
