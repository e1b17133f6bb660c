// dynamic_mask_attention (README, "What it computes") on the CPU.
//
// Selection gives each key its interval of keeping queries (selection.hpp). Query rows are
// processed in tiles of kTile: a tile gathers the keys any of its queries keeps (at most
// w + kTile - 1 of them) and each row walks that list, so the work is O(N * w) and no
// Sq x Sk array exists anywhere. The backward mirrors attention_cpu.cpp: pass A over query
// tiles (dq), pass B over keys (dk, dv, dkey_scores), each key walking its query interval.
#include <algorithm>

#include "core/parallel.hpp"
#include "cpu/arena.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/pack.hpp"
#include "cpu/row_kernels.hpp"
#include "cpu/selection.hpp"

namespace fdma::cpu {
namespace {

using detail::Dims;
using detail::DmaProblem;

constexpr int64_t kTile = 64;

// Pieces both passes need: packed K/V and scores, the selection, per-worker lists.
template <class Acc>
struct DmaCommon {
  Acc *K, *V;                 // [B, Hk, Sk, D]
  Acc* scores;                // [B, Hk, Sk]
  int32_t *begin, *end;       // [B, Hk, Sk]: queries [begin, end) keep key j
  int32_t *heap, *list;       // per worker
  int64_t heap_len, list_len;
  DmaCommon(Arena& a, const DmaProblem& prob, int workers) {
    const Dims& d = prob.dims;
    K = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    V = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    scores = a.take<Acc>(d.B * d.Hk * d.Sk);
    begin = a.take<int32_t>(d.B * d.Hk * d.Sk);
    end = a.take<int32_t>(d.B * d.Hk * d.Sk);
    heap_len = std::min(prob.window, d.Sk);
    list_len = prob.window >= d.Sk ? d.Sk : std::min(d.Sk, prob.window + kTile);  // any window up to INT64_MAX
    heap = a.take<int32_t>(workers * heap_len);
    list = a.take<int32_t>(workers * list_len);
  }

  // Packs K, V and the scores, and gets the selection: the caller's intervals in a backward
  // that is given them, else selected here (and written to the caller's, if given).
  void prepare(const fdma_dma_params& p, const DmaProblem& prob, int workers, Pass pass) {
    const Dims& d = prob.dims;
    pack_bshd(p.k, K);
    pack_bshd(p.v, V);
    pack_3d(p.key_scores, scores);
    if (prob.has_intervals && pass == Pass::backward) {
      read_intervals(p, prob);
      return;
    }
    detail::parallel_for(
        d.B * d.Hk, 1,
        [&](int64_t lo, int64_t hi, int w) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t b = r / d.Hk;
            const uint8_t* pad = prob.has_padding
                                     ? static_cast<const uint8_t*>(p.key_padding.data) + b * p.key_padding.stride[0]
                                     : nullptr;
            select_row(scores + r * d.Sk, pad, p.key_padding.stride[1], d.Sq, d.Sk, prob.window, prob.causal,
                       begin + r * d.Sk, end + r * d.Sk, heap + w * heap_len);
          }
        },
        workers);
    if (prob.has_intervals) write_intervals(p, prob);
  }

  // Caller-given intervals, clamped to the queries that exist: intervals that are not a
  // selection's give wrong results, never an access out of bounds.
  void read_intervals(const fdma_dma_params& p, const DmaProblem& prob) {
    const Dims& d = prob.dims;
    const auto* kb = static_cast<const int32_t*>(p.keep_begin.data);
    const auto* ke = static_cast<const int32_t*>(p.keep_end.data);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t hk = 0; hk < d.Hk; ++hk)
        for (int64_t j = 0; j < d.Sk; ++j) {
          const int64_t e = (b * d.Hk + hk) * d.Sk + j;
          const int64_t lo = std::clamp<int64_t>(kb[offset3(p.keep_begin, b, hk, j)], 0, d.Sq);
          begin[e] = int32_t(lo);
          end[e] = int32_t(std::clamp<int64_t>(ke[offset3(p.keep_end, b, hk, j)], lo, d.Sq));
        }
  }

  void write_intervals(const fdma_dma_params& p, const DmaProblem& prob) const {
    const Dims& d = prob.dims;
    auto* kb = static_cast<int32_t*>(p.keep_begin.data);
    auto* ke = static_cast<int32_t*>(p.keep_end.data);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t hk = 0; hk < d.Hk; ++hk)
        for (int64_t j = 0; j < d.Sk; ++j) {
          const int64_t e = (b * d.Hk + hk) * d.Sk + j;
          kb[offset3(p.keep_begin, b, hk, j)] = begin[e];
          ke[offset3(p.keep_end, b, hk, j)] = end[e];
        }
  }

  // Keys of row r = (b, hk) kept by any query in [i0, i1), in increasing order. Causal keys
  // past the tile's last visible index cannot be kept by it, so the scan stops there.
  int64_t tile_keys(const DmaProblem& prob, int64_t r, int64_t i0, int64_t i1, int32_t* out) const {
    const Dims& d = prob.dims;
    const int64_t stop = prob.causal ? std::clamp<int64_t>(i1 + d.causal_offset(), 0, d.Sk) : d.Sk;
    const int32_t* b = begin + r * d.Sk;
    const int32_t* e = end + r * d.Sk;
    int64_t n = 0;
    // A selection's tile keeps at most list_len keys; the bound only matters for intervals a
    // caller made up (read_intervals).
    for (int64_t j = 0; j < stop && n < list_len; ++j)
      if (b[j] < e[j] && b[j] < i1 && e[j] > i0) out[n++] = static_cast<int32_t>(j);
    return n;
  }
};

// Row visitor: the keys of the tile's list that query i keeps.
template <class Acc>
struct KeptKeys {
  const int32_t *list, *begin, *end;
  int64_t n, i;
  const Acc* bias;  // scores of this (b, hk), or null when they are not added
  template <class Emit>
  void operator()(Emit&& emit) const {
    for (int64_t t = 0; t < n; ++t) {
      const int32_t j = list[t];
      if (begin[j] <= i && i < end[j]) emit(j, bias ? bias[j] : Acc(0));
    }
  }
};

template <class Acc>
struct DmaForwardLayout : DmaCommon<Acc> {
  Acc *s_buf, *q, *out;
  int32_t* j_buf;
  DmaForwardLayout(Arena& a, const DmaProblem& prob, int workers) : DmaCommon<Acc>(a, prob, workers) {
    s_buf = a.take<Acc>(workers * this->list_len);
    j_buf = a.take<int32_t>(workers * this->list_len);
    q = a.take<Acc>(workers * prob.dims.D);
    out = a.take<Acc>(workers * prob.dims.D);
  }
};

template <class Acc>
struct DmaBackwardLayout : DmaCommon<Acc> {
  Acc *Q, *dO, *delta, *lse, *rows;
  DmaBackwardLayout(Arena& a, const DmaProblem& prob, int workers) : DmaCommon<Acc>(a, prob, workers) {
    const Dims& d = prob.dims;
    Q = a.take<Acc>(d.B * d.H * d.Sq * d.D);
    dO = a.take<Acc>(d.B * d.H * d.Sq * d.D);
    delta = a.take<Acc>(d.B * d.H * d.Sq);
    lse = a.take<Acc>(d.B * d.H * d.Sq);
    rows = a.take<Acc>(workers * 4 * d.D);
  }
};

bool use_f64(const DmaProblem& prob) { return prob.dtype == DType::f64; }

int64_t num_tiles(const Dims& d) { return (d.Sq + kTile - 1) / kTile; }

template <class Acc>
void forward_impl(const fdma_dma_params& p, const DmaProblem& prob) {
  const Dims& d = prob.dims;
  const int workers = detail::num_threads();
  Arena arena(p.workspace);
  DmaForwardLayout<Acc> L(arena, prob, workers);
  L.prepare(p, prob, workers, Pass::forward);
  const ScoreFn<Acc> f{Acc(prob.scale), Acc(prob.softcap)};
  const int64_t G = d.G(), D = d.D, tiles = num_tiles(d);
  detail::parallel_for(
      d.B * d.Hk * tiles, 1,
      [&](int64_t lo, int64_t hi, int w) {
        int32_t* list = L.list + w * L.list_len;
        Acc* q = L.q + w * D;
        Acc* out = L.out + w * D;
        for (int64_t g = lo; g < hi; ++g) {
          const int64_t r = g / tiles, i0 = (g % tiles) * kTile, i1 = std::min(d.Sq, i0 + kTile);
          const int64_t b = r / d.Hk, hk = r % d.Hk;
          const int64_t n = L.tile_keys(prob, r, i0, i1, list);
          const Acc* bias = prob.add_scores ? L.scores + r * d.Sk : nullptr;
          for (int64_t h = hk * G; h < hk * G + G; ++h)
            for (int64_t i = i0; i < i1; ++i) {
              load_bshd_row(p.q, b, i, h, q);
              KeptKeys<Acc> keys{list, L.begin + r * d.Sk, L.end + r * d.Sk, n, i, bias};
              Acc lse = softmax_row_forward(q, L.K + r * d.Sk * D, L.V + r * d.Sk * D, D, f, keys,
                                            L.s_buf + w * L.list_len, L.j_buf + w * L.list_len, out);
              store_bshd_row(p.out, b, i, h, out);
              if (p.lse.data) store_one(p.lse.data, dtype_of(p.lse), offset3(p.lse, b, h, i), lse);
            }
        }
      },
      workers);
}

template <class Acc>
void backward_impl(const fdma_dma_params& p, const DmaProblem& prob) {
  const Dims& d = prob.dims;
  const int workers = detail::num_threads();
  Arena arena(p.workspace);
  DmaBackwardLayout<Acc> L(arena, prob, workers);
  L.prepare(p, prob, workers, Pass::backward);
  pack_bshd(p.q, L.Q);
  pack_bshd(p.dout, L.dO);
  const ScoreFn<Acc> f{Acc(prob.scale), Acc(prob.softcap)};
  const int64_t G = d.G(), D = d.D, tiles = num_tiles(d), H = d.H, Sq = d.Sq, Sk = d.Sk;

  // Pass A: query tiles -> delta, lse (packed for pass B) and dq.
  detail::parallel_for(
      d.B * d.Hk * tiles, 1,
      [&](int64_t lo, int64_t hi, int w) {
        int32_t* list = L.list + w * L.list_len;
        Acc* dq = L.rows + w * 4 * D;
        Acc* o = dq + D;
        for (int64_t g = lo; g < hi; ++g) {
          const int64_t r = g / tiles, i0 = (g % tiles) * kTile, i1 = std::min(Sq, i0 + kTile);
          const int64_t b = r / d.Hk, hk = r % d.Hk;
          const int64_t n = L.tile_keys(prob, r, i0, i1, list);
          const Acc* bias = prob.add_scores ? L.scores + r * Sk : nullptr;
          for (int64_t h = hk * G; h < hk * G + G; ++h)
            for (int64_t i = i0; i < i1; ++i) {
              const int64_t row = (b * H + h) * Sq + i;
              load_bshd_row(p.out, b, i, h, o);
              const Acc delta = dot(L.dO + row * D, o, D);
              const Acc lse = load_one<Acc>(p.lse.data, dtype_of(p.lse), offset3(p.lse, b, h, i));
              L.delta[row] = delta;
              L.lse[row] = lse;
              KeptKeys<Acc> keys{list, L.begin + r * Sk, L.end + r * Sk, n, i, bias};
              softmax_row_backward(L.Q + row * D, L.dO + row * D, delta, lse, L.K + r * Sk * D, L.V + r * Sk * D, D, f,
                                   keys, [](int64_t, Acc) {}, dq);
              store_bshd_row(p.dq, b, i, h, dq);
            }
        }
      },
      workers);

  // Pass B: keys -> dk, dv, dkey_scores over the queries [begin_j, end_j) of each head.
  const DType ds_dt = prob.has_dscores ? dtype_of(p.dkey_scores) : DType::f32;
  detail::parallel_for(
      d.B * d.Hk * Sk, 16,
      [&](int64_t lo, int64_t hi, int w) {
        Acc* dk = L.rows + w * 4 * D + 2 * D;
        Acc* dv = dk + D;
        for (int64_t g = lo; g < hi; ++g) {
          const int64_t r = g / Sk, j = g % Sk, b = r / d.Hk, hk = r % d.Hk;
          const int64_t i_lo = L.begin[g], i_hi = L.end[g];
          const Acc bias = prob.add_scores ? L.scores[g] : Acc(0);
          fill(dk, D, Acc(0));
          fill(dv, D, Acc(0));
          Acc dscore = 0;
          for (int64_t h = hk * G; h < hk * G + G; ++h) {
            const int64_t head = (b * H + h) * Sq;
            auto visit = [&](auto&& emit) {
              for (int64_t i = i_lo; i < i_hi; ++i) emit(i, bias);
            };
            softmax_col_backward(L.K + g * D, L.V + g * D, L.Q + head * D, L.dO + head * D, L.delta + head,
                                 L.lse + head, D, f, visit, [&](int64_t, Acc ds) { dscore += ds; }, dk, dv);
          }
          store_bshd_row(p.dk, b, j, hk, dk);
          store_bshd_row(p.dv, b, j, hk, dv);
          // Without add_scores the scores only select, and selection is not differentiated.
          if (prob.has_dscores)
            store_one(p.dkey_scores.data, ds_dt, offset3(p.dkey_scores, b, hk, j), prob.add_scores ? dscore : Acc(0));
        }
      },
      workers);
}

template <class Acc>
size_t workspace_bytes(const DmaProblem& prob, Pass pass) {
  Arena a;
  if (pass == Pass::forward)
    DmaForwardLayout<Acc>(a, prob, detail::num_threads());
  else
    DmaBackwardLayout<Acc>(a, prob, detail::num_threads());
  return a.bytes();
}

}  // namespace

size_t dma_workspace(const DmaProblem& prob, Pass pass) {
  return use_f64(prob) ? workspace_bytes<double>(prob, pass) : workspace_bytes<float>(prob, pass);
}

void dma_forward(const fdma_dma_params& p, const DmaProblem& prob) {
  use_f64(prob) ? forward_impl<double>(p, prob) : forward_impl<float>(p, prob);
}

void dma_backward(const fdma_dma_params& p, const DmaProblem& prob) {
  use_f64(prob) ? backward_impl<double>(p, prob) : backward_impl<float>(p, prob);
}

}  // namespace fdma::cpu
