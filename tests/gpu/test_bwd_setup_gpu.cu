// The backward's setup launch alone (bwd_setup.cu), compiled into this binary from the
// library's source: for random intervals, each row's kept keys ordered by end tile against a
// host stable sort, every unkept key's dk, dv and dscores zeroed and every kept key's left alone,
// the kept keys' fp32 rows and the sums zeroed. Rows of no, one and a few kept keys, a count
// no multiple of the sorting warps, and query counts whose tiles are taller than 64 rows
// (past kMaxEndBins) or fill the shared memory with few warps. With the prepare's rows: delta
// against a host sum of dO * O, lse2 against lse * log2(e) bitwise (+inf for a row that saw
// nothing and for padding rows, NaN for an lse too large whose dO is not zero). The gradients'
// end-to-end tests are DmaGpu's. Skipped where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/convert.hpp"
#include "cuda/dma/bwd_setup.hpp"
#include "device_tensor.hpp"
#include "fdma/fdma.hpp"

namespace {

using fdma::test::to_device;
using fdma::test::to_host;
using fdma::cpu::bf16_to_float;
using fdma::cpu::float_to_bf16;
using fdma::cuda::EndOrder;
using fdma::cuda::KeyInfo;

struct SetupCase {
  int B, Hk, Sk, Sq, D;
  bool sums;     // the fused backward's zeroing of sums and kept rows too
  int H = 0;     // query heads of the prepare's rows (0: no prepare)
};


void check(const SetupCase& c, uint64_t seed) {
  const int rows = c.B * c.Hk;
  const int64_t keys = int64_t(rows) * c.Sk;
  std::mt19937_64 rng(seed);
  std::vector<KeyInfo> info(keys);
  std::vector<int32_t> kept(keys, -7), kept_count(rows, 0);
  for (int r = 0; r < rows; ++r) {
    // Row kinds: 0 none kept, 1 one kept, else a random share; ends spread over every tile.
    const int kind = r % 4 == 0 ? 0 : r % 4 == 1 ? 1 : 2;
    const double share = kind == 2 ? 0.1 + 0.8 * double(rng() % 1000) / 1000 : 0;
    for (int j = 0; j < c.Sk; ++j) {
      const int64_t e = int64_t(r) * c.Sk + j;
      const bool keep = kind == 1 ? j == c.Sk / 2 : kind == 2 && double(rng() % 1000) / 1000 < share;
      const int begin = int(rng() % uint64_t(c.Sq));
      const int end = keep ? begin + 1 + int(rng() % uint64_t(c.Sq - begin)) : begin;
      info[e] = KeyInfo{begin, end, 0.f, 0};
      if (keep) kept[int64_t(r) * c.Sk + kept_count[r]++] = j;
    }
  }
  // The host's order: stable by bin (latest end tile first), so index order within a bin.
  const EndOrder o = fdma::cuda::end_order(c.Sq);
  std::vector<int32_t> want(keys, -1);
  for (int r = 0; r < rows; ++r) {
    std::vector<int32_t> row(kept.begin() + int64_t(r) * c.Sk, kept.begin() + int64_t(r) * c.Sk + kept_count[r]);
    auto bin = [&](int32_t j) {
      const int64_t end = info[int64_t(r) * c.Sk + j].end;
      return o.bins - int((end + (int64_t(1) << o.quantum_log2) - 1) >> o.quantum_log2);
    };
    std::stable_sort(row.begin(), row.end(), [&](int32_t a, int32_t b) { return bin(a) < bin(b); });
    std::copy(row.begin(), row.end(), want.begin() + int64_t(r) * c.Sk);
  }

  const int elem = 2;  // bf16 rows
  const int64_t row_elems = int64_t(c.B) * c.Sk * c.Hk * c.D;
  std::vector<uint16_t> poison(row_elems, 0x3f80);  // 1.0 in bf16
  std::vector<float> poison_f(keys * 2 * c.D, 3.f), poison_ds(keys, 5.f), poison_sums(4 * 1000, 7.f);
  KeyInfo* dinfo = to_device(info);
  int32_t *dkept = to_device(kept), *dcount = to_device(kept_count), *dby_end = to_device(std::vector<int32_t>(keys, -1));
  uint16_t *ddk = to_device(poison), *ddv = to_device(poison);
  float *ddscores = to_device(std::vector<float>(keys, 9.f)), *drows = to_device(poison_f),
        *dkept_ds = to_device(poison_ds), *dsums = to_device(poison_sums);
  ASSERT_TRUE(dinfo && dkept && dcount && dby_end && ddk && ddv && ddscores && drows && dkept_ds && dsums);

  fdma::cuda::DmaListShape s{c.B, c.Hk, c.Sk, c.Sq, 0, false, 64, true};
  fdma::cuda::BwdZeroArgs z{};
  z.dk = ddk, z.dv = ddv;
  const int64_t st[3] = {int64_t(c.Sk) * c.Hk * c.D, int64_t(c.Hk) * c.D, c.D};  // [B, Sk, Hk, D]
  for (int i = 0; i < 3; ++i) z.dk_stride[i] = z.dv_stride[i] = st[i];
  z.D = c.D, z.elem_bytes = elem;
  z.dscores = ddscores;
  const int64_t ds_st[3] = {int64_t(c.Hk) * c.Sk, c.Sk, 1};  // [B, Hk, Sk]
  for (int i = 0; i < 3; ++i) z.dscores_stride[i] = ds_st[i];
  z.dscores_bytes = 4;
  if (c.sums) {
    z.kept_rows = drows, z.kept_dscores = dkept_ds;
    z.sums = reinterpret_cast<float4*>(dsums), z.sum_float4s = 1000;
  }
  // The prepare's rows: O and dO [B, Sq, H, D] in bf16, lse [B, H, Sq] with a row that saw
  // nothing (-inf), one too large for the fused exponent with a zero dO (+inf) and one with a
  // nonzero dO (NaN).
  fdma::cuda::BwdPrepareRows prep;
  const int sq_pad = (c.Sq + 63) / 64 * 64;
  const int64_t qrows = int64_t(c.B) * c.H * c.Sq, prows = int64_t(c.B) * c.H * sq_pad;
  std::vector<uint16_t> o_h(qrows * c.D), do_h(qrows * c.D);
  std::vector<float> lse_h(qrows);
  std::normal_distribution<float> normal;
  for (auto& x : o_h) x = float_to_bf16(normal(rng));
  for (auto& x : do_h) x = float_to_bf16(normal(rng));
  for (auto& x : lse_h) x = 4.f * normal(rng);
  if (c.H) {
    lse_h[0] = -INFINITY;
    lse_h[qrows - 1] = 3e7f;
    for (int d = 0; d < c.D; ++d) do_h[(qrows - 1) * c.D + d] = 0x8000;  // -0: dO all zeros
    lse_h[qrows / 2] = -3e7f;
  }
  uint16_t *d_o = to_device(o_h), *d_do = to_device(do_h);
  float *d_lse = to_device(lse_h), *d_delta = to_device(std::vector<float>(prows, 11.f)),
        *d_lse2 = to_device(std::vector<float>(prows, 13.f));
  ASSERT_TRUE(d_o && d_do && d_lse && d_delta && d_lse2);
  if (c.H) {
    prep.out = d_o, prep.dout = d_do, prep.lse = d_lse;
    const int64_t qs[3] = {int64_t(c.Sq) * c.H * c.D, int64_t(c.H) * c.D, c.D};  // [B, Sq, H, D]
    const int64_t ls[3] = {int64_t(c.H) * c.Sq, c.Sq, 1};                         // [B, H, Sq]
    for (int i = 0; i < 3; ++i) prep.out_stride[i] = prep.dout_stride[i] = qs[i], prep.lse_stride[i] = ls[i];
    prep.delta = d_delta, prep.lse2 = d_lse2;
    prep.B = c.B, prep.H = c.H, prep.Sq = c.Sq, prep.Sq_pad = sq_pad, prep.D = c.D, prep.bf16 = true;
  }
  ASSERT_EQ(fdma::cuda::bwd_setup(s, dinfo, dkept, dcount, dby_end, z, prep, nullptr, false), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> delta = to_host(d_delta, prows), lse2 = to_host(d_lse2, prows);
  for (void* p : {static_cast<void*>(d_o), static_cast<void*>(d_do), static_cast<void*>(d_lse),
                  static_cast<void*>(d_delta), static_cast<void*>(d_lse2)})
    cudaFree(p);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < sq_pad; ++i) {
        const int64_t row = (int64_t(b) * c.H + h) * sq_pad + i;
        if (i >= c.Sq) {
          ASSERT_EQ(delta[row], 0.f) << "padding row " << row;
          ASSERT_EQ(lse2[row], INFINITY) << "padding row " << row;
          continue;
        }
        const int64_t q = (int64_t(b) * c.Sq + i) * c.H + h;  // O's row
        double want_delta = 0, scale = 0;
        bool do_zero = true;
        for (int d = 0; d < c.D; ++d) {
          const double x = bf16_to_float(o_h[q * c.D + d]), y = bf16_to_float(do_h[q * c.D + d]);
          want_delta += x * y, scale += std::fabs(x * y);
          do_zero = do_zero && y == 0;
        }
        ASSERT_NEAR(delta[row], want_delta, 1e-5 * scale + 1e-30) << "delta of row " << row;
        const float lse = lse_h[(int64_t(b) * c.H + h) * c.Sq + i];
        const float l2 = lse * 1.4426950408889634f;
        if (lse == -INFINITY)
          ASSERT_EQ(lse2[row], INFINITY) << "row " << row;
        else if (std::fabs(l2) < 16777216.f)
          ASSERT_EQ(lse2[row], l2) << "row " << row;
        else if (do_zero)
          ASSERT_EQ(lse2[row], INFINITY) << "row " << row;
        else
          ASSERT_TRUE(std::isnan(lse2[row])) << "row " << row;
      }

  const std::vector<int32_t> got = to_host(dby_end, keys);
  const std::vector<uint16_t> dk = to_host(ddk, row_elems), dv = to_host(ddv, row_elems);
  const std::vector<float> ds = to_host(ddscores, keys), rows_f = to_host(drows, keys * 2 * c.D),
                           kept_ds = to_host(dkept_ds, keys), sums = to_host(dsums, 4 * 1000);
  for (void* p : {static_cast<void*>(dinfo), static_cast<void*>(dkept), static_cast<void*>(dcount),
                  static_cast<void*>(dby_end), static_cast<void*>(ddk), static_cast<void*>(ddv),
                  static_cast<void*>(ddscores), static_cast<void*>(drows), static_cast<void*>(dkept_ds),
                  static_cast<void*>(dsums)})
    cudaFree(p);

  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < kept_count[r]; ++i)
      ASSERT_EQ(got[int64_t(r) * c.Sk + i], want[int64_t(r) * c.Sk + i]) << "row " << r << " place " << i;
  for (int b = 0; b < c.B; ++b)
    for (int hk = 0; hk < c.Hk; ++hk)
      for (int j = 0; j < c.Sk; ++j) {
        const int64_t key = (int64_t(b) * c.Hk + hk) * c.Sk + j;
        const bool is_kept = info[key].end > info[key].begin;
        for (int d = 0; d < c.D; ++d) {
          const int64_t at = b * st[0] + j * st[1] + hk * st[2] + d;
          ASSERT_EQ(dk[at], is_kept ? 0x3f80 : 0) << "dk of key " << key;
          ASSERT_EQ(dv[at], is_kept ? 0x3f80 : 0) << "dv of key " << key;
        }
        ASSERT_EQ(ds[key], is_kept ? 9.f : 0.f) << "dscores of key " << key;
        const bool zeroed = c.sums && is_kept;
        for (int d = 0; d < 2 * c.D; ++d) ASSERT_EQ(rows_f[key * 2 * c.D + d], zeroed ? 0.f : 3.f) << "row of key " << key;
        ASSERT_EQ(kept_ds[key], zeroed ? 0.f : 5.f) << "kept dscores of key " << key;
      }
  for (float v : sums) ASSERT_EQ(v, c.sums ? 0.f : 7.f);
}

TEST(BwdSetupGpu, OrdersByEndTilePreparesAndZeroes) {
  if (!fdma::cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped";
  EXPECT_EQ(fdma::cuda::end_order(16384).quantum_log2, 6);
  EXPECT_EQ(fdma::cuda::end_order(262144).quantum_log2, 6);
  EXPECT_EQ(fdma::cuda::end_order(262145).quantum_log2, 7);
  EXPECT_GE(fdma::cuda::end_order(262144).warps, 2);
  const SetupCase cases[] = {
      {1, 5, 300, 100, 64, true, 10},   // one bin-wide tile, short rows; prepare rows past Sq
      {2, 3, 2000, 16384, 128, true, 3},   // 256 bins, 16 warps
      {1, 6, 3000, 16384, 64, false, 6},   // no fused temporaries (the dq and dk/dv kernels' path)
      {1, 3, 5000, 131072, 64, true},   // 2048 bins: 5 warps
      {1, 3, 4000, 300000, 32, true},   // 128-row tiles (past kMaxEndBins)
      {1, 4, 500, 700, 96, true, 7},    // 8 lanes a row, the second pieces of half of them
      {2, 2, 700, 900, 256, true, 5},   // 16 lanes a row (past D = 128), two pieces each
      {1, 2, 400, 500, 192, false, 4},  // 16 lanes, the second pieces of half of them
  };
  uint64_t seed = 11;
  for (const SetupCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " Hk " << c.Hk << " Sk " << c.Sk << " Sq " << c.Sq);
    check(c, seed++);
  }
}

}  // namespace
