// Naive float64 reference for every operation, written for clarity, not speed: dense
// [B, H, Sq, Sk] visibility and bias, explicit softmax, explicit gradient formulas, and a
// brute-force top-w selection (sort each query's candidates, take w). The tests compare the
// library against it; the `fdma` command uses it on slices of its main job. Its query rows
// run on all the machine's cores (the GPU tests spent most of their time here), each thread a
// contiguous run of rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

namespace fdma::ref {

struct Problem {
  int64_t B = 1, Sq = 1, Sk = 1, H = 1, Hk = 1, D = 1;
  double scale = 1, softcap = 0;
  bool causal = false;
  std::vector<double> q, k, v;  // [B, Sq, H, D], [B, Sk, Hk, D] logical row-major
  std::vector<uint8_t> keep;    // [B, H, Sq, Sk] mask (causality applied separately); empty = all
  std::vector<double> bias;     // [B, H, Sq, Sk]; empty = 0

  int64_t G() const { return H / Hk; }
  int64_t qi(int64_t b, int64_t i, int64_t h, int64_t d) const { return ((b * Sq + i) * H + h) * D + d; }
  int64_t ki(int64_t b, int64_t j, int64_t hk, int64_t d) const { return ((b * Sk + j) * Hk + hk) * D + d; }
  int64_t si(int64_t b, int64_t h, int64_t i, int64_t j) const { return ((b * H + h) * Sq + i) * Sk + j; }
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (causal && j > i + Sk - Sq) return false;
    return keep.empty() || keep[si(b, h, i, j)];
  }
  double capped(double x) const { return softcap > 0 ? softcap * std::tanh(x / softcap) : x; }
  // Capped score of (b, h, i, j), before the bias.
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += q[qi(b, i, h, d)] * k[ki(b, j, h / G(), d)];
    return capped(scale * s);
  }
};

// Threads for n rows: one per core, at most one per row, at least one.
inline int64_t worker_count(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
}

// fn(worker, lo, hi) over [0, n) in contiguous runs, one per worker (0 .. worker_count(n) - 1).
template <class Fn>
void parallel_runs(int64_t n, Fn&& fn) {
  const int64_t threads = worker_count(n);
  const int64_t per = n > 0 ? (n + threads - 1) / threads : 0;
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) pool.emplace_back([&fn, t, lo, hi] { fn(t, lo, hi); });
  }
  for (auto& th : pool) th.join();
}

// Softmax probabilities of one row over its visible keys; returns lse (-inf if none visible).
inline double row_probs(const Problem& p, int64_t b, int64_t h, int64_t i, std::vector<double>& prob,
                        std::vector<double>& capped) {
  prob.assign(p.Sk, 0.0);
  capped.assign(p.Sk, 0.0);
  double m = -std::numeric_limits<double>::infinity();
  bool nan = false;
  std::vector<double> s(p.Sk, -std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < p.Sk; ++j) {
    if (!p.visible(b, h, i, j)) continue;
    capped[j] = p.score(b, h, i, j);
    s[j] = capped[j] + (p.bias.empty() ? 0.0 : p.bias[p.si(b, h, i, j)]);
    if (std::isnan(s[j])) nan = true;
    m = std::max(m, s[j]);
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (m == -std::numeric_limits<double>::infinity()) return m;
  double l = 0;
  for (int64_t j = 0; j < p.Sk; ++j)
    if (p.visible(b, h, i, j)) l += std::exp(s[j] - m);
  for (int64_t j = 0; j < p.Sk; ++j)
    if (p.visible(b, h, i, j)) prob[j] = std::exp(s[j] - m) / l;
  return m + std::log(l);
}

struct Forward {
  std::vector<double> out, lse;  // [B, Sq, H, D], [B, H, Sq]
};

inline Forward forward(const Problem& p) {
  Forward f;
  f.out.assign(p.B * p.Sq * p.H * p.D, 0.0);
  f.lse.assign(p.B * p.H * p.Sq, 0.0);
  parallel_runs(p.B * p.H * p.Sq, [&](int64_t, int64_t lo, int64_t hi) {
    std::vector<double> prob, capped;
    for (int64_t row = lo; row < hi; ++row) {  // row = (b * H + h) * Sq + i
      const int64_t b = row / (p.H * p.Sq), h = row / p.Sq % p.H, i = row % p.Sq;
      double lse = row_probs(p, b, h, i, prob, capped);
      f.lse[(b * p.H + h) * p.Sq + i] = lse;
      // Keys outer, so that V is read along its rows; each out[d] still sums over j in order.
      double* o = &f.out[p.qi(b, i, h, 0)];
      for (int64_t j = 0; j < p.Sk && !std::isnan(lse); ++j)
        if (prob[j] != 0)
          for (int64_t d = 0; d < p.D; ++d) o[d] += prob[j] * p.v[p.ki(b, j, h / p.G(), d)];
      if (std::isnan(lse))
        for (int64_t d = 0; d < p.D; ++d) o[d] = lse;
    }
  });
  return f;
}

struct Backward {
  std::vector<double> dq, dk, dv;
  std::vector<double> dbias;  // full [B, H, Sq, Sk] dS; reduce with reduce_broadcast
};

inline Backward backward(const Problem& p, const std::vector<double>& dout) {
  Backward g;
  g.dq.assign(p.q.size(), 0.0);
  g.dk.assign(p.k.size(), 0.0);
  g.dv.assign(p.v.size(), 0.0);
  g.dbias.assign(p.B * p.H * p.Sq * p.Sk, 0.0);
  // dq and dS belong to one row each; dk and dv sum over rows: each worker into its own copy,
  // added up in worker order afterwards.
  const int64_t rows = p.B * p.H * p.Sq;
  std::vector<std::vector<double>> dk_of(worker_count(rows)), dv_of(worker_count(rows));
  parallel_runs(rows, [&](int64_t worker, int64_t lo, int64_t hi) {
    std::vector<double>& dk = dk_of[worker];
    std::vector<double>& dv = dv_of[worker];
    dk.assign(p.k.size(), 0.0);
    dv.assign(p.v.size(), 0.0);
    std::vector<double> prob, capped;
    for (int64_t row = lo; row < hi; ++row) {  // row = (b * H + h) * Sq + i
      const int64_t b = row / (p.H * p.Sq), h = row / p.Sq % p.H, i = row % p.Sq;
      double lse = row_probs(p, b, h, i, prob, capped);
      if (lse == -std::numeric_limits<double>::infinity()) continue;
      const int64_t hk = h / p.G();
      // The forward's out: keys with no probability add nothing (nor their V rows' NaN or inf).
      std::vector<double> o(p.D, 0.0);
      for (int64_t j = 0; j < p.Sk; ++j)
        if (prob[j] != 0)
          for (int64_t d = 0; d < p.D; ++d) o[d] += prob[j] * p.v[p.ki(b, j, hk, d)];
      double delta = 0;
      for (int64_t d = 0; d < p.D; ++d) delta += dout[p.qi(b, i, h, d)] * o[d];
      for (int64_t j = 0; j < p.Sk; ++j) {
        if (!p.visible(b, h, i, j)) continue;
        double dp = 0;
        for (int64_t d = 0; d < p.D; ++d) dp += dout[p.qi(b, i, h, d)] * p.v[p.ki(b, j, hk, d)];
        const double ds = prob[j] * (dp - delta);
        g.dbias[p.si(b, h, i, j)] = ds;
        double dx = ds * p.scale;
        if (p.softcap > 0) {
          double t = capped[j] / p.softcap;
          dx *= 1 - t * t;
        }
        for (int64_t d = 0; d < p.D; ++d) {
          g.dq[p.qi(b, i, h, d)] += dx * p.k[p.ki(b, j, hk, d)];
          dk[p.ki(b, j, hk, d)] += dx * p.q[p.qi(b, i, h, d)];
          dv[p.ki(b, j, hk, d)] += prob[j] * dout[p.qi(b, i, h, d)];
        }
      }
    }
  });
  for (size_t w = 0; w < dk_of.size(); ++w) {
    if (dk_of[w].empty()) continue;  // a worker with no rows
    for (size_t e = 0; e < g.dk.size(); ++e) g.dk[e] += dk_of[w][e], g.dv[e] += dv_of[w][e];
  }
  return g;
}

// Sums a full [B, H, Sq, Sk] array into a declared [b', h', q', k'] broadcast shape (each dim 1
// or full; h' in {1, Hk, H}).
inline std::vector<double> reduce_broadcast(const Problem& p, const std::vector<double>& full,
                                            const std::vector<int64_t>& shape) {
  std::vector<double> r(shape[0] * shape[1] * shape[2] * shape[3], 0.0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Sq; ++i)
        for (int64_t j = 0; j < p.Sk; ++j) {
          int64_t hb = shape[1] == p.H ? h : shape[1] == p.Hk ? h / p.G() : 0;
          int64_t idx = (((shape[0] > 1 ? b : 0) * shape[1] + hb) * shape[2] + (shape[2] > 1 ? i : 0)) * shape[3] +
                        (shape[3] > 1 ? j : 0);
          r[idx] += full[p.si(b, h, i, j)];
        }
  return r;
}

// Whether key x of a row of scores s ranks above key y: the higher score first, NaN lowest,
// equal scores (-0.0 and +0.0 too) by the lower index.
inline bool ranks_above(const double* s, int64_t x, int64_t y) {
  const bool nx = std::isnan(s[x]), ny = std::isnan(s[y]);
  if (nx != ny) return ny;
  if (!nx && s[x] != s[y]) return s[x] > s[y];
  return x < y;
}

// Brute-force top-w: keep[(b*Hk + hk)*Sq + i][j]. Candidates of query i: existing keys, and
// with causal only j <= i + Sk - Sq; ranked by score (NaN lowest) then lower index.
inline std::vector<uint8_t> select_brute(const std::vector<double>& scores, const std::vector<uint8_t>& padding,
                                         int64_t B, int64_t Hk, int64_t Sq, int64_t Sk, int64_t w, bool causal) {
  std::vector<uint8_t> keep(B * Hk * Sq * Sk, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hk; ++hk) {
      const double* s = scores.data() + (b * Hk + hk) * Sk;
      auto above = [&](int64_t x, int64_t y) { return ranks_above(s, x, y); };
      for (int64_t i = 0; i < Sq; ++i) {
        std::vector<int64_t> cand;
        for (int64_t j = 0; j < Sk; ++j) {
          if (!padding.empty() && !padding[b * Sk + j]) continue;
          if (causal && j > i + Sk - Sq) continue;
          cand.push_back(j);
        }
        std::sort(cand.begin(), cand.end(), above);
        for (int64_t t = 0; t < std::min<int64_t>(w, cand.size()); ++t) keep[((b * Hk + hk) * Sq + i) * Sk + cand[t]] = 1;
      }
    }
  return keep;
}

// The same top-w as select_brute from one sort of each row's keys: query i keeps the first w
// keys of the row's rank order that it may see. select_brute sorts again for every query
// (half a second for 3000 queries of 3000 keys); the suites' cases use this one, and
// Selection.RankedReferenceMatchesBruteForce checks the two agree.
inline std::vector<uint8_t> select_ranked(const std::vector<double>& scores, const std::vector<uint8_t>& padding,
                                          int64_t B, int64_t Hk, int64_t Sq, int64_t Sk, int64_t w, bool causal) {
  std::vector<uint8_t> keep(B * Hk * Sq * Sk, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hk; ++hk) {
      const double* s = scores.data() + (b * Hk + hk) * Sk;
      auto above = [&](int64_t x, int64_t y) { return ranks_above(s, x, y); };
      std::vector<int64_t> order;
      for (int64_t j = 0; j < Sk; ++j)
        if (padding.empty() || padding[b * Sk + j]) order.push_back(j);
      std::sort(order.begin(), order.end(), above);
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t last = causal ? i + Sk - Sq : Sk - 1;  // the last key query i may see
        int64_t taken = 0;
        for (int64_t j : order) {
          if (taken >= w) break;
          if (j > last) continue;
          keep[((b * Hk + hk) * Sq + i) * Sk + j] = 1;
          ++taken;
        }
      }
    }
  return keep;
}

}  // namespace fdma::ref
