// Independent float64 check of a dynamic_mask_attention run on a slice of it: sampled query
// rows (out, lse, dq) and sampled keys (dk, dv, dkey_scores). Each query's kept keys come
// from brute force (rank every candidate), never from the library's selection.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <thread>
#include <vector>

#include "dma_problem.hpp"

namespace fdma::tool {

class SliceReference {
 public:
  explicit SliceReference(const DmaProblemData& data) : d_(data), s_(data.s) {
    scale_ = 1.0 / std::sqrt(double(s_.D));
  }

  struct Row {
    std::vector<int64_t> keys;  // kept keys
    std::vector<double> p, capped, out, dq;
    double lse = -INFINITY, delta = 0;
  };

  // Brute force: candidates of query i, the w best by (score desc, index asc).
  std::vector<int64_t> kept_keys(int64_t b, int64_t hk, int64_t i) const {
    std::vector<int64_t> cand;
    const int64_t last = s_.causal ? std::min(s_.Sk - 1, i + s_.Sk - s_.Sq) : s_.Sk - 1;
    for (int64_t j = 0; j <= last; ++j) cand.push_back(j);
    auto above = [&](int64_t x, int64_t y) {
      double sx = score(b, hk, x), sy = score(b, hk, y);
      return sx != sy ? sx > sy : x < y;
    };
    if (int64_t(cand.size()) > s_.w) {
      std::nth_element(cand.begin(), cand.begin() + s_.w, cand.end(), above);
      cand.resize(s_.w);
    }
    std::sort(cand.begin(), cand.end());
    return cand;
  }

  const Row& row(int64_t b, int64_t h, int64_t i) {
    auto key = std::make_tuple(b, h, i);
    auto it = rows_.find(key);
    if (it != rows_.end()) return it->second;
    Row r;
    const int64_t hk = h / (s_.H / s_.Hk);
    r.keys = kept_keys(b, hk, i);
    double m = -INFINITY;
    std::vector<double> sc;
    for (int64_t j : r.keys) {
      double c = scale_ * dotqk(b, h, i, j);
      r.capped.push_back(c);
      sc.push_back(c + score(b, hk, j));
      m = std::max(m, sc.back());
    }
    r.out.assign(s_.D, 0.0);
    r.dq.assign(s_.D, 0.0);
    if (!r.keys.empty()) {
      double l = 0;
      for (double x : sc) l += std::exp(x - m);
      r.lse = m + std::log(l);
      for (size_t t = 0; t < r.keys.size(); ++t) {
        r.p.push_back(std::exp(sc[t] - r.lse));
        for (int64_t dd = 0; dd < s_.D; ++dd) r.out[dd] += r.p[t] * kv(d_.v, b, r.keys[t], hk, dd);
      }
      for (int64_t dd = 0; dd < s_.D; ++dd) r.delta += qrow(d_.dout, b, i, h, dd) * r.out[dd];
      for (size_t t = 0; t < r.keys.size(); ++t) {
        const double ds = r.p[t] * (dot_dout_v(b, h, i, r.keys[t]) - r.delta);
        for (int64_t dd = 0; dd < s_.D; ++dd) r.dq[dd] += ds * scale_ * kv(d_.k, b, r.keys[t], hk, dd);
      }
    }
    return rows_.emplace(key, std::move(r)).first->second;
  }

  struct KeyGrads {
    std::vector<double> dk, dv;
    double dscore = 0;
  };

  // Gradients of keys js of (b, hk): every query of the group that keeps one contributes. One
  // pass over the queries for all of js, in chunks over `threads` threads (summed in chunk
  // order, so the result does not depend on the threads); a query's lse and delta are worked
  // out only where it keeps one of js. Per key and query that walk was the slow part of the
  // check at long lengths.
  std::vector<KeyGrads> keys(int64_t b, int64_t hk, const std::vector<int64_t>& js, int threads) const {
    constexpr int64_t kChunk = 64;
    const int64_t n_chunks = (s_.Sq + kChunk - 1) / kChunk;
    std::vector<std::vector<KeyGrads>> part(n_chunks, std::vector<KeyGrads>(js.size(), empty_grads()));
    // The KV head's K and V rows as doubles, read once: the element accessor in the inner
    // loops made this check minutes long at 4K tokens.
    std::vector<double> kd(s_.Sk * s_.D), vd(s_.Sk * s_.D);
    for (int64_t j = 0; j < s_.Sk; ++j)
      for (int64_t dd = 0; dd < s_.D; ++dd)
        kd[j * s_.D + dd] = kv(d_.k, b, j, hk, dd), vd[j * s_.D + dd] = kv(d_.v, b, j, hk, dd);
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t c; (c = next.fetch_add(1)) < n_chunks;)
        for (int64_t i = c * kChunk; i < std::min(s_.Sq, (c + 1) * kChunk); ++i)
          add_query(b, hk, i, js, kd.data(), vd.data(), part[c]);
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < threads; ++w) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    std::vector<KeyGrads> g(js.size(), empty_grads());
    for (const auto& pc : part)
      for (size_t k = 0; k < js.size(); ++k) {
        for (int64_t dd = 0; dd < s_.D; ++dd) g[k].dk[dd] += pc[k].dk[dd], g[k].dv[dd] += pc[k].dv[dd];
        g[k].dscore += pc[k].dscore;
      }
    return g;
  }

 private:
  double score(int64_t b, int64_t hk, int64_t j) const { return d_.scores.get((b * s_.Hk + hk) * s_.Sk + j); }
  double qrow(const test::HostTensor& t, int64_t b, int64_t i, int64_t h, int64_t dd) const {
    return t.get(((b * s_.Sq + i) * s_.H + h) * s_.D + dd);
  }
  double kv(const test::HostTensor& t, int64_t b, int64_t j, int64_t hk, int64_t dd) const {
    return t.get(((b * s_.Sk + j) * s_.Hk + hk) * s_.D + dd);
  }
  double dotqk(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double x = 0;
    for (int64_t dd = 0; dd < s_.D; ++dd) x += qrow(d_.q, b, i, h, dd) * kv(d_.k, b, j, h / (s_.H / s_.Hk), dd);
    return x;
  }
  double dot_dout_v(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double x = 0;
    for (int64_t dd = 0; dd < s_.D; ++dd) x += qrow(d_.dout, b, i, h, dd) * kv(d_.v, b, j, h / (s_.H / s_.Hk), dd);
    return x;
  }
  KeyGrads empty_grads() const { return {std::vector<double>(s_.D, 0.0), std::vector<double>(s_.D, 0.0), 0.0}; }

  // Query i's contributions, over the group's heads, to those of keys js it keeps (kd, vd:
  // the KV head's K and V, [Sk][D] doubles).
  void add_query(int64_t b, int64_t hk, int64_t i, const std::vector<int64_t>& js, const double* kd, const double* vd,
                 std::vector<KeyGrads>& g) const {
    const std::vector<int64_t> kept = kept_keys(b, hk, i);
    std::vector<size_t> which;  // positions in js of the keys query i keeps
    for (size_t k = 0; k < js.size(); ++k)
      if (std::binary_search(kept.begin(), kept.end(), js[k])) which.push_back(k);
    if (which.empty()) return;
    const int64_t G = s_.H / s_.Hk, D = s_.D;
    auto dot = [D](const double* x, const double* y) {
      double a = 0;
      for (int64_t dd = 0; dd < D; ++dd) a += x[dd] * y[dd];
      return a;
    };
    std::vector<double> sc(kept.size()), out(D), q(D), dout(D);
    for (int64_t h = hk * G; h < hk * G + G; ++h) {
      for (int64_t dd = 0; dd < D; ++dd) q[dd] = qrow(d_.q, b, i, h, dd), dout[dd] = qrow(d_.dout, b, i, h, dd);
      double m = -INFINITY;
      for (size_t t = 0; t < kept.size(); ++t) {
        sc[t] = scale_ * dot(q.data(), kd + kept[t] * D) + score(b, hk, kept[t]);
        m = std::max(m, sc[t]);
      }
      double l = 0;
      for (double x : sc) l += std::exp(x - m);
      const double lse = m + std::log(l);
      std::fill(out.begin(), out.end(), 0.0);
      for (size_t t = 0; t < kept.size(); ++t) {
        const double pt = std::exp(sc[t] - lse);
        const double* vj = vd + kept[t] * D;
        for (int64_t dd = 0; dd < D; ++dd) out[dd] += pt * vj[dd];
      }
      const double delta = dot(dout.data(), out.data());
      for (size_t k : which) {
        const int64_t j = js[k];
        const double pj = std::exp(scale_ * dot(q.data(), kd + j * D) + score(b, hk, j) - lse);
        const double ds = pj * (dot(dout.data(), vd + j * D) - delta);
        for (int64_t dd = 0; dd < D; ++dd) {
          g[k].dv[dd] += pj * dout[dd];
          g[k].dk[dd] += ds * scale_ * q[dd];
        }
        g[k].dscore += ds;
      }
    }
  }

  const DmaProblemData& d_;
  Shape s_;
  double scale_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Row> rows_;
};

}  // namespace fdma::tool
