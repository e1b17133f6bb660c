// attention (README, "What it computes") on the CPU.
//
// Forward: one query row at a time (row_kernels.hpp), parallel over rows.
// Backward, race-free and deterministic without atomics, in two passes:
//   A, over query rows: delta = dO.O, dq;
//   B, over key columns: dk, dv (all G query heads of a KV head in one place).
// dbias is reduced by whichever pass can own each of its elements: A when the bias has a
// query dim (or broadcasts over both query and key), B when it broadcasts over queries but
// has a key dim. The owning pass groups its work so one worker sums each dbias element in a
// fixed order.
#include <algorithm>

#include "core/parallel.hpp"
#include "cpu/arena.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/pack.hpp"
#include "cpu/row_kernels.hpp"

namespace fdma::cpu {
namespace {

using detail::AttentionProblem;
using detail::Broadcast;
using detail::Dims;

struct Range {
  int64_t lo, hi;
};

template <class Acc>
struct ForwardLayout {
  Acc *K, *V;  // [B, Hk, Sk, D]
  Acc *scores, *bias_row, *q, *out;
  int32_t* keys;
  ForwardLayout(Arena& a, const Dims& d, int workers) {
    K = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    V = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    scores = a.take<Acc>(workers * d.Sk);
    bias_row = a.take<Acc>(workers * d.Sk);
    keys = a.take<int32_t>(workers * d.Sk);
    q = a.take<Acc>(workers * d.D);
    out = a.take<Acc>(workers * d.D);
  }
};

template <class Acc>
struct BackwardLayout {
  Acc *K, *V;          // [B, Hk, Sk, D]
  Acc *Q, *dO;         // [B, H, Sq, D]
  Acc *delta, *lse;    // [B, H, Sq]
  Acc *bias_row, *dbias_acc, *rows;  // per worker: Sk, max(Sk, H), 4 * D
  int64_t dbias_len;
  BackwardLayout(Arena& a, const Dims& d, int workers) {
    K = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    V = a.take<Acc>(d.B * d.Hk * d.Sk * d.D);
    Q = a.take<Acc>(d.B * d.H * d.Sq * d.D);
    dO = a.take<Acc>(d.B * d.H * d.Sq * d.D);
    delta = a.take<Acc>(d.B * d.H * d.Sq);
    lse = a.take<Acc>(d.B * d.H * d.Sq);
    bias_row = a.take<Acc>(workers * d.Sk);
    dbias_len = std::max(d.Sk, d.H);
    dbias_acc = a.take<Acc>(workers * dbias_len);
    rows = a.take<Acc>(workers * 4 * d.D);
  }
};

bool use_f64(const AttentionProblem& prob) { return prob.dtype == DType::f64; }

// Keys [0, end) pass causality for query i.
int64_t visible_end(const AttentionProblem& prob, int64_t i) {
  const Dims& d = prob.dims;
  return prob.causal ? std::clamp<int64_t>(i + d.causal_offset() + 1, 0, d.Sk) : d.Sk;
}

// The key visitor of query row (b, h, i): causality, then the mask, with the bias row.
template <class Acc>
struct RowKeys {
  int64_t end;
  const uint8_t* mask;  // null: no mask
  int64_t mask_stride;
  const Acc* bias;  // null: no bias
  template <class Emit>
  void operator()(Emit&& emit) const {
    for (int64_t j = 0; j < end; ++j) {
      if (mask && !mask[j * mask_stride]) continue;
      emit(j, bias ? bias[j] : Acc(0));
    }
  }
};

template <class Acc>
RowKeys<Acc> row_keys(const fdma_attention_params& p, const AttentionProblem& prob, int64_t b, int64_t h, int64_t i,
                      Acc* bias_buf) {
  const int64_t G = prob.dims.G();
  RowKeys<Acc> rk{visible_end(prob, i), nullptr, 0, nullptr};
  if (prob.mask.present) {
    rk.mask = static_cast<const uint8_t*>(p.mask.data) + prob.mask.offset(b, prob.mask.head_index(h, G), i, 0);
    rk.mask_stride = prob.mask.stride[3];
  }
  if (prob.bias.present) {
    const Broadcast& bb = prob.bias;
    load_strided(byte_ptr(p.bias.data, dtype_of(p.bias), bb.offset(b, bb.head_index(h, G), i, 0)), dtype_of(p.bias),
                 rk.end, bb.stride[3], bias_buf);
    rk.bias = bias_buf;
  }
  return rk;
}

template <class Acc>
void forward_impl(const fdma_attention_params& p, const AttentionProblem& prob) {
  const Dims& d = prob.dims;
  const int workers = detail::num_threads();
  Arena arena(p.workspace);
  ForwardLayout<Acc> L(arena, d, workers);
  pack_bshd(p.k, L.K);
  pack_bshd(p.v, L.V);
  const ScoreFn<Acc> f{Acc(prob.scale), Acc(prob.softcap)};
  const int64_t G = d.G(), D = d.D;
  detail::parallel_for(
      d.B * d.H * d.Sq, 8,
      [&](int64_t begin, int64_t end, int w) {
        Acc* q = L.q + w * D;
        Acc* out = L.out + w * D;
        for (int64_t r = begin; r < end; ++r) {
          const int64_t i = r % d.Sq, h = (r / d.Sq) % d.H, b = r / (d.Sq * d.H);
          const int64_t kv = (b * d.Hk + h / G) * d.Sk * D;
          load_bshd_row(p.q, b, i, h, q);
          Acc lse = softmax_row_forward(q, L.K + kv, L.V + kv, D, f, row_keys(p, prob, b, h, i, L.bias_row + w * d.Sk),
                                        L.scores + w * d.Sk, L.keys + w * d.Sk, out);
          store_bshd_row(p.out, b, i, h, out);
          if (p.lse.data) store_one(p.lse.data, dtype_of(p.lse), offset3(p.lse, b, h, i), lse);
        }
      },
      workers);
}

template <class Acc>
void backward_impl(const fdma_attention_params& p, const AttentionProblem& prob) {
  const Dims& d = prob.dims;
  const int workers = detail::num_threads();
  Arena arena(p.workspace);
  BackwardLayout<Acc> L(arena, d, workers);
  pack_bshd(p.k, L.K);
  pack_bshd(p.v, L.V);
  pack_bshd(p.q, L.Q);
  pack_bshd(p.dout, L.dO);
  const ScoreFn<Acc> f{Acc(prob.scale), Acc(prob.softcap)};
  const int64_t G = d.G(), D = d.D, Sq = d.Sq, Sk = d.Sk, H = d.H, Hk = d.Hk;
  const Broadcast& bias = prob.bias;
  const bool owner_a = prob.has_dbias && !(bias.size[2] == 1 && Sq > 1 && bias.size[3] == Sk);
  const bool owner_b = prob.has_dbias && !owner_a;
  const DType dbias_dt = dtype_of(p.dbias);
  auto dbias_offset = [&](int64_t b, int64_t hb, int64_t i, int64_t j) {
    const fdma_tensor& t = p.dbias;
    return (t.shape[0] > 1 ? b * t.stride[0] : 0) + (t.shape[1] > 1 ? hb * t.stride[1] : 0) +
           (t.shape[2] > 1 ? i * t.stride[2] : 0) + (t.shape[3] > 1 ? j * t.stride[3] : 0);
  };

  // Pass A: groups of query rows; with owner_a, one group per dbias row [b', h', i', :].
  const int64_t na_b = owner_a ? bias.size[0] : d.B;
  const int64_t na_h = owner_a ? bias.size[1] : H;
  const int64_t na_q = owner_a ? bias.size[2] : Sq;
  detail::parallel_for(
      na_b * na_h * na_q, 4,
      [&](int64_t begin, int64_t end, int w) {
        Acc* dq = L.rows + w * 4 * D;
        Acc* o = dq + D;
        Acc* acc = L.dbias_acc + w * L.dbias_len;
        for (int64_t g = begin; g < end; ++g) {
          const int64_t gq = g % na_q, gh = (g / na_q) % na_h, gb = g / (na_q * na_h);
          const Range rb = na_b == d.B ? Range{gb, gb + 1} : Range{0, d.B};
          const Range rh = na_h == H ? Range{gh, gh + 1} : na_h == Hk ? Range{gh * G, gh * G + G} : Range{0, H};
          const Range ri = na_q == Sq ? Range{gq, gq + 1} : Range{0, Sq};
          if (owner_a) fill(acc, bias.size[3], Acc(0));
          for (int64_t b = rb.lo; b < rb.hi; ++b)
            for (int64_t h = rh.lo; h < rh.hi; ++h)
              for (int64_t i = ri.lo; i < ri.hi; ++i) {
                const int64_t row = (b * H + h) * Sq + i;
                const int64_t kv = (b * Hk + h / G) * Sk * D;
                const Acc* q = L.Q + row * D;
                const Acc* dout = L.dO + row * D;
                load_bshd_row(p.out, b, i, h, o);
                const Acc delta = dot(dout, o, D);
                const Acc lse = load_one<Acc>(p.lse.data, dtype_of(p.lse), offset3(p.lse, b, h, i));
                L.delta[row] = delta;
                L.lse[row] = lse;
                auto sink = [&](int64_t j, Acc ds) {
                  if (owner_a) acc[bias.size[3] == 1 ? 0 : j] += ds;
                };
                softmax_row_backward(q, dout, delta, lse, L.K + kv, L.V + kv, D, f,
                                     row_keys(p, prob, b, h, i, L.bias_row + w * Sk), sink, dq);
                store_bshd_row(p.dq, b, i, h, dq);
              }
          if (owner_a)
            for (int64_t j = 0; j < bias.size[3]; ++j)
              store_one(p.dbias.data, dbias_dt, dbias_offset(gb, gh, gq, j), acc[j]);
        }
      },
      workers);

  // Pass B: groups of key columns; with owner_b, one group per set of dbias [b', :, 0, j].
  const int64_t nb_b = owner_b ? bias.size[0] : d.B;
  const int64_t nb_kv = owner_b && bias.size[1] == 1 ? 1 : Hk;
  const int64_t off = d.causal_offset();
  detail::parallel_for(
      nb_b * nb_kv * Sk, 4,
      [&](int64_t begin, int64_t end, int w) {
        Acc* dk = L.rows + w * 4 * D + 2 * D;
        Acc* dv = dk + D;
        Acc* acc = L.dbias_acc + w * L.dbias_len;
        for (int64_t g = begin; g < end; ++g) {
          const int64_t j = g % Sk, gkv = (g / Sk) % nb_kv, gb = g / (Sk * nb_kv);
          const Range rb = nb_b == d.B ? Range{gb, gb + 1} : Range{0, d.B};
          const Range rkv = nb_kv == Hk ? Range{gkv, gkv + 1} : Range{0, Hk};
          if (owner_b) fill(acc, bias.size[1], Acc(0));
          const int64_t i0 = prob.causal ? std::max<int64_t>(0, j - off) : 0;
          for (int64_t b = rb.lo; b < rb.hi; ++b)
            for (int64_t hk = rkv.lo; hk < rkv.hi; ++hk) {
              const int64_t kv = ((b * Hk + hk) * Sk + j) * D;
              fill(dk, D, Acc(0));
              fill(dv, D, Acc(0));
              for (int64_t h = hk * G; h < hk * G + G; ++h) {
                const int64_t head = (b * H + h) * Sq;
                const uint8_t* mask = prob.mask.present ? static_cast<const uint8_t*>(p.mask.data) +
                                                              prob.mask.offset(b, prob.mask.head_index(h, G), 0, j)
                                                        : nullptr;
                const int64_t hb = bias.head_index(h, G);
                auto visit = [&](auto&& emit) {
                  for (int64_t i = i0; i < Sq; ++i) {
                    if (mask && !mask[i * prob.mask.stride[2]]) continue;
                    emit(i, bias.present ? load_one<Acc>(p.bias.data, dtype_of(p.bias), bias.offset(b, hb, i, j)) : Acc(0));
                  }
                };
                auto sink = [&](int64_t, Acc ds) {
                  if (owner_b) acc[hb] += ds;
                };
                softmax_col_backward(L.K + kv, L.V + kv, L.Q + head * D, L.dO + head * D, L.delta + head, L.lse + head, D,
                                     f, visit, sink, dk, dv);
              }
              store_bshd_row(p.dk, b, j, hk, dk);
              store_bshd_row(p.dv, b, j, hk, dv);
            }
          if (owner_b) {
            const int64_t hb_lo = bias.head_index(rkv.lo * G, G), hb_hi = bias.head_index(rkv.hi * G - 1, G) + 1;
            for (int64_t hb = hb_lo; hb < hb_hi; ++hb) store_one(p.dbias.data, dbias_dt, dbias_offset(gb, hb, 0, j), acc[hb]);
          }
        }
      },
      workers);
}

template <class Acc>
size_t workspace_bytes(const AttentionProblem& prob, Pass pass) {
  Arena a;
  if (pass == Pass::forward)
    ForwardLayout<Acc>(a, prob.dims, detail::num_threads());
  else
    BackwardLayout<Acc>(a, prob.dims, detail::num_threads());
  return a.bytes();
}

}  // namespace

size_t attention_workspace(const AttentionProblem& prob, Pass pass) {
  return use_f64(prob) ? workspace_bytes<double>(prob, pass) : workspace_bytes<float>(prob, pass);
}

void attention_forward(const fdma_attention_params& p, const AttentionProblem& prob) {
  use_f64(prob) ? forward_impl<double>(p, prob) : forward_impl<float>(p, prob);
}

void attention_backward(const fdma_attention_params& p, const AttentionProblem& prob) {
  use_f64(prob) ? backward_impl<double>(p, prob) : backward_impl<float>(p, prob);
}

}  // namespace fdma::cpu
