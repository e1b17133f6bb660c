// Problems with no batch, no query or no key, through every operation: no kernel runs, and
// what has elements comes back as such a problem computes it (SDPA's and FlashAttention's
// answer): out 0 and lse -inf (no key attended), every gradient 0, every selection interval
// empty. Outputs start poisoned. `Place` puts host tensors where the call runs: host views
// (empty ones with a null data pointer, as frameworks pass them) or device copies.
//   Tensor put(HostTensor&)  and  void back()  (copies device outputs back to their hosts)
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "host_tensor.hpp"

namespace fdma::test {

struct EmptyShape {
  int64_t B, Sq, Sk;
  std::string str() const { return "B" + std::to_string(B) + " Sq" + std::to_string(Sq) + " Sk" + std::to_string(Sk); }
};

inline std::vector<EmptyShape> empty_shapes() { return {{0, 5, 7}, {2, 0, 7}, {2, 5, 0}, {0, 0, 0}}; }

inline void expect_all(const HostTensor& t, double value, const char* name) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.get(i);
    if (std::isinf(value) ? x != value : x != value) {
      ADD_FAILURE() << name << "[" << i << "] = " << x << ", expected " << value;
      return;
    }
  }
}

template <class Place>
void check_empty_problems(Place& place, DType dt) {
  const int64_t H = 4, Hk = 2, D = 16;
  for (const EmptyShape& s : empty_shapes()) {
    SCOPED_TRACE(s.str());
    HostTensor q(dt, {s.B, s.Sq, H, D}), k(dt, {s.B, s.Sk, Hk, D}), v(dt, {s.B, s.Sk, Hk, D});
    HostTensor out(dt, {s.B, s.Sq, H, D}), lse(DType::f32, {s.B, H, s.Sq}), dout(dt, {s.B, s.Sq, H, D});
    HostTensor dq(dt, {s.B, s.Sq, H, D}), dk(dt, {s.B, s.Sk, Hk, D}), dv(dt, {s.B, s.Sk, Hk, D});
    HostTensor bias(DType::f32, {1, 1, 1, s.Sk}), dbias(DType::f32, {1, 1, 1, s.Sk});
    HostTensor scores(DType::f32, {s.B, Hk, s.Sk}), dscores(DType::f32, {s.B, Hk, s.Sk});
    HostTensor begin(DType::i32, {s.B, Hk, s.Sk}), end(DType::i32, {s.B, Hk, s.Sk});
    const std::vector<HostTensor*> outputs = {&out, &lse, &dq, &dk, &dv, &dbias, &dscores, &begin, &end};
    auto poison = [&] {
      for (HostTensor* t : outputs) t->poison();
    };
    const bool attends = s.B > 0 && s.Sq > 0;  // out and lse have elements

    {  // attention, forward and backward (with a per-key bias and its gradient)
      poison();
      AttentionParams p;
      p.q = place.put(q), p.k = place.put(k), p.v = place.put(v), p.bias = place.put(bias);
      p.out = place.put(out), p.lse = place.put(lse), p.causal = 1;
      EXPECT_EQ(attention_workspace_size(p, Pass::forward), 0u);
      attention_forward(p);
      p.dout = place.put(dout), p.dq = place.put(dq), p.dk = place.put(dk), p.dv = place.put(dv);
      p.dbias = place.put(dbias);
      EXPECT_EQ(attention_workspace_size(p, Pass::backward), 0u);
      attention_backward(p);
      place.back();
      if (attends) expect_all(out, 0.0, "attention out"), expect_all(lse, -INFINITY, "attention lse");
      expect_all(dq, 0.0, "attention dq"), expect_all(dk, 0.0, "attention dk"), expect_all(dv, 0.0, "attention dv");
      expect_all(dbias, 0.0, "attention dbias");
    }
    {  // dynamic_mask_attention, forward (writing the selection) and backward
      poison();
      DmaParams p;
      p.q = place.put(q), p.k = place.put(k), p.v = place.put(v), p.key_scores = place.put(scores);
      p.window = 3, p.causal = 1, p.add_scores = 1;
      p.out = place.put(out), p.lse = place.put(lse), p.keep_begin = place.put(begin), p.keep_end = place.put(end);
      EXPECT_EQ(dma_workspace_size(p, Pass::forward), 0u);
      dma_forward(p);
      p.dout = place.put(dout), p.dq = place.put(dq), p.dk = place.put(dk), p.dv = place.put(dv);
      p.dkey_scores = place.put(dscores);
      dma_backward(p);
      place.back();
      if (attends) expect_all(out, 0.0, "dma out"), expect_all(lse, -INFINITY, "dma lse");
      expect_all(begin, 0.0, "keep_begin"), expect_all(end, 0.0, "keep_end");
      expect_all(dq, 0.0, "dma dq"), expect_all(dk, 0.0, "dma dk"), expect_all(dv, 0.0, "dma dv");
      expect_all(dscores, 0.0, "dkey_scores");
    }
    {  // select with no query: every key kept by none
      poison();
      SelectParams p;
      p.key_scores = place.put(scores), p.keep_begin = place.put(begin), p.keep_end = place.put(end);
      p.num_queries = s.Sq, p.window = 3, p.causal = 1;
      EXPECT_EQ(select_workspace_size(p), 0u);
      select_keys(p);
      place.back();
      if (s.Sq == 0) expect_all(begin, 0.0, "select keep_begin"), expect_all(end, 0.0, "select keep_end");
    }
    if (s.B == 0 || s.Sq == 0) {  // a KV-cache call with no query reads and writes nothing
      HostTensor kc(dt, {s.B, 8, Hk, D}), vc(dt, {s.B, 8, Hk, D}), sc(DType::f32, {s.B, Hk, 8});
      HostTensor lens(DType::i32, {s.B});
      KvCacheParams p;
      p.q = place.put(q), p.k_cache = place.put(kc), p.v_cache = place.put(vc), p.score_cache = place.put(sc);
      p.cache_seqlens = place.put(lens), p.window = 3, p.causal = 1, p.out = place.put(out);
      EXPECT_EQ(kvcache_workspace_size(p), 0u);
      kvcache_forward(p);
      place.back();
    }
  }
}

}  // namespace fdma::test
