// libFuzzer target for the C ABI on the CPU backend (make fuzz; docs/design.md, "Validation").
//
// The input picks an operation (attention forward or backward, select, dynamic_mask_attention
// forward or backward, the KV-cache call, attention and dynamic_mask_attention on packed
// variable-length batches), small problem sizes, and for every tensor its shape
// and strides for its role, with rare mutations: a dim or stride off by a little or set to an
// extreme, a wrong rank or dtype code, a null pointer, stride 0, an absent optional tensor, an
// output placed on top of another tensor. Each tensor gets its own heap block of exactly the
// bytes its view spans (ASan reports any access past it); a view whose extent cannot be
// computed (negative or huge sizes) gets a small block, and the library must reject it before
// touching memory. The workspace is exactly the size the library asked for, one byte less, or
// none. Then:
//   - nothing crashes, and ASan/UBSan see no out-of-bounds access, overflow or leak;
//   - a call that fails leaves every output byte as it was;
//   - a call whose workspace query failed fails too, and one given too little workspace fails
//     with FDMA_ERR_WORKSPACE.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "fdma/fdma.h"

namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kPastMaxDim = int64_t(std::numeric_limits<int32_t>::max()) + 1;
constexpr size_t kMaxBlock = size_t(1) << 22;

size_t elem_size(int32_t dtype) {
  switch (dtype) {
    case FDMA_FLOAT32: case FDMA_INT32: return 4;
    case FDMA_FLOAT16: case FDMA_BFLOAT16: return 2;
    case FDMA_FLOAT64: return 8;
    case FDMA_BOOL: return 1;
    default: return 0;
  }
}

// Bytes a view spans, or -1 when its sizes, strides, rank or dtype make that meaningless
// (a size-1 dim's stride never moves an access, as the header says).
int64_t span_bytes(const fdma_tensor& t) {
  if (t.ndim < 1 || t.ndim > FDMA_MAX_DIMS || elem_size(t.dtype) == 0) return -1;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0 || t.shape[d] > (1 << 20)) return -1;
    if (t.shape[d] == 0) return 0;
    if (t.shape[d] == 1) continue;
    if (t.stride[d] < 0 || t.stride[d] > (1 << 20)) return -1;
    last += (t.shape[d] - 1) * t.stride[d];
  }
  return (last + 1) * int64_t(elem_size(t.dtype));
}

struct Block {
  void* data;
  size_t bytes;
  bool output;
};

// The tensors of one call: their blocks, freed at the end.
class Arena {
 public:
  explicit Arena(FuzzedDataProvider& in) : in_(in) {}
  ~Arena() {
    for (Block& b : blocks_) std::free(b.data);
  }

  // A tensor of `shape` and `dtype` for its role, mutated now and then.
  fdma_tensor tensor(std::vector<int64_t> shape, int32_t dtype, bool output, bool optional = false) {
    fdma_tensor t{};
    const uint8_t mode = in_.ConsumeIntegral<uint8_t>();
    if (optional && mode >= 224) return t;  // absent: all zeros
    t.dtype = dtype;
    t.ndim = int32_t(shape.size());
    for (int d = 0; d < t.ndim; ++d) t.shape[d] = shape[d];
    int64_t stride = 1 + (in_.ConsumeBool() ? in_.ConsumeIntegralInRange<int64_t>(0, 3) : 0);  // padded rows
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.stride[d] = d == t.ndim - 1 ? 1 : stride;
      stride = t.stride[d] * (t.shape[d] > 0 ? t.shape[d] : 1);
    }
    bool null = false, alias = false;
    if (mode < 32) {
      const int d = in_.ConsumeIntegralInRange<int>(0, FDMA_MAX_DIMS - 1);
      // Values every check must refuse: negative, past int32 positions, or a view past 2^50 bytes.
      static const int64_t extremes[] = {-1, -2, kPastMaxDim, kI64Max, kI64Min, int64_t(1) << 40, int64_t(1) << 62};
      const int64_t extreme = extremes[in_.ConsumeIntegralInRange<size_t>(0, sizeof(extremes) / sizeof(extremes[0]) - 1)];
      const int64_t huge_stride = in_.ConsumeBool() ? kI64Max : int64_t(1) << 62;
      switch (mode % 8) {
        case 0: t.shape[d] += in_.ConsumeIntegralInRange<int64_t>(-2, 2); break;
        case 1: t.shape[d] = extreme; break;
        case 2: t.stride[d] = extreme < 0 ? extreme : huge_stride; break;
        case 3: t.ndim = in_.ConsumeIntegralInRange<int32_t>(-1, FDMA_MAX_DIMS + 2); break;
        case 4: t.dtype = in_.ConsumeIntegralInRange<int32_t>(-1, 8); break;
        case 5: null = true; break;
        case 6: t.stride[d] = 0; break;
        case 7: alias = !blocks_.empty(); break;
      }
    }
    if (alias) {  // on top of an earlier tensor's block, at its start
      Block& b = blocks_[in_.ConsumeIntegralInRange<size_t>(0, blocks_.size() - 1)];
      const int64_t need = span_bytes(t);
      if (need >= 0 && size_t(need) <= b.bytes) {
        b.output |= output;
        t.data = b.data;
        return t;
      }
    }
    const int64_t need = span_bytes(t);
    const size_t bytes = need >= 0 && size_t(need) <= kMaxBlock ? size_t(need) : 16;
    void* data = std::malloc(bytes ? bytes : 1);
    std::vector<uint8_t> fill = in_.ConsumeBytes<uint8_t>(std::min<size_t>(bytes, 64));
    for (size_t i = 0; i < bytes; ++i) static_cast<uint8_t*>(data)[i] = fill.empty() ? uint8_t(i * 37) : fill[i % fill.size()];
    blocks_.push_back({data, bytes, output});
    if (!null) t.data = data;
    return t;
  }

  // Every output block's bytes, to compare after a failed call.
  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> s;
    for (const Block& b : blocks_)
      if (b.output) s.emplace_back(static_cast<uint8_t*>(b.data), static_cast<uint8_t*>(b.data) + b.bytes);
    return s;
  }

 private:
  FuzzedDataProvider& in_;
  std::vector<Block> blocks_;
};

int32_t float_dtype(FuzzedDataProvider& in) {
  static const int32_t types[] = {FDMA_FLOAT32, FDMA_FLOAT64, FDMA_FLOAT16, FDMA_BFLOAT16};
  return types[in.ConsumeIntegralInRange<int>(0, 3)];
}

double scalar(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return std::numeric_limits<double>::infinity();
    case 2: return -1.0;
    case 3: return 1e300;
    default: return in.ConsumeIntegralInRange<int>(0, 3) * 0.25;
  }
}

int64_t window(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return in.ConsumeIntegralInRange<int64_t>(-2, 0);
    case 1: return kI64Max;
    default: return in.ConsumeIntegralInRange<int64_t>(1, 6);
  }
}

// Runs one call: workspace query, then the call with the workspace the input picks; checks
// the rules in the header comment.
template <class P, class Size, class Call>
void run(FuzzedDataProvider& in, Arena& arena, P& p, Size size, Call call) {
  size_t bytes = 0;
  const int32_t size_status = size(&p, &bytes);
  const int choice = in.ConsumeIntegralInRange<int>(0, 7);
  std::unique_ptr<uint8_t[]> ws;
  size_t given = 0;
  if (size_status == FDMA_OK && bytes > size_t(1) << 28) return;  // a valid call this large is not a small problem
  if (size_status == FDMA_OK && choice != 0) {
    given = choice == 1 && bytes > 0 ? bytes - 1 : bytes;
    ws.reset(given ? new uint8_t[given] : nullptr);
  }
  p.workspace = ws.get();
  p.workspace_bytes = given;
  const auto before = arena.snapshot();
  const int32_t status = call(&p);
  if (size_status != FDMA_OK && status == FDMA_OK) __builtin_trap();  // accepted what the size query refused
  if (size_status == FDMA_OK && given < bytes && status == FDMA_OK) __builtin_trap();  // too little workspace
  if (status != FDMA_OK && arena.snapshot() != before) __builtin_trap();  // an output written on error
}

struct Dims {
  int64_t B, Sq, Sk, H, Hk, D;
};

// q, k, v of attention or dynamic_mask_attention (their params name them alike); returns the dtype.
template <class P>
int32_t qkv(FuzzedDataProvider& in, Arena& a, P& p, const Dims& d) {
  const int32_t dt = float_dtype(in);
  p.q = a.tensor({d.B, d.Sq, d.H, d.D}, dt, false);
  p.k = a.tensor({d.B, d.Sk, d.Hk, d.D}, dt, false);
  p.v = a.tensor({d.B, d.Sk, d.Hk, d.D}, dt, false);
  return dt;
}

// dout and the gradients of q, k, v.
template <class P>
void grads(Arena& a, P& p, const Dims& d, int32_t dt) {
  p.dout = a.tensor({d.B, d.Sq, d.H, d.D}, dt, false);
  p.dq = a.tensor({d.B, d.Sq, d.H, d.D}, dt, true);
  p.dk = a.tensor({d.B, d.Sk, d.Hk, d.D}, dt, true);
  p.dv = a.tensor({d.B, d.Sk, d.Hk, d.D}, dt, true);
}

void attention(FuzzedDataProvider& in, Arena& a, const Dims& d, bool backward) {
  const auto [B, Sq, Sk, H, Hk, D] = d;
  fdma_attention_params p{};
  const int32_t dt = qkv(in, a, p, d);
  const int64_t mh = in.ConsumeBool() ? H : in.ConsumeBool() ? Hk : 1;
  p.mask = a.tensor({in.ConsumeBool() ? B : 1, mh, in.ConsumeBool() ? Sq : 1, Sk}, FDMA_BOOL, false, true);
  const int32_t bias_dt = in.ConsumeBool() ? dt : FDMA_FLOAT32;
  const std::vector<int64_t> bias_shape = {in.ConsumeBool() ? B : 1, mh, in.ConsumeBool() ? Sq : 1, Sk};
  p.bias = a.tensor(bias_shape, bias_dt, false, true);
  p.scale = scalar(in), p.softcap = scalar(in);
  p.causal = in.ConsumeBool(), p.deterministic = in.ConsumeBool();
  p.backend = in.ConsumeIntegralInRange<int32_t>(0, 3);  // AUTO, CPU, CUDA (absent here), bad
  p.out = a.tensor({B, Sq, H, D}, dt, !backward);
  p.lse = a.tensor({B, H, Sq}, dt == FDMA_FLOAT64 && in.ConsumeBool() ? FDMA_FLOAT64 : FDMA_FLOAT32, !backward, !backward);
  if (!backward) return run(in, a, p, [](auto* q, size_t* b) { return fdma_attention_workspace_size(q, FDMA_PASS_FORWARD, b); },
                            fdma_attention_fwd);
  grads(a, p, d, dt);
  p.dbias = a.tensor(bias_shape, in.ConsumeBool() ? bias_dt : FDMA_FLOAT32, true, true);
  run(in, a, p, [](auto* q, size_t* b) { return fdma_attention_workspace_size(q, FDMA_PASS_BACKWARD, b); },
      fdma_attention_bwd);
}

void select(FuzzedDataProvider& in, Arena& a, int64_t B, int64_t Sq, int64_t Sk, int64_t Hk) {
  fdma_select_params p{};
  p.key_scores = a.tensor({B, Hk, Sk}, float_dtype(in), false);
  p.key_padding = a.tensor({B, Sk}, FDMA_BOOL, false, true);
  p.num_queries = in.ConsumeBool() ? Sq : in.ConsumeIntegralInRange<int64_t>(-1, 3);
  p.window = window(in);
  p.causal = in.ConsumeBool();
  p.backend = in.ConsumeIntegralInRange<int32_t>(0, 3);  // AUTO, CPU, CUDA (absent here), bad
  p.keep_begin = a.tensor({B, Hk, Sk}, FDMA_INT32, true);
  p.keep_end = a.tensor({B, Hk, Sk}, FDMA_INT32, true);
  run(in, a, p, fdma_select_workspace_size, fdma_select);
}

void dma(FuzzedDataProvider& in, Arena& a, const Dims& d, bool backward) {
  const auto [B, Sq, Sk, H, Hk, D] = d;
  fdma_dma_params p{};
  const int32_t dt = qkv(in, a, p, d);
  const int32_t sdt = in.ConsumeBool() ? dt : FDMA_FLOAT32;
  p.key_scores = a.tensor({B, Hk, Sk}, sdt, false);
  p.key_padding = a.tensor({B, Sk}, FDMA_BOOL, false, true);
  p.window = window(in);
  p.causal = in.ConsumeBool(), p.add_scores = in.ConsumeBool(), p.deterministic = in.ConsumeBool();
  p.scale = scalar(in), p.softcap = scalar(in);
  p.backend = in.ConsumeIntegralInRange<int32_t>(0, 3);  // AUTO, CPU, CUDA (absent here), bad
  p.out = a.tensor({B, Sq, H, D}, dt, !backward);
  p.lse = a.tensor({B, H, Sq}, FDMA_FLOAT32, !backward, !backward);
  // Intervals: written by a forward that gets them, read by a backward (any values).
  p.keep_begin = a.tensor({B, Hk, Sk}, FDMA_INT32, !backward, true);
  p.keep_end = a.tensor({B, Hk, Sk}, FDMA_INT32, !backward, true);
  if (!backward)
    return run(in, a, p, [](auto* q, size_t* b) { return fdma_dma_workspace_size(q, FDMA_PASS_FORWARD, b); }, fdma_dma_fwd);
  grads(a, p, d, dt);
  p.dkey_scores = a.tensor({B, Hk, Sk}, in.ConsumeBool() ? sdt : FDMA_FLOAT32, true, true);
  run(in, a, p, [](auto* q, size_t* b) { return fdma_dma_workspace_size(q, FDMA_PASS_BACKWARD, b); }, fdma_dma_bwd);
}

void kvcache(FuzzedDataProvider& in, Arena& a, int64_t B, int64_t Sq, int64_t H, int64_t Hk, int64_t D) {
  const int32_t dt = float_dtype(in);
  const bool paged = in.ConsumeBool(), dynamic = in.ConsumeBool();
  const int64_t page = 16, pages = in.ConsumeIntegralInRange<int64_t>(1, 4), max_pages = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t max_len = in.ConsumeIntegralInRange<int64_t>(1, 40), Snew = in.ConsumeIntegralInRange<int64_t>(0, 2);
  const bool append = Snew > 0;  // the caches are written then
  fdma_kvcache_params p{};
  p.q = a.tensor({B, Sq, H, D}, dt, false);
  const std::vector<int64_t> cache = paged ? std::vector<int64_t>{pages, page, Hk, D} : std::vector<int64_t>{B, max_len, Hk, D};
  p.k_cache = a.tensor(cache, dt, append);
  p.v_cache = a.tensor(cache, dt, append);
  const int32_t sdt = in.ConsumeBool() ? dt : FDMA_FLOAT32;
  if (dynamic)
    p.score_cache = a.tensor(paged ? std::vector<int64_t>{pages, page, Hk} : std::vector<int64_t>{B, Hk, max_len}, sdt,
                             append);
  p.cache_seqlens = a.tensor({B}, FDMA_INT32, false, !append);
  if (paged) p.block_table = a.tensor({B, max_pages}, FDMA_INT32, false);
  if (append) {
    p.k = a.tensor({B, Snew, Hk, D}, dt, false);
    p.v = a.tensor({B, Snew, Hk, D}, dt, false);
    if (dynamic) p.scores = a.tensor({B, Hk, Snew}, sdt, false);
  }
  const int64_t capacity = paged ? max_pages * page : max_len;
  p.window = dynamic ? window(in) : in.ConsumeIntegralInRange<int64_t>(0, 1) * 3;
  if (dynamic && p.window > 0)
    p.select_state = a.tensor({B, Hk, 1 + 2 * std::min(p.window, capacity)}, FDMA_INT32, true, true);
  p.causal = in.ConsumeBool(), p.add_scores = in.ConsumeBool();
  p.scale = scalar(in), p.softcap = scalar(in);
  p.backend = in.ConsumeIntegralInRange<int32_t>(0, 3);  // AUTO, CPU, CUDA (absent here), bad
  p.out = a.tensor({B, Sq, H, D}, dt, true);
  p.lse = a.tensor({B, H, Sq}, FDMA_FLOAT32, true, true);
  run(in, a, p, fdma_kvcache_workspace_size, fdma_kvcache_fwd);
}

// A packed variable-length batch's offsets: the prefix sums of the lengths, or now and then
// wrong ones (decreasing, negative, past the totals), written into cu when its view is a
// plain int32 [N + 1] one with data (a mutated view keeps the arena's bytes).
void write_offsets(FuzzedDataProvider& in, const fdma_tensor& cu, std::vector<int64_t> offsets) {
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && !offsets.empty()) {
    const size_t i = in.ConsumeIntegralInRange<size_t>(0, offsets.size() - 1);
    static const int64_t bad[] = {-1, -1000, 1 << 30, 3};
    offsets[i] = in.ConsumeBool() ? offsets[i] + in.ConsumeIntegralInRange<int64_t>(-2, 2)
                                  : bad[in.ConsumeIntegralInRange<int>(0, 3)];
  }
  if (!cu.data || cu.ndim != 1 || cu.dtype != FDMA_INT32 || cu.shape[0] != int64_t(offsets.size())) return;
  if (cu.shape[0] > 1 && (cu.stride[0] < 1 || cu.stride[0] > 4)) return;
  for (size_t i = 0; i < offsets.size(); ++i) static_cast<int32_t*>(cu.data)[int64_t(i) * cu.stride[0]] = int32_t(offsets[i]);
}

// max_seqlen: the longest length, or now and then one off or negative.
int64_t max_len(FuzzedDataProvider& in, const std::vector<int64_t>& lens) {
  int64_t m = 0;
  for (int64_t l : lens) m = std::max(m, l);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return m - 1;
    case 1: return -1;
    case 2: return m + 3;
    default: return m;
  }
}

// Packed batches (fdma.h, "varlen"): attention (dynamic false) or dynamic_mask_attention.
void varlen(FuzzedDataProvider& in, Arena& a, int64_t H, int64_t Hk, int64_t D, bool dynamic, bool backward) {
  const int64_t N = in.ConsumeIntegralInRange<int64_t>(0, 3);
  std::vector<int64_t> q_lens, k_lens, cu_q{0}, cu_k{0};
  for (int64_t s = 0; s < N; ++s) {
    q_lens.push_back(in.ConsumeIntegralInRange<int64_t>(0, 5));
    k_lens.push_back(in.ConsumeIntegralInRange<int64_t>(0, 5));
    cu_q.push_back(cu_q.back() + q_lens.back());
    cu_k.push_back(cu_k.back() + k_lens.back());
  }
  const int64_t tq = cu_q.back(), tk = cu_k.back();
  const int32_t dt = float_dtype(in);
  auto common = [&](auto& p) {
    p.q = a.tensor({tq, H, D}, dt, false);
    p.k = a.tensor({tk, Hk, D}, dt, false);
    p.v = a.tensor({tk, Hk, D}, dt, false);
    p.cu_seqlens_q = a.tensor({N + 1}, FDMA_INT32, false, true);
    p.cu_seqlens_k = a.tensor({N + 1}, FDMA_INT32, false, true);
    write_offsets(in, p.cu_seqlens_q, cu_q);
    write_offsets(in, p.cu_seqlens_k, cu_k);
    p.max_seqlen_q = max_len(in, q_lens), p.max_seqlen_k = max_len(in, k_lens);
    p.scale = scalar(in), p.softcap = scalar(in);
    p.causal = in.ConsumeBool(), p.deterministic = in.ConsumeBool();
    p.backend = in.ConsumeIntegralInRange<int32_t>(0, 3);
    p.out = a.tensor({tq, H, D}, dt, !backward);
    p.lse = a.tensor({H, tq}, FDMA_FLOAT32, !backward, !backward);
    if (backward) {
      p.dout = a.tensor({tq, H, D}, dt, false);
      p.dq = a.tensor({tq, H, D}, dt, true);
      p.dk = a.tensor({tk, Hk, D}, dt, true);
      p.dv = a.tensor({tk, Hk, D}, dt, true);
    }
  };
  if (dynamic) {
    fdma_dma_params p{};
    common(p);
    const int32_t sdt = in.ConsumeBool() ? dt : FDMA_FLOAT32;
    p.key_scores = a.tensor({Hk, tk}, sdt, false);
    p.key_padding = a.tensor({tk}, FDMA_BOOL, false, true);
    p.window = window(in);
    p.add_scores = in.ConsumeBool();
    p.keep_begin = a.tensor({Hk, tk}, FDMA_INT32, !backward, true);
    p.keep_end = a.tensor({Hk, tk}, FDMA_INT32, !backward, true);
    if (!backward)
      return run(in, a, p, [](auto* q, size_t* b) { return fdma_dma_workspace_size(q, FDMA_PASS_FORWARD, b); },
                 fdma_dma_fwd);
    p.dkey_scores = a.tensor({Hk, tk}, in.ConsumeBool() ? sdt : FDMA_FLOAT32, true, true);
    return run(in, a, p, [](auto* q, size_t* b) { return fdma_dma_workspace_size(q, FDMA_PASS_BACKWARD, b); },
               fdma_dma_bwd);
  }
  fdma_attention_params p{};
  common(p);
  const int64_t hb = in.ConsumeBool() ? H : in.ConsumeBool() ? Hk : 1;
  p.mask = a.tensor({hb, tk}, FDMA_BOOL, false, true);
  const int32_t bias_dt = in.ConsumeBool() ? dt : FDMA_FLOAT32;
  p.bias = a.tensor({hb, tk}, bias_dt, false, true);
  if (!backward)
    return run(in, a, p, [](auto* q, size_t* b) { return fdma_attention_workspace_size(q, FDMA_PASS_FORWARD, b); },
               fdma_attention_fwd);
  p.dbias = a.tensor({hb, tk}, in.ConsumeBool() ? bias_dt : FDMA_FLOAT32, true, true);
  run(in, a, p, [](auto* q, size_t* b) { return fdma_attention_workspace_size(q, FDMA_PASS_BACKWARD, b); },
      fdma_attention_bwd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] { return fdma_set_num_threads(2) == FDMA_OK; }();
  (void)once;
  FuzzedDataProvider in(data, size);
  const int op = in.ConsumeIntegralInRange<int>(0, 9);
  const int64_t B = in.ConsumeIntegralInRange<int64_t>(0, 2), Sq = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const int64_t Sk = in.ConsumeIntegralInRange<int64_t>(0, 9), Hk = in.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t H = Hk * in.ConsumeIntegralInRange<int64_t>(1, 2), D = in.ConsumeIntegralInRange<int64_t>(1, 8);
  Arena arena(in);
  const Dims d{B, Sq, Sk, H, Hk, D};
  switch (op) {
    case 0: attention(in, arena, d, false); break;
    case 1: attention(in, arena, d, true); break;
    case 2: select(in, arena, B, Sq, Sk, Hk); break;
    case 3: dma(in, arena, d, false); break;
    case 4: dma(in, arena, d, true); break;
    case 5: kvcache(in, arena, B, Sq, H, Hk, D); break;
    default: varlen(in, arena, H, Hk, D, op >= 8, op % 2 == 1); break;
  }
  return 0;
}
