// Every bad input a user can trip over, through the C++ API (fdma::Error) and the C ABI
// (status + fdma_last_error), each checked to leave every output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "attention_case.hpp"
#include "dma_case.hpp"
#include "fdma/fdma.h"

using namespace fdma;
using namespace fdma::test;

namespace {

template <class P>
struct Bad {
  std::string name;
  std::function<void(P&)> mutate;
  Status status;
  std::string needle;
};

AttnCase small_attention() {
  AttnCase c;
  c.B = 2, c.Sq = 5, c.Sk = 6, c.H = 4, c.Hk = 2, c.D = 8, c.seed = 3;
  c.mask.present = true;
  c.bias.present = true;
  return c;
}

DmaCase small_dma() {
  DmaCase c;
  c.B = 2, c.Sq = 5, c.Sk = 6, c.H = 4, c.Hk = 2, c.D = 8, c.w = 3, c.seed = 4;
  return c;
}

Status cuda_request_status() { return cuda_available() ? Status::invalid_argument : Status::unsupported; }
std::string cuda_request_needle() { return cuda_available() ? "is host memory" : "needs a CUDA build"; }

// Runs `call` (C++) and `c_call` (C ABI) on mutated params; both must fail as expected and
// leave `outputs` poisoned.
template <class P>
void expect_rejected(const Bad<P>& bad, const P& valid, std::vector<HostTensor*> outputs,
                     const std::function<void(const P&)>& call, const std::function<int32_t(const P*)>& c_call) {
  SCOPED_TRACE(bad.name);
  P p = valid;
  bad.mutate(p);
  for (HostTensor* t : outputs) t->poison();
  try {
    call(p);
    ADD_FAILURE() << "accepted bad input: " << bad.name;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), bad.status) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad.needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << bad.needle << "\"";
  }
  const int32_t st = c_call(&p);
  EXPECT_EQ(st, static_cast<int32_t>(bad.status)) << fdma_last_error();
  EXPECT_NE(std::string(fdma_last_error()).find(bad.needle), std::string::npos) << fdma_last_error();
  for (HostTensor* t : outputs) EXPECT_TRUE(t->all_poisoned()) << "an output was written on error";
}

template <class P>
std::vector<Bad<P>> common_qkv_cases() {
  const Status inv = Status::invalid_argument;
  return {
      {"null q", [](P& p) { p.q.data = nullptr; }, inv, "q is required but its data pointer is null"},
      {"zero heads", [](P& p) { p.q.shape[2] = 0; }, inv, "q.shape[2] must be >= 1, got 0"},
      {"zero kv heads", [](P& p) { p.k.shape[2] = p.v.shape[2] = 0; }, inv, "k.shape[2] must be >= 1, got 0"},
      {"negative B", [](P& p) { p.k.shape[0] = -2; }, inv, "k.shape[0] must be >= 0, got -2"},
      // Found by the fuzzer: an extent of exactly INT64_MAX elements overflowed the check itself.
      {"stride INT64_MAX", [](P& p) { p.k.stride[0] = std::numeric_limits<int64_t>::max(); }, inv,
       "k spans more than 2^50 bytes"},
      {"stride 2^62", [](P& p) { p.v.stride[1] = int64_t(1) << 62; }, inv, "v spans more than 2^50 bytes"},
      {"wrong rank", [](P& p) { p.q.ndim = 3; }, inv, "q must have 4 dims"},
      {"rank 5", [](P& p) { p.v.ndim = 5; }, inv, "v must have 4 dims"},
      {"H % Hk", [](P& p) { p.q.shape[2] = 3; }, inv, "H = 3 (q.shape[2]) must be a multiple of Hk = 2"},
      {"head dim 0", [](P& p) { p.q.shape[3] = 0; }, inv, "q.shape[3] must be >= 1"},
      {"head dim 300", [](P& p) { p.q.shape[3] = p.k.shape[3] = p.v.shape[3] = 300; }, inv,
       "head dim D = q.shape[3] = 300 is not supported"},
      {"k head dim", [](P& p) { p.k.shape[3] = 4; }, inv, "k.shape[3] = 4, expected head dim D = 8"},
      {"v length", [](P& p) { p.v.shape[1] = 5; }, inv, "v.shape[1] = 5, expected Sk = 6"},
      {"negative stride", [](P& p) { p.q.stride[1] = -1; }, inv, "negative strides are not supported"},
      {"head dim stride", [](P& p) { p.q.stride[3] = 2; }, inv, "q.stride[3] = 2, expected 1"},
      {"int q", [](P& p) { p.q.dtype = FDMA_INT32; }, inv, "q has dtype int32, expected float16, bfloat16"},
      {"unknown dtype", [](P& p) { p.q.dtype = 99; }, inv, "q has unknown dtype code 99"},
      {"k dtype", [](P& p) { p.k.dtype = FDMA_BFLOAT16; }, inv, "k has dtype bfloat16, expected q's dtype float32"},
      {"NaN scale", [](P& p) { p.scale = NAN; }, inv, "scale must be finite"},
      {"inf scale", [](P& p) { p.scale = INFINITY; }, inv, "scale must be finite"},
      {"NaN softcap", [](P& p) { p.softcap = NAN; }, inv, "softcap must be finite"},
      {"negative softcap", [](P& p) { p.softcap = -1; }, inv, "softcap must be >= 0"},
      {"out aliases q", [](P& p) { p.out.data = p.q.data; }, inv, "output out overlaps input q"},
      {"out self-overlap", [](P& p) { p.out.stride[1] = 0; }, inv, "out is an output but its strides make elements overlap"},
      {"out shape", [](P& p) { p.out.shape[2] = 2; }, inv, "out has shape [2, 5, 2, 8], expected q's shape"},
      {"lse shape", [](P& p) { p.lse.shape[2] = 4; }, inv, "lse.shape[2] = 4, expected Sq = 5"},
      {"lse dtype", [](P& p) { p.lse.dtype = FDMA_FLOAT16; }, inv, "lse has dtype float16, expected float32"},
      {"bad backend", [](P& p) { p.backend = 7; }, inv, "backend = 7 is not one of AUTO (0), CPU (1), CUDA (2)"},
      {"CUDA backend", [](P& p) { p.backend = FDMA_BACKEND_CUDA; }, cuda_request_status(), cuda_request_needle()},
      {"small workspace", [](P& p) { p.workspace_bytes = 10; }, Status::workspace, "workspace needs"},
      {"null workspace", [](P& p) { p.workspace = nullptr; }, Status::workspace, "got a null pointer"},
  };
}

template <class P>
std::vector<Bad<P>> common_backward_cases() {
  const Status inv = Status::invalid_argument;
  return {
      {"null dout", [](P& p) { p.dout.data = nullptr; }, inv, "dout is required"},
      {"null lse", [](P& p) { p.lse.data = nullptr; }, inv, "lse is required"},
      {"dq overlaps dk", [](P& p) { p.dk.data = p.dq.data; }, inv, "outputs dq and dk overlap in memory"},
      {"dv aliases v", [](P& p) { p.dv.data = p.v.data; }, inv, "output dv overlaps input v"},
      {"dk dtype", [](P& p) { p.dk.dtype = FDMA_FLOAT64; }, inv, "dk has dtype float64, expected k's dtype float32"},
  };
}

}  // namespace

TEST(Validation, AttentionForward) {
  AttnRun r(small_attention());
  AttentionParams valid = r.params();
  std::vector<unsigned char> ws(attention_workspace_size(valid, Pass::forward));
  valid.workspace = ws.data(), valid.workspace_bytes = ws.size();
  attention_forward(valid);  // the unmutated params are accepted
  auto cases = common_qkv_cases<AttentionParams>();
  const Status inv = Status::invalid_argument;
  cases.push_back({"mask Sq", [](AttentionParams& p) { p.mask.shape[2] = 3; }, inv, "mask.shape[2] = 3 must be 1 or Sq = 5"});
  cases.push_back({"mask heads", [](AttentionParams& p) { p.mask.shape[1] = 3; }, inv,
                   "mask.shape[1] = 3: the head count must be 1, Hk = 2 or H = 4"});
  cases.push_back({"mask batch", [](AttentionParams& p) { p.mask.shape[0] = 3; }, inv, "mask.shape[0] = 3 must be 1 or B = 2"});
  cases.push_back({"mask dtype", [](AttentionParams& p) { p.mask.dtype = FDMA_FLOAT32; }, inv, "mask has dtype float32, expected bool"});
  cases.push_back({"bias Sk", [](AttentionParams& p) { p.bias.shape[3] = 2; }, inv, "bias.shape[3] = 2 must be 1 or Sk = 6"});
  cases.push_back({"bias dtype", [](AttentionParams& p) { p.bias.dtype = FDMA_FLOAT16; }, inv, "bias has dtype float16, expected float32"});
  cases.push_back({"out aliases bias", [](AttentionParams& p) { p.out.data = p.bias.data; }, inv, "output out overlaps input bias"});
  for (auto& bad : cases)
    expect_rejected<AttentionParams>(
        bad, valid, {&r.out, &r.lse}, [](const AttentionParams& p) { attention_forward(p); },
        [](const AttentionParams* p) { return fdma_attention_fwd(p); });
}

TEST(Validation, AttentionBackward) {
  AttnRun r(small_attention());
  r.forward();
  AttentionParams valid = r.params();
  std::vector<unsigned char> ws(attention_workspace_size(valid, Pass::backward));
  valid.workspace = ws.data(), valid.workspace_bytes = ws.size();
  auto cases = common_backward_cases<AttentionParams>();
  const Status inv = Status::invalid_argument;
  cases.push_back({"dbias without bias", [](AttentionParams& p) { p.bias = AttentionParams{}.bias; }, inv, "dbias is given but bias is not"});
  cases.push_back({"dbias shape", [](AttentionParams& p) { p.dbias.shape[2] = 1; }, inv, "expected bias's shape"});
  cases.push_back({"dbias dtype", [](AttentionParams& p) { p.dbias.dtype = FDMA_BFLOAT16; }, inv, "dbias has dtype bfloat16"});
  for (auto& bad : cases)
    expect_rejected<AttentionParams>(
        bad, valid, {&r.dq, &r.dk, &r.dv, &r.dbias}, [](const AttentionParams& p) { attention_backward(p); },
        [](const AttentionParams* p) { return fdma_attention_bwd(p); });
}

TEST(Validation, DynamicMaskAttention) {
  DmaRun r(small_dma());
  r.forward();
  DmaParams fwd = r.params();
  std::vector<unsigned char> ws(dma_workspace_size(fwd, Pass::backward) + dma_workspace_size(fwd, Pass::forward));
  fwd.workspace = ws.data(), fwd.workspace_bytes = ws.size();
  auto cases = common_qkv_cases<DmaParams>();
  const Status inv = Status::invalid_argument;
  cases.push_back({"window 0", [](DmaParams& p) { p.window = 0; }, inv, "window must be >= 1, got 0"});
  cases.push_back({"scores length", [](DmaParams& p) { p.key_scores.shape[2] = 7; }, inv, "key_scores.shape[2] = 7, expected Sk = 6"});
  cases.push_back({"scores dtype", [](DmaParams& p) { p.key_scores.dtype = FDMA_FLOAT16; }, inv, "key_scores has dtype float16"});
  cases.push_back({"null scores", [](DmaParams& p) { p.key_scores.data = nullptr; }, inv, "key_scores is required"});
  cases.push_back({"padding dtype", [](DmaParams& p) {
                     p.key_padding = p.key_scores;
                     p.key_padding.ndim = 2;
                   }, inv, "key_padding"});
  // keep_begin/keep_end (the forward writes them, the backward reads them): both or neither,
  // [B, Hk, Sk] int32, and in the forward apart from every input.
  const Tensor kb = r.keep_begin.view(), ke = r.keep_end.view();
  std::vector<Bad<DmaParams>> interval_cases = {
      {"keep_begin alone", [kb](DmaParams& p) { p.keep_begin = kb; }, inv, "keep_begin and keep_end go together"},
      {"keep_end alone", [ke](DmaParams& p) { p.keep_end = ke; }, inv, "keep_begin and keep_end go together"},
      {"keep_end dtype", [kb, ke](DmaParams& p) {
         p.keep_begin = kb, p.keep_end = ke;
         p.keep_end.dtype = FDMA_FLOAT32;
       }, inv, "keep_end has dtype float32"},
      {"keep_begin shape", [kb, ke](DmaParams& p) {
         p.keep_begin = kb, p.keep_end = ke;
         p.keep_begin.shape[2] = 7;
       }, inv, "keep_begin.shape[2] = 7, expected Sk = 6"},
  };
  for (auto& bad : interval_cases) cases.push_back(bad);
  cases.push_back({"keep_end over the scores", [kb](DmaParams& p) {
                     p.keep_begin = kb, p.keep_end = p.key_scores;
                     p.keep_end.dtype = FDMA_INT32;
                   }, inv, "output keep_end overlaps input key_scores"});
  for (auto& bad : cases)
    expect_rejected<DmaParams>(
        bad, fwd, {&r.out, &r.lse, &r.keep_begin, &r.keep_end}, [](const DmaParams& p) { dma_forward(p); },
        [](const DmaParams* p) { return fdma_dma_fwd(p); });

  auto bcases = common_backward_cases<DmaParams>();
  bcases.push_back({"dscores dtype", [](DmaParams& p) { p.dkey_scores.dtype = FDMA_FLOAT64; }, inv, "dkey_scores has dtype float64"});
  bcases.push_back({"dscores shape", [](DmaParams& p) { p.dkey_scores.shape[1] = 1; }, inv, "dkey_scores.shape[1] = 1, expected Hk = 2"});
  for (auto& bad : interval_cases) bcases.push_back(bad);
  for (auto& bad : bcases)
    expect_rejected<DmaParams>(
        bad, fwd, {&r.dq, &r.dk, &r.dv, &r.dscores}, [](const DmaParams& p) { dma_backward(p); },
        [](const DmaParams* p) { return fdma_dma_bwd(p); });
}

TEST(Validation, Select) {
  HostTensor scores(DType::f32, {1, 2, 10}), begin(DType::i32, {1, 2, 10}), end(DType::i32, {1, 2, 10});
  SelectParams valid;
  valid.key_scores = scores.view();
  valid.num_queries = 10;
  valid.window = 3;
  valid.keep_begin = begin.view();
  valid.keep_end = end.view();
  std::vector<unsigned char> ws(select_workspace_size(valid));
  valid.workspace = ws.data(), valid.workspace_bytes = ws.size();
  const Status inv = Status::invalid_argument;
  std::vector<Bad<SelectParams>> cases = {
      {"negative queries", [](SelectParams& p) { p.num_queries = -1; }, inv, "num_queries must be in 0.."},
      {"negative window", [](SelectParams& p) { p.window = -3; }, inv, "window must be >= 1, got -3"},
      {"begin dtype", [](SelectParams& p) { p.keep_begin.dtype = FDMA_FLOAT32; }, inv, "keep_begin has dtype float32, expected int32"},
      {"end shape", [](SelectParams& p) { p.keep_end.shape[2] = 9; }, inv, "keep_end.shape[2] = 9, expected Sk = 10"},
      {"begin = end", [](SelectParams& p) { p.keep_end.data = p.keep_begin.data; }, inv, "outputs keep_begin and keep_end overlap"},
      {"scores rank", [](SelectParams& p) { p.key_scores.ndim = 2; }, inv, "key_scores must have 3 dims"},
  };
  for (auto& bad : cases)
    expect_rejected<SelectParams>(
        bad, valid, {&begin, &end}, [](const SelectParams& p) { select_keys(p); },
        [](const SelectParams* p) { return fdma_select(p); });
}

TEST(CAbi, NullPointersAndBadPass) {
  size_t bytes = 0;
  EXPECT_EQ(fdma_attention_fwd(nullptr), FDMA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(fdma_last_error(), "params pointer is null"), nullptr);
  EXPECT_EQ(fdma_dma_bwd(nullptr), FDMA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(fdma_select(nullptr), FDMA_ERR_INVALID_ARGUMENT);
  AttnRun r(small_attention());
  AttentionParams p = r.params();
  EXPECT_EQ(fdma_attention_workspace_size(&p, 5, &bytes), FDMA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(fdma_last_error(), "pass must be"), nullptr);
  EXPECT_EQ(fdma_attention_workspace_size(&p, FDMA_PASS_FORWARD, nullptr), FDMA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(fdma_set_num_threads(-1), FDMA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(fdma_attention_workspace_size(&p, FDMA_PASS_FORWARD, &bytes), FDMA_OK);
  EXPECT_STREQ(fdma_last_error(), "");  // success clears the message
  EXPECT_GT(bytes, 0u);
}

TEST(CAbi, VersionAndNames) {
  EXPECT_EQ(fdma_abi_version(), FDMA_ABI_VERSION);
  EXPECT_STRNE(fdma_version_string(), "");
  EXPECT_STREQ(fdma_status_name(FDMA_ERR_WORKSPACE), "FDMA_ERR_WORKSPACE");
  EXPECT_STREQ(fdma_status_name(1234), "FDMA_UNKNOWN_STATUS");
}

TEST(CAbi, LastErrorIsPerThread) {
  std::string other;
  std::thread t([&] {
    fdma_attention_fwd(nullptr);
    other = fdma_last_error();
  });
  t.join();
  size_t bytes;
  AttnRun r(small_attention());
  AttentionParams p = r.params();
  ASSERT_EQ(fdma_attention_workspace_size(&p, FDMA_PASS_FORWARD, &bytes), FDMA_OK);
  EXPECT_STREQ(fdma_last_error(), "");
  EXPECT_NE(other.find("params pointer is null"), std::string::npos);
}
