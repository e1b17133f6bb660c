// Packed variable-length batches (fdma.h, "varlen") on the CPU against the float64 reference
// on the whole packed batch (varlen_case.hpp): empty sequences (no query, no key, neither),
// length 1, lengths off every tile size, Sq != Sk per sequence, GQA, causal and not, ties, key
// padding, per-key bias and mask, softcap, every dtype; and the checks of cu_seqlens.
#include <gtest/gtest.h>

#include "varlen_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

void run(const VarlenCase& c) {
  SCOPED_TRACE(c.str());
  VarlenRun r(c);
  r.forward();
  r.check_forward();
  r.backward();
  r.check_backward();
}

const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> kLengths = {
    {{5, 0, 17, 1}, {5, 3, 30, 1}},           // an empty query side, Sq != Sk
    {{0, 0}, {0, 4}},                         // no query at all
    {{3, 70, 2}, {0, 65, 9}},                 // a sequence with no key; more queries than keys
    {{1, 1, 1, 1, 1}, {1, 2, 3, 4, 5}},       // one query each
    {{129, 64, 33}, {129, 64, 33}},           // past the CPU's query tile
};

}  // namespace

TEST(Varlen, DynamicMaskAttention) {
  uint64_t seed = 1;
  for (const auto& [ql, kl] : kLengths)
    for (auto [H, Hk] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {4, 1}})
      for (int64_t w : {1, 6, 200})
        for (bool causal : {true, false}) {
          VarlenCase c;
          c.q_lens = ql, c.k_lens = kl, c.H = H, c.Hk = Hk, c.w = w, c.causal = causal, c.seed = seed++;
          run(c);
        }
}

TEST(Varlen, DynamicMaskTiesPaddingSoftcapDtypes) {
  uint64_t seed = 500;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (bool ties : {false, true})
      for (bool padding : {false, true}) {
        VarlenCase c;
        c.q_lens = {9, 0, 40, 3}, c.k_lens = {20, 2, 40, 7};
        c.dtype = dt, c.ties = ties, c.padding = padding, c.add_scores = !ties, c.softcap = padding ? 2.0 : 0.0;
        c.w = 5, c.seed = seed++;
        run(c);
      }
}

TEST(Varlen, Attention) {
  uint64_t seed = 1000;
  for (const auto& [ql, kl] : kLengths)
    for (int64_t bias_heads : {0, 1, 2, 4})
      for (bool causal : {true, false}) {
        VarlenCase c;
        c.dynamic = false;
        c.q_lens = ql, c.k_lens = kl, c.H = 4, c.Hk = 2, c.causal = causal, c.bias_heads = bias_heads;
        c.mask = bias_heads == 2 || bias_heads == 4, c.mask_heads = bias_heads == 4 ? 2 : 1;
        c.softcap = bias_heads == 1 ? 3.0 : 0.0, c.seed = seed++;
        run(c);
      }
}

TEST(Varlen, NoSequences) {
  for (bool dynamic : {true, false}) {
    VarlenCase c;
    c.q_lens = {}, c.k_lens = {}, c.dynamic = dynamic;
    run(c);
  }
}

// Packed batches whose offsets or sizes are wrong: a clear error naming the argument, nothing
// written.
TEST(Varlen, BadSeqlensAreRejected) {
  VarlenCase c;
  c.q_lens = {4, 6}, c.k_lens = {5, 7};
  auto expect_bad = [&](auto&& edit, const std::string& needle) {
    VarlenRun r(c);
    r.out.poison();
    DmaParams p = r.dma_params();
    edit(r, p);
    std::vector<unsigned char> ws(1 << 20);
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    try {
      dma_forward(p);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(r.out.all_poisoned()) << needle;
  };
  expect_bad([](VarlenRun& r, DmaParams& p) { r.cu_q.set(1, 7), r.cu_q.set(2, 5), p.max_seqlen_q = 100; }, "non-decreasing");
  expect_bad([](VarlenRun& r, DmaParams&) { r.cu_k.set(2, 11); }, "expected total_k");
  expect_bad([](VarlenRun& r, DmaParams&) { r.cu_q.set(0, 1); }, "expected 0");
  expect_bad([](VarlenRun&, DmaParams& p) { p.max_seqlen_k = 6; }, "max_seqlen_k = 6");
  expect_bad([](VarlenRun&, DmaParams& p) { p.max_seqlen_q = -1; }, "max_seqlen_q");
  expect_bad([](VarlenRun&, DmaParams& p) { p.cu_seqlens_k = Tensor(); }, "go together");
  expect_bad([](VarlenRun&, DmaParams& p) { p.cu_seqlens_k.shape[0] = 2; }, "cu_seqlens_k has 2 entries");
  expect_bad([](VarlenRun&, DmaParams& p) { p.cu_seqlens_q.dtype = FDMA_FLOAT32; }, "cu_seqlens_q has dtype");
  expect_bad([](VarlenRun&, DmaParams& p) { p.cu_seqlens_q.ndim = 2; }, "cu_seqlens_q must have 1 dims");
  expect_bad([](VarlenRun&, DmaParams& p) { p.q.ndim = 4; }, "[total_q, H, D]");
  expect_bad([](VarlenRun&, DmaParams& p) { p.v.shape[0] = 3; }, "v has shape");
  expect_bad([](VarlenRun&, DmaParams& p) { p.lse.shape[1] = 3; }, "total_q");
  expect_bad([](VarlenRun&, DmaParams& p) { p.key_scores.shape[1] = 3; }, "key_scores.shape[1]");
  expect_bad([](VarlenRun&, DmaParams& p) { p.key_padding.ndim = 2; }, "key_padding must have 1 dims");
}

// An output on top of the offsets would move the sequences while the call runs (the fuzz
// target found lse placed over cu_seqlens_q: later sequences read rows past the tensors).
TEST(Varlen, OutputsOnTopOfTheOffsetsAreRejected) {
  for (bool dynamic : {true, false}) {
    VarlenCase c;
    c.q_lens = {4, 6}, c.k_lens = {5, 7}, c.dynamic = dynamic;
    VarlenRun r(c);
    r.out.poison();
    std::vector<unsigned char> ws(1 << 20);
    try {
      if (dynamic) {
        DmaParams p = r.dma_params();
        p.lse.data = p.cu_seqlens_q.data;
        p.workspace = ws.data(), p.workspace_bytes = ws.size();
        dma_forward(p);
      } else {
        AttentionParams p = r.attention_params();
        p.lse.data = p.cu_seqlens_k.data;
        p.workspace = ws.data(), p.workspace_bytes = ws.size();
        attention_forward(p);
      }
      ADD_FAILURE() << "accepted lse on top of the offsets, dynamic " << dynamic;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
      const std::string want = dynamic ? "overlaps input cu_seqlens_q" : "overlaps input cu_seqlens_k";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_TRUE(r.out.all_poisoned()) << "dynamic " << dynamic;
  }
}

TEST(Varlen, BadPerKeyBiasIsRejected) {
  VarlenCase c;
  c.dynamic = false, c.bias_heads = 2;
  VarlenRun r(c);
  AttentionParams p = r.attention_params();
  p.bias.shape[0] = 3;
  try {
    attention_forward(p);
    ADD_FAILURE() << "accepted a bias with 3 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias.shape[0] = 3"), std::string::npos) << e.what();
  }
}
