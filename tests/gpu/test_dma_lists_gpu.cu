// The key lists' builder alone (dma_lists.cu), compiled into this binary from the library's
// source: causal tile lists with checkpoint lists (every C tiles) against the same lists built
// without them and against a host construction of each tile's list (the keys that cover the
// tile first, then the partial ones, each part in index order, cut at the list's room). Inputs:
// a causal top-w selection's intervals (key j kept from its own row until w later keys outrank
// it), with as many keys as queries and with more (the causal diagonal offset), and a caller's
// intervals that keep far more keys than w at a row, so that checkpoint lists overflow and
// their tiles scan the whole kept list. And the records and kept list written by one launch
// from counts of each block's kept keys (as the selection's walk leaves them) against the two
// launches that count them. Skipped where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cuda/dma/dma_lists.hpp"
#include "device_tensor.hpp"
#include "fdma/fdma.hpp"

namespace {

using fdma::test::to_device;
using fdma::cuda::DmaListShape;

struct Intervals {
  std::vector<int32_t> begin, end;  // [B * Hk, Sk]
};

// Causal top-w of random scores, row by row: key j becomes visible at row j - (Sk - Sq) (row 0
// for the keys before), and leaves at the row where w keys visible with it outrank it.
Intervals causal_top_w(int rows, int Sq, int Sk, int w, std::mt19937_64& rng) {
  Intervals iv{std::vector<int32_t>(size_t(rows) * Sk, 0), std::vector<int32_t>(size_t(rows) * Sk, 0)};
  std::uniform_real_distribution<float> uni;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> score(Sk);
    for (float& x : score) x = uni(rng);
    std::set<std::pair<float, int>> kept;  // (score, key): the lowest first
    int next = 0;
    for (int i = 0; i < Sq; ++i) {
      for (; next < Sk && next - (Sk - Sq) <= i; ++next) {
        iv.begin[size_t(r) * Sk + next] = i;
        kept.insert({score[next], next});
        if (int(kept.size()) > w) {
          const int out = kept.begin()->second;
          kept.erase(kept.begin());
          iv.end[size_t(r) * Sk + out] = i;  // begin == end where it never stayed
        }
      }
    }
    for (const auto& e : kept) iv.end[size_t(r) * Sk + e.second] = Sq;
  }
  return iv;
}

// Intervals a caller might pass: most keys kept over long random stretches.
Intervals caller_intervals(int rows, int Sq, int Sk, std::mt19937_64& rng) {
  Intervals iv{std::vector<int32_t>(size_t(rows) * Sk), std::vector<int32_t>(size_t(rows) * Sk)};
  for (size_t e = 0; e < iv.begin.size(); ++e) {
    const int b = int(rng() % uint64_t(Sq));
    iv.begin[e] = b;
    iv.end[e] = rng() % 10 == 0 ? b : b + 1 + int(rng() % uint64_t(Sq - b));
  }
  return iv;
}


// Everything the records and kept-list launches write, built with the blocks' kept keys given
// (counts: DmaListInputs::counted, the one-launch kernel) or counted by the records kernel
// (null). The workspace starts as 0xff bytes, so that nothing read before it is written passes.
struct Built {
  std::vector<fdma::cuda::KeyInfo> info;
  std::vector<fdma::cuda::BiasChunk> chunks;
  std::vector<int32_t> kept, kept_count, tile_keys, tile_count;
  std::vector<int2> kept_span;
  int32_t fold_off = -1;
};

template <class T>
std::vector<T> from_device(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

Built build_records(const DmaListShape& s, fdma::cuda::DmaListInputs in, const std::vector<int32_t>* counts) {
  void* work = nullptr;
  const size_t bytes = fdma::cuda::dma_lists_workspace(s);
  EXPECT_EQ(cudaMalloc(&work, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(work, 0xff, bytes), cudaSuccess);
  const fdma::cuda::DmaListScratch c = fdma::cuda::carve_dma_lists(work, s);
  in.counted = counts != nullptr;
  if (counts) {  // as the selection's walk leaves them
    EXPECT_EQ(cudaMemcpy(c.block_counts, counts->data(), counts->size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    if (c.fold_off) EXPECT_EQ(cudaMemset(c.fold_off, 0, 4), cudaSuccess);
  }
  fdma::cuda::KeyLists lists{};
  EXPECT_EQ(fdma::cuda::build_dma_lists(s, in, c, lists, nullptr, true), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t n = s.keys(), rows = int64_t(s.B) * s.Hk;
  Built b;
  b.info = from_device(c.info, n);
  b.kept = from_device(c.kept, n);
  b.kept_count = from_device(c.kept_count, rows);
  if (c.bias_chunks) b.chunks = from_device(c.bias_chunks, n);
  if (c.fold_off) b.fold_off = from_device(c.fold_off, 1)[0];
  if (s.tile_lists) {
    b.kept_span = from_device(c.kept_span, n);
    b.tile_keys = from_device(c.tile_keys, rows * s.q_tiles() * s.cap());
    b.tile_count = from_device(c.tile_count, rows * s.q_tiles());
  }
  cudaFree(work);
  return b;
}

// The intervals [B, Hk, Sk] as the lists' inputs, no scores added.
fdma::cuda::DmaListInputs interval_inputs(const DmaListShape& s, const int32_t* d_begin, const int32_t* d_end) {
  fdma::cuda::DmaListInputs in{};
  in.begin = d_begin, in.end = d_end;
  const int64_t st[3] = {int64_t(s.Hk) * s.Sk, s.Sk, 1};
  for (int i = 0; i < 3; ++i) in.begin_stride[i] = in.end_stride[i] = st[i];
  in.add_scores = false, in.scale = 1.f;
  return in;
}

Built build(DmaListShape s, int checkpoint_tiles, const int32_t* d_begin, const int32_t* d_end) {
  s.checkpoint_tiles = checkpoint_tiles;
  return build_records(s, interval_inputs(s, d_begin, d_end), nullptr);
}

// Tile t's list on the host: the kept keys up to the causal limit of its last row whose
// interval meets its rows, covering ones first (unless there are more than 2 * 128 partial
// ones: then index order), cut at cap.
std::vector<int32_t> host_tile_list(const DmaListShape& s, const Intervals& iv, int row, int t) {
  const int lo = t * s.block_m, hi = std::min(s.Sq, lo + s.block_m);
  const int64_t last_key = int64_t(hi) - 1 + (s.Sk - s.Sq);
  std::vector<int32_t> cover, partial, all;
  for (int j = 0; j < s.Sk && j <= last_key; ++j) {
    const int b = iv.begin[size_t(row) * s.Sk + j], e = iv.end[size_t(row) * s.Sk + j];
    if (e <= b || b >= hi || e <= lo) continue;
    all.push_back(j);
    (b <= lo && e >= hi ? cover : partial).push_back(j);
  }
  std::vector<int32_t> list = partial.size() > 256 ? all : cover;
  if (partial.size() <= 256) list.insert(list.end(), partial.begin(), partial.end());
  if (int64_t(list.size()) > s.cap()) list.resize(size_t(s.cap()));
  return list;
}

void check(int B, int Hk, int Sq, int Sk, int w, bool caller, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Intervals iv = caller ? caller_intervals(B * Hk, Sq, Sk, rng) : causal_top_w(B * Hk, Sq, Sk, w, rng);
  int32_t *d_begin = to_device(iv.begin), *d_end = to_device(iv.end);
  ASSERT_TRUE(d_begin && d_end);
  DmaListShape s{B, Hk, Sk, Sq, w, true, 128, false};
  const Built plain = build(s, 0, d_begin, d_end);
  for (int c : {3, 8}) {
    SCOPED_TRACE(testing::Message() << "checkpoint every " << c << " tiles");
    const Built with = build(s, c, d_begin, d_end);
    for (int row = 0; row < B * Hk; ++row)
      for (int t = 0; t < s.q_tiles(); ++t) {
        const int64_t at = int64_t(row) * s.q_tiles() + t;
        const std::vector<int32_t> want = host_tile_list(s, iv, row, t);
        ASSERT_EQ(plain.tile_count[at], int32_t(want.size())) << "row " << row << " tile " << t;
        ASSERT_EQ(with.tile_count[at], int32_t(want.size())) << "row " << row << " tile " << t;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(plain.tile_keys[at * s.cap() + i], want[i]) << "row " << row << " tile " << t << " place " << i;
          ASSERT_EQ(with.tile_keys[at * s.cap() + i], want[i]) << "row " << row << " tile " << t << " place " << i;
        }
      }
  }
  cudaFree(d_begin);
  cudaFree(d_end);
}

}  // namespace

TEST(DmaListsGpu, CheckpointListsGiveTheSameTileLists) {
  if (!fdma::cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped";
  // The default: checkpoints every 8 tiles from 1024 tiles a call (B * Hk * tiles), none for a
  // packed batch or below.
  const DmaListShape big{1, 4, 131072, 131072, 2048, true, 128, false}, small{1, 1, 5000, 5000, 300, true, 128, false};
  EXPECT_EQ(fdma::cuda::tile_checkpoints(big), 8);
  EXPECT_EQ(fdma::cuda::tile_checkpoints(small), 0);
  DmaListShape packed = big;
  const int32_t cu[2] = {0, 131072};
  packed.cu_q = packed.cu_k = cu, packed.num_seqs = 1, packed.max_k = 131072;
  EXPECT_EQ(fdma::cuda::tile_checkpoints(packed), 0);
  uint64_t seed = 5;
  {
    SCOPED_TRACE("a causal selection, Sq == Sk, not a multiple of the tile");
    check(2, 2, 5000, 5000, 300, false, seed++);
  }
  {
    SCOPED_TRACE("a causal selection, 700 keys before the first query's");
    check(1, 3, 3000, 3700, 500, false, seed++);
  }
  {
    SCOPED_TRACE("a window as wide as the row");
    check(1, 1, 2100, 2100, 4096, false, seed++);
  }
  {
    SCOPED_TRACE("a caller's intervals: checkpoint lists overflow");
    check(1, 2, 1500, 1500, 64, true, seed++);
  }
}

namespace {

// The one-launch records and kept list against the two launches, on the same intervals and
// scores (float32, folded): records, folded terms of the kept keys, kept lists with their
// spans, tile lists and the fold flag, which keys of 1e38 set.
void check_counted(DmaListShape s, bool caller, bool huge, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int rows = s.B * s.Hk;
  const Intervals iv = caller ? caller_intervals(rows, s.Sq, s.Sk, rng) : causal_top_w(rows, s.Sq, s.Sk, int(s.window), rng);
  std::vector<float> scores(iv.begin.size());
  std::normal_distribution<float> normal;
  for (size_t e = 0; e < scores.size(); ++e) scores[e] = huge && e % 97 == 50 ? 1e38f : normal(rng);
  // The walk's counts: keys whose interval, clamped to the queries, is not empty.
  const int blocks = fdma::cuda::list_blocks_per_row(s.Sk);
  std::vector<int32_t> counts(size_t(rows) * blocks, 0);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < s.Sk; ++j) {
      const size_t e = size_t(r) * s.Sk + j;
      const int b = std::clamp(iv.begin[e], 0, s.Sq), en = std::clamp(iv.end[e], b, s.Sq);
      counts[size_t(r) * blocks + (j >> fdma::cuda::kListBlockKeysLog2)] += en > b;
    }
  int32_t *d_begin = to_device(iv.begin), *d_end = to_device(iv.end);
  float* d_scores = to_device(scores);
  ASSERT_TRUE(d_begin && d_end && d_scores);
  fdma::cuda::DmaListInputs in = interval_inputs(s, d_begin, d_end);
  in.scores = d_scores, in.score_dtype = FDMA_FLOAT32;
  for (int i = 0; i < 3; ++i) in.score_stride[i] = in.begin_stride[i];
  in.add_scores = true, in.scale = 0.125f;
  s.fold_bias = true;
  const Built two = build_records(s, in, nullptr), one = build_records(s, in, &counts);
  EXPECT_EQ(two.fold_off, huge ? 1 : 0);
  EXPECT_EQ(one.fold_off, two.fold_off);
  ASSERT_EQ(one.kept_count, two.kept_count);
  for (int r = 0; r < rows; ++r) {
    const size_t r0 = size_t(r) * s.Sk;
    for (int j = 0; j < s.Sk; ++j) {
      const auto &a = one.info[r0 + j], &b = two.info[r0 + j];
      ASSERT_TRUE(a.begin == b.begin && a.end == b.end && a.bias == b.bias && a.pad == b.pad) << "row " << r << " key " << j;
    }
    for (int i = 0; i < two.kept_count[r]; ++i) {
      const int32_t j = two.kept[r0 + i];
      ASSERT_EQ(one.kept[r0 + i], j) << "row " << r << " place " << i;
      ASSERT_EQ(std::memcmp(&one.chunks[r0 + j], &two.chunks[r0 + j], sizeof(fdma::cuda::BiasChunk)), 0) << "key " << j;
      if (s.tile_lists)
        ASSERT_TRUE(one.kept_span[r0 + i].x == two.kept_span[r0 + i].x && one.kept_span[r0 + i].y == two.kept_span[r0 + i].y)
            << "row " << r << " place " << i;
    }
  }
  EXPECT_EQ(one.tile_count, two.tile_count);
  for (size_t t = 0; t < two.tile_count.size(); ++t)
    for (int i = 0; i < two.tile_count[t]; ++i)
      ASSERT_EQ(one.tile_keys[t * s.cap() + i], two.tile_keys[t * s.cap() + i]) << "tile " << t << " place " << i;
  cudaFree(d_begin);
  cudaFree(d_end);
  cudaFree(d_scores);
}

}  // namespace

TEST(DmaListsGpu, CountedBlocksGiveTheSameLists) {
  if (!fdma::cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped";
  uint64_t seed = 40;
  {
    SCOPED_TRACE("a causal selection over several blocks a row, Sk not a multiple of a block");
    check_counted(DmaListShape{2, 2, 5000, 5000, 300, true, 128, false}, false, false, seed++);
  }
  {
    SCOPED_TRACE("more keys than queries; terms of 1e38 that do not fold");
    check_counted(DmaListShape{1, 3, 3000, 3700, 500, true, 128, false}, false, true, seed++);
  }
  {
    SCOPED_TRACE("a caller's intervals, most keys kept");
    check_counted(DmaListShape{1, 2, 1500, 2500, 64, true, 128, false}, true, false, seed++);
  }
  {
    SCOPED_TRACE("no tile lists (the kept list alone), a single block a row");
    check_counted(DmaListShape{3, 1, 700, 1000, 200, false, 128, false}, false, true, seed++);
  }
}
