// Top-w key selection on the CPU (docs/design.md, "Selection"), for one (batch, KV head) row of scores.
//
// Result: for each key j, the interval of queries [begin[j], end[j]) that keep it; a key no
// query keeps gets begin == end == 0. This exists because, with one score per key, the
// queries keeping a key form an interval: a key falls out of a growing prefix's top-w once
// and never returns.
//
// Causal: keys become candidates in index order (key j at query max(0, j - (Sk - Sq))). A
// heap of the current top-w, worst on top, is swept once: a key evicted when candidate t
// arrives is kept by queries [its arrival, t). O(Sk log w) time, O(w) scratch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace fdma::cpu {

// a ranks above b: higher score, then lower index; NaN ranks below everything.
template <class Acc>
struct KeyRank {
  const Acc* score;
  bool operator()(int32_t a, int32_t b) const {
    const bool na = std::isnan(score[a]), nb = std::isnan(score[b]);
    if (na != nb) return nb;
    if (!na && score[a] != score[b]) return score[a] > score[b];
    return a < b;
  }
};

// padding: null, or Sk bytes at stride pad_stride (nonzero = the key exists).
// heap: scratch for min(w, Sk) entries.
template <class Acc>
void select_row(const Acc* score, const uint8_t* padding, int64_t pad_stride, int64_t Sq, int64_t Sk, int64_t w,
                bool causal, int32_t* begin, int32_t* end, int32_t* heap) {
  const KeyRank<Acc> above{score};
  // With `above` as the heap's "less", std::*_heap keeps the lowest-ranked key on top.
  const int64_t cap = std::min(w, Sk);
  int64_t size = 0;
  std::fill(begin, begin + Sk, 0);
  std::fill(end, end + Sk, 0);
  const int64_t off = Sk - Sq;
  for (int64_t j = 0; j < Sk; ++j) {
    if (padding && !padding[j * pad_stride]) continue;
    const int32_t t = causal ? static_cast<int32_t>(std::max<int64_t>(0, j - off)) : 0;
    const int32_t key = static_cast<int32_t>(j);
    if (size == cap) {
      if (!above(key, heap[0])) continue;  // never kept
      std::pop_heap(heap, heap + size, above);
      end[heap[size - 1]] = t;  // evicted: kept by [begin, t)
      --size;
    }
    begin[j] = t;
    end[j] = -1;  // still kept
    heap[size++] = key;
    std::push_heap(heap, heap + size, above);
  }
  for (int64_t j = 0; j < Sk; ++j) {
    if (end[j] == -1) end[j] = static_cast<int32_t>(Sq);
    if (begin[j] >= end[j]) begin[j] = end[j] = 0;
  }
}

}  // namespace fdma::cpu
