// Independent float64 check of a dynamic_mask_attention run on a slice of it: sampled query
// rows (out, lse, dq) and sampled keys (dk, dv, dkey_scores). Each query's kept keys come
// from brute force (rank every candidate), never from the library's selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
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

  // Gradients of key j of (b, hk): every query of the group that keeps j contributes.
  KeyGrads key(int64_t b, int64_t hk, int64_t j) {
    KeyGrads g;
    g.dk.assign(s_.D, 0.0);
    g.dv.assign(s_.D, 0.0);
    const int64_t G = s_.H / s_.Hk;
    for (int64_t i = 0; i < s_.Sq; ++i) {
      if (s_.causal && j > i + s_.Sk - s_.Sq) continue;
      if (!keeps(b, hk, i, j)) continue;
      for (int64_t h = hk * G; h < hk * G + G; ++h) {
        const Row& r = row(b, h, i);
        const size_t t = std::find(r.keys.begin(), r.keys.end(), j) - r.keys.begin();
        const double ds = r.p[t] * (dot_dout_v(b, h, i, j) - r.delta);
        for (int64_t dd = 0; dd < s_.D; ++dd) {
          g.dv[dd] += r.p[t] * qrow(d_.dout, b, i, h, dd);
          g.dk[dd] += ds * scale_ * qrow(d_.q, b, i, h, dd);
        }
        g.dscore += ds;
      }
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
  // Query i keeps key j iff fewer than w of its candidates rank above j.
  bool keeps(int64_t b, int64_t hk, int64_t i, int64_t j) const {
    const int64_t last = s_.causal ? std::min(s_.Sk - 1, i + s_.Sk - s_.Sq) : s_.Sk - 1;
    const double sj = score(b, hk, j);
    int64_t above = 0;
    for (int64_t x = 0; x <= last && above < s_.w; ++x) {
      const double sx = score(b, hk, x);
      above += sx > sj || (sx == sj && x < j);
    }
    return above < s_.w;
  }

  const DmaProblemData& d_;
  Shape s_;
  double scale_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Row> rows_;
};

}  // namespace fdma::tool
