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
    std::vector<double> p, out, dq;
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
    const int64_t hk = h / (s_.H / s_.Hk), D = s_.D;
    const KvRows& kvr = kv_rows(b, hk);
    r.keys = kept_keys(b, hk, i);
    const QueryRow qr = query_row(b, h, i);
    softmax_row(qr, b, hk, r.keys, kvr, r.p, r.out, r.lse, r.delta);
    r.dq.assign(D, 0.0);
    for (size_t t = 0; t < r.keys.size(); ++t) {
      const double* kj = kvr.k.data() + r.keys[t] * D;
      const double ds = r.p[t] * (dot(qr.dout.data(), kvr.v.data() + r.keys[t] * D) - r.delta);
      for (int64_t dd = 0; dd < D; ++dd) r.dq[dd] += ds * scale_ * kj[dd];
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
  std::vector<KeyGrads> keys(int64_t b, int64_t hk, const std::vector<int64_t>& js, int threads) {
    constexpr int64_t kChunk = 64;
    const int64_t n_chunks = (s_.Sq + kChunk - 1) / kChunk;
    std::vector<std::vector<KeyGrads>> part(n_chunks, std::vector<KeyGrads>(js.size(), empty_grads()));
    const KvRows& kvr = kv_rows(b, hk);  // before the threads: the cache is not thread-safe
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t c; (c = next.fetch_add(1)) < n_chunks;)
        for (int64_t i = c * kChunk; i < std::min(s_.Sq, (c + 1) * kChunk); ++i) add_query(b, hk, i, js, kvr, part[c]);
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
  // One (b, hk)'s K and V rows as doubles, [Sk][D] each, read once: the element accessor in
  // the inner loops made the key check minutes long at 4K tokens.
  struct KvRows {
    std::vector<double> k, v;
  };
  const KvRows& kv_rows(int64_t b, int64_t hk) {
    auto it = kv_.find({b, hk});
    if (it != kv_.end()) return it->second;
    KvRows r{std::vector<double>(s_.Sk * s_.D), std::vector<double>(s_.Sk * s_.D)};
    for (int64_t j = 0; j < s_.Sk; ++j)
      for (int64_t dd = 0; dd < s_.D; ++dd)
        r.k[j * s_.D + dd] = kv(d_.k, b, j, hk, dd), r.v[j * s_.D + dd] = kv(d_.v, b, j, hk, dd);
    return kv_.emplace(std::make_pair(b, hk), std::move(r)).first->second;
  }
  struct QueryRow {
    std::vector<double> q, dout;
  };
  QueryRow query_row(int64_t b, int64_t h, int64_t i) const {
    QueryRow r{std::vector<double>(s_.D), std::vector<double>(s_.D)};
    for (int64_t dd = 0; dd < s_.D; ++dd) r.q[dd] = qrow(d_.q, b, i, h, dd), r.dout[dd] = qrow(d_.dout, b, i, h, dd);
    return r;
  }
  double dot(const double* x, const double* y) const {
    double a = 0;
    for (int64_t dd = 0; dd < s_.D; ++dd) a += x[dd] * y[dd];
    return a;
  }
  // The softmax of a query row over its kept keys (scores scaled, plus the key scores): each
  // kept key's probability, out = sum p v, lse (-inf with nothing kept) and delta = dO . out.
  void softmax_row(const QueryRow& qr, int64_t b, int64_t hk, const std::vector<int64_t>& kept, const KvRows& kvr,
                   std::vector<double>& p, std::vector<double>& out, double& lse, double& delta) const {
    const int64_t D = s_.D;
    p.resize(kept.size());
    double m = -INFINITY;
    for (size_t t = 0; t < kept.size(); ++t) {
      p[t] = scale_ * dot(qr.q.data(), kvr.k.data() + kept[t] * D) + score(b, hk, kept[t]);
      m = std::max(m, p[t]);
    }
    double l = 0;
    for (double x : p) l += std::exp(x - m);
    lse = kept.empty() ? -INFINITY : m + std::log(l);
    out.assign(D, 0.0);
    for (size_t t = 0; t < kept.size(); ++t) {
      p[t] = std::exp(p[t] - lse);
      const double* vj = kvr.v.data() + kept[t] * D;
      for (int64_t dd = 0; dd < D; ++dd) out[dd] += p[t] * vj[dd];
    }
    delta = dot(qr.dout.data(), out.data());
  }

  double score(int64_t b, int64_t hk, int64_t j) const { return d_.scores.get((b * s_.Hk + hk) * s_.Sk + j); }
  double qrow(const test::HostTensor& t, int64_t b, int64_t i, int64_t h, int64_t dd) const {
    return t.get(((b * s_.Sq + i) * s_.H + h) * s_.D + dd);
  }
  double kv(const test::HostTensor& t, int64_t b, int64_t j, int64_t hk, int64_t dd) const {
    return t.get(((b * s_.Sk + j) * s_.Hk + hk) * s_.D + dd);
  }
  KeyGrads empty_grads() const { return {std::vector<double>(s_.D, 0.0), std::vector<double>(s_.D, 0.0), 0.0}; }

  // Query i's contributions, over the group's heads, to those of keys js it keeps.
  void add_query(int64_t b, int64_t hk, int64_t i, const std::vector<int64_t>& js, const KvRows& kvr,
                 std::vector<KeyGrads>& g) const {
    const std::vector<int64_t> kept = kept_keys(b, hk, i);
    std::vector<size_t> which;  // positions in js of the keys query i keeps
    for (size_t k = 0; k < js.size(); ++k)
      if (std::binary_search(kept.begin(), kept.end(), js[k])) which.push_back(k);
    if (which.empty()) return;
    const int64_t G = s_.H / s_.Hk, D = s_.D;
    std::vector<double> p, out;
    double lse = 0, delta = 0;
    for (int64_t h = hk * G; h < hk * G + G; ++h) {
      const QueryRow qr = query_row(b, h, i);
      softmax_row(qr, b, hk, kept, kvr, p, out, lse, delta);
      for (size_t k : which) {
        const int64_t j = js[k];
        const double pj = p[std::lower_bound(kept.begin(), kept.end(), j) - kept.begin()];
        const double ds = pj * (dot(qr.dout.data(), kvr.v.data() + j * D) - delta);
        for (int64_t dd = 0; dd < D; ++dd) {
          g[k].dv[dd] += pj * qr.dout[dd];
          g[k].dk[dd] += ds * scale_ * qr.q[dd];
        }
        g[k].dscore += ds;
      }
    }
  }

  const DmaProblemData& d_;
  Shape s_;
  double scale_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Row> rows_;
  std::map<std::pair<int64_t, int64_t>, KvRows> kv_;
};

}  // namespace fdma::tool
