// The attention math of the CPU backend, one query row or one key column at a time. Both
// operations (attention with a mask/bias, dynamic_mask_attention with kept-key lists) feed
// these the keys a row sees, or the queries a column is seen by, through a visitor:
//   visit(emit) calls emit(index, bias) once per visible partner, in increasing index.
// K, V, Q and dO are packed [rows, D] arrays of the accumulation type Acc.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace fdma::cpu {

template <class Acc>
inline Acc dot(const Acc* a, const Acc* b, int64_t n) {
  Acc s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

template <class Acc>
inline void axpy(Acc alpha, const Acc* x, Acc* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

template <class Acc>
inline void fill(Acc* y, int64_t n, Acc value) {
  for (int64_t d = 0; d < n; ++d) y[d] = value;
}

// score = softcap(scale * q.k) + bias. `capped` is the part before the bias.
template <class Acc>
struct ScoreFn {
  Acc scale, softcap;  // softcap 0 = off
  Acc capped(Acc qk) const {
    Acc x = scale * qk;
    return softcap > 0 ? softcap * std::tanh(x / softcap) : x;
  }
  // d capped / d (q.k), from the capped value: scale * (1 - tanh^2).
  Acc dcapped(Acc capped_value) const {
    if (softcap > 0) {
      Acc t = capped_value / softcap;
      return scale * (Acc(1) - t * t);
    }
    return scale;
  }
};

template <class Acc>
constexpr Acc neg_inf() {
  return -std::numeric_limits<Acc>::infinity();
}

// Softmax of one row over its visible keys; writes the normalised output row and returns
// the natural-log sum-exp. A row with no visible key (or only -inf scores) gives zeros and
// -inf; a NaN score makes the row NaN, as the math says.
template <class Acc, class Visit>
Acc softmax_row_forward(const Acc* q, const Acc* K, const Acc* V, int64_t D, const ScoreFn<Acc>& f, Visit&& visit,
                        Acc* s_buf, int32_t* j_buf, Acc* out) {
  int64_t n = 0;
  Acc m = neg_inf<Acc>();
  bool nan = false;
  visit([&](int64_t j, Acc bias) {
    Acc s = f.capped(dot(q, K + j * D, D)) + bias;
    s_buf[n] = s;
    j_buf[n] = static_cast<int32_t>(j);
    ++n;
    if (s > m) m = s;
    nan |= std::isnan(s);
  });
  fill(out, D, Acc(0));
  if (nan) m = std::numeric_limits<Acc>::quiet_NaN();
  else if (m == neg_inf<Acc>()) return m;
  Acc l = 0;
  for (int64_t t = 0; t < n; ++t) {
    Acc p = std::exp(s_buf[t] - m);
    l += p;
    axpy(p, V + int64_t(j_buf[t]) * D, out, D);
  }
  const Acc inv = Acc(1) / l;
  for (int64_t d = 0; d < D; ++d) out[d] *= inv;
  return m + std::log(l);
}

// dq of one row (unscaled by nothing: dq is complete). sink(j, ds) receives dS for dbias.
template <class Acc, class Visit, class Sink>
void softmax_row_backward(const Acc* q, const Acc* dout, Acc delta, Acc lse, const Acc* K, const Acc* V, int64_t D,
                          const ScoreFn<Acc>& f, Visit&& visit, Sink&& sink, Acc* dq) {
  fill(dq, D, Acc(0));
  if (lse == neg_inf<Acc>()) return;  // nothing visible: zero gradients
  visit([&](int64_t j, Acc bias) {
    const Acc* k = K + j * D;
    Acc c = f.capped(dot(q, k, D));
    Acc p = std::exp(c + bias - lse);
    Acc ds = p * (dot(dout, V + j * D, D) - delta);
    sink(j, ds);
    axpy(ds * f.dcapped(c), k, dq, D);
  });
}

// Adds one head's contribution to dk and dv of one key column. Q, dO, delta and lse are
// that head's packed rows; visit(emit) gives the queries that see this key.
template <class Acc, class Visit, class Sink>
void softmax_col_backward(const Acc* k, const Acc* v, const Acc* Q, const Acc* dO, const Acc* delta, const Acc* lse,
                          int64_t D, const ScoreFn<Acc>& f, Visit&& visit, Sink&& sink, Acc* dk, Acc* dv) {
  visit([&](int64_t i, Acc bias) {
    if (lse[i] == neg_inf<Acc>()) return;
    const Acc* q = Q + i * D;
    const Acc* g = dO + i * D;
    Acc c = f.capped(dot(q, k, D));
    Acc p = std::exp(c + bias - lse[i]);
    axpy(p, g, dv, D);
    Acc ds = p * (dot(g, v, D) - delta[i]);
    sink(i, ds);
    axpy(ds * f.dcapped(c), q, dk, D);
  });
}

}  // namespace fdma::cpu
