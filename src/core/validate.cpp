// The one validation layer every backend shares. Each check names the argument and what was
// expected; all checks run before any output is touched, so an error never leaves a partial
// write behind.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/problem.hpp"
#include "core/varlen.hpp"

namespace fdma::detail {

void fail(Status status, const std::string& message) { throw Error(status, message); }

namespace {

constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();  // int32 indices in kernels

// No iostreams in the library: formatting through an ostringstream crashed inside libfdma.so
// when loaded into a PyTorch process on the GPU machine (std::num_put, a locale facet of
// another libstdc++), while std::to_string formats without locales.
std::string shape_str(const fdma_tensor& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim && d < FDMA_MAX_DIMS; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

struct Span {
  std::string name;
  uintptr_t lo, hi;
};

bool has_elements(const fdma_tensor& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] == 0) return false;
  return true;
}

// Bytes a strided view can touch: [data, data + (1 + sum (shape-1)*stride) * element size);
// none for a view with no elements.
Span span_of(const fdma_tensor& t, const std::string& name) {
  auto lo = reinterpret_cast<uintptr_t>(t.data);
  if (!has_elements(t)) return {name, lo, lo};
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  return {name, lo, lo + static_cast<uintptr_t>(last + 1) * dtype_size(static_cast<DType>(t.dtype))};
}

// Whether an optional tensor was given (Tensor::present's rule).
bool present(const fdma_tensor& t) { return Tensor(t).present(); }

class Checker {
 public:
  explicit Checker(const char* op) : op_(op) {}

  [[noreturn]] void bad(const std::string& msg) const { fail(Status::invalid_argument, std::string(op_) + ": " + msg); }

  // Presence, rank, sizes >= 0, non-negative strides, a dtype this library knows. A tensor
  // with no elements may have a null data pointer (what frameworks hand out for them); the
  // sizes that must be positive (heads, head dim) are checked by `positive`.
  void layout(const fdma_tensor& t, const char* name, int ndim, const char* dims_doc) const {
    if (t.ndim != ndim)
      bad(std::string(name) + " must have " + std::to_string(ndim) + " dims " + dims_doc + ", got ndim = " +
          std::to_string(t.ndim));
    for (int d = 0; d < ndim; ++d) {
      if (t.shape[d] < 0)
        bad(std::string(name) + ".shape[" + std::to_string(d) + "] must be >= 0, got " + std::to_string(t.shape[d]) +
            " (shape " + shape_str(t) + ")");
      if (t.shape[d] > kMaxDim)
        bad(std::string(name) + ".shape[" + std::to_string(d) + "] = " + std::to_string(t.shape[d]) +
            " exceeds the supported maximum " + std::to_string(kMaxDim));
      if (t.stride[d] < 0)
        bad(std::string(name) + ".stride[" + std::to_string(d) + "] = " + std::to_string(t.stride[d]) +
            ": negative strides are not supported");
    }
    const bool empty = !has_elements(t);
    if (t.data == nullptr && !empty) bad(std::string(name) + " is required but its data pointer is null");
    if (dtype_size(static_cast<DType>(t.dtype)) == 0)
      bad(std::string(name) + " has unknown dtype code " + std::to_string(t.dtype));
    // The bytes the view spans, checked for overflow: past 2^50 no memory holds it, and the
    // offsets into it could wrap.
    if (!empty) {
      int64_t last = 0, term = 0;
      bool overflow = false;
      for (int d = 0; d < ndim && !overflow; ++d)
        overflow = __builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &term) || __builtin_add_overflow(last, term, &last);
      overflow = overflow || __builtin_add_overflow(last, 1, &last) ||
                 __builtin_mul_overflow(last, int64_t(dtype_size(static_cast<DType>(t.dtype))), &term) ||
                 term > (int64_t(1) << 50);
      if (overflow)
        bad(std::string(name) + " spans more than 2^50 bytes (shape " + shape_str(t) + " and its strides): no " +
            "memory holds such a view");
    }
  }

  void positive(const fdma_tensor& t, const char* name, int d) const {
    if (t.shape[d] < 1)
      bad(std::string(name) + ".shape[" + std::to_string(d) + "] must be >= 1, got " + std::to_string(t.shape[d]) +
          " (shape " + shape_str(t) + ")");
  }

  void dtype_in(const fdma_tensor& t, const char* name, std::initializer_list<DType> allowed,
                const char* expected) const {
    for (DType a : allowed)
      if (t.dtype == static_cast<int32_t>(a)) return;
    bad(std::string(name) + " has dtype " + dtype_name(static_cast<DType>(t.dtype)) + ", expected " + expected);
  }

  void dim(const fdma_tensor& t, const char* name, int d, int64_t expected, const char* what) const {
    if (t.shape[d] != expected)
      bad(std::string(name) + ".shape[" + std::to_string(d) + "] = " + std::to_string(t.shape[d]) + ", expected " +
          what + " = " + std::to_string(expected) + " (" + name + " shape " + shape_str(t) + ")");
  }

  void unit_last_stride(const fdma_tensor& t, const char* name) const {
    int d = t.ndim - 1;
    if (has_elements(t) && t.shape[d] > 1 && t.stride[d] != 1)
      bad(std::string(name) + ".stride[" + std::to_string(d) + "] = " + std::to_string(t.stride[d]) +
          ", expected 1 (the head dim must be contiguous)");
  }

  // An output must not write one element twice: sorted by stride, each dim must step past
  // everything the smaller dims reach.
  void no_self_overlap(const fdma_tensor& t, const char* name) const {
    if (!has_elements(t)) return;
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] > 1) dims.emplace_back(t.stride[d], t.shape[d]);
    std::sort(dims.begin(), dims.end());
    int64_t reach = 0;
    for (auto [stride, size] : dims) {
      if (stride <= reach)
        bad(std::string(name) + " is an output but its strides make elements overlap (stride 0 or aliasing dims)");
      reach += (size - 1) * stride;
    }
  }

  // mask / bias / dbias: [B|1, 1|Hk|H, Sq|1, Sk|1].
  Broadcast broadcast4(const fdma_tensor& t, const char* name, const Dims& d) const {
    layout(t, name, 4, "[B|1, 1|Hk|H, Sq|1, Sk|1]");
    const int64_t full[4] = {d.B, d.H, d.Sq, d.Sk};
    const char* names[4] = {"B", "H", "Sq", "Sk"};
    for (int k : {0, 2, 3})
      if (t.shape[k] != 1 && t.shape[k] != full[k])
        bad(std::string(name) + ".shape[" + std::to_string(k) + "] = " + std::to_string(t.shape[k]) + " must be 1 or " +
            names[k] + " = " + std::to_string(full[k]) + " (" + name + " shape " + shape_str(t) + ")");
    if (t.shape[1] != 1 && t.shape[1] != d.Hk && t.shape[1] != d.H)
      bad(std::string(name) + ".shape[1] = " + std::to_string(t.shape[1]) + ": the head count must be 1, Hk = " +
          std::to_string(d.Hk) + " or H = " + std::to_string(d.H));
    Broadcast b;
    b.present = true;
    b.head_mode = t.shape[1] == d.H ? Broadcast::per_head : t.shape[1] == d.Hk ? Broadcast::per_kv_head : Broadcast::shared;
    for (int k = 0; k < 4; ++k) {
      b.size[k] = t.shape[k];
      b.stride[k] = t.shape[k] == 1 ? 0 : t.stride[k];
    }
    return b;
  }

  void finite(double x, const char* name) const {
    if (!std::isfinite(x)) bad(std::string(name) + " must be finite, got " + std::to_string(x));
  }

  void no_overlap(const std::vector<Span>& outputs, const std::vector<Span>& inputs) const {
    for (size_t a = 0; a < outputs.size(); ++a) {
      auto hit = [&](const Span& o) { return outputs[a].lo < o.hi && o.lo < outputs[a].hi; };
      for (const Span& in : inputs)
        if (hit(in)) bad("output " + outputs[a].name + " overlaps input " + in.name + " in memory");
      for (size_t b = a + 1; b < outputs.size(); ++b)
        if (hit(outputs[b])) bad("outputs " + outputs[a].name + " and " + outputs[b].name + " overlap in memory");
    }
  }

  // AUTO picks CUDA iff the first tensor with data is device memory; then every tensor with
  // data must agree (empty tensors may have none). With no data at all, the CPU runs the call.
  Backend backend(int32_t requested, const std::vector<std::pair<std::string, const void*>>& given) const {
    if (requested < FDMA_BACKEND_AUTO || requested > FDMA_BACKEND_CUDA)
      bad("backend = " + std::to_string(requested) + " is not one of AUTO (0), CPU (1), CUDA (2)");
    std::vector<std::pair<std::string, const void*>> ptrs;
    for (auto& named : given)
      if (named.second) ptrs.push_back(named);
    std::vector<PointerLocation> locs;
    for (auto& [name, ptr] : ptrs) locs.push_back(locate_pointer(ptr));
    Backend b = static_cast<Backend>(requested);
    if (b == Backend::automatic) b = !locs.empty() && locs.front().device ? Backend::cuda : Backend::cpu;
    if (b == Backend::cuda && !cuda_runtime_usable())
      fail(Status::unsupported, std::string(op_) + ": the CUDA backend needs a CUDA build of Flash-DMA and a usable GPU");
    for (size_t i = 0; i < ptrs.size(); ++i) {
      const auto& name = ptrs[i].first;
      if (b == Backend::cpu && locs[i].device)
        bad(name + " is in CUDA device memory (device " + std::to_string(locs[i].ordinal) +
            ") but the CPU backend runs this call; pass all tensors on one device");
      if (b == Backend::cuda && !locs[i].device)
        bad(name + " is host memory but the CUDA backend runs this call; pass all tensors on one device");
      if (b == Backend::cuda && locs[i].ordinal != locs[0].ordinal)
        bad(name + " is on CUDA device " + std::to_string(locs[i].ordinal) + " but " + ptrs[0].first +
            " is on device " + std::to_string(locs[0].ordinal));
    }
    return b;
  }

 private:
  const char* op_;
};

// A q/k/v triple, shared by attention and dynamic_mask_attention.
Dims check_qkv(const Checker& c, const fdma_tensor& q, const fdma_tensor& k, const fdma_tensor& v) {
  c.layout(q, "q", 4, "[B, Sq, H, D]");
  c.positive(q, "q", 2);
  c.positive(q, "q", 3);
  c.dtype_in(q, "q", {DType::f32, DType::f16, DType::bf16, DType::f64}, "float16, bfloat16, float32 or float64");
  Dims d;
  d.B = q.shape[0];
  d.Sq = q.shape[1];
  d.H = q.shape[2];
  d.D = q.shape[3];
  if (d.D > FDMA_MAX_HEAD_DIM)
    c.bad("head dim D = q.shape[3] = " + std::to_string(d.D) + " is not supported (1 to " +
          std::to_string(FDMA_MAX_HEAD_DIM) + ")");
  const std::string qdt = dtype_name(static_cast<DType>(q.dtype));
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    c.layout(*t, name, 4, "[B, Sk, Hk, D]");
    if (t->dtype != q.dtype)
      c.bad(std::string(name) + " has dtype " + dtype_name(static_cast<DType>(t->dtype)) + ", expected q's dtype " + qdt);
    c.dim(*t, name, 0, d.B, "B");
    c.dim(*t, name, 3, d.D, "head dim D");
  }
  c.positive(k, "k", 2);
  d.Sk = k.shape[1];
  d.Hk = k.shape[2];
  c.dim(v, "v", 1, d.Sk, "Sk");
  c.dim(v, "v", 2, d.Hk, "Hk");
  if (d.H % d.Hk != 0)
    c.bad("H = " + std::to_string(d.H) + " (q.shape[2]) must be a multiple of Hk = " + std::to_string(d.Hk) +
          " (k.shape[2])");
  for (auto [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) c.unit_last_stride(*t, name);
  return d;
}

// A tensor shaped and typed like q (or k): out, dout, dq, dk, dv.
void check_like(const Checker& c, const fdma_tensor& t, const char* name, const fdma_tensor& like,
                const char* like_name, bool output) {
  c.layout(t, name, 4, like_name[0] == 'q' ? "[B, Sq, H, D]" : "[B, Sk, Hk, D]");
  for (int d = 0; d < 4; ++d)
    if (t.shape[d] != like.shape[d])
      c.bad(std::string(name) + " has shape " + shape_str(t) + ", expected " + like_name + "'s shape " + shape_str(like));
  if (t.dtype != like.dtype)
    c.bad(std::string(name) + " has dtype " + dtype_name(static_cast<DType>(t.dtype)) + ", expected " + like_name +
          "'s dtype " + dtype_name(static_cast<DType>(like.dtype)));
  c.unit_last_stride(t, name);
  if (output) c.no_self_overlap(t, name);
}

void check_lse(const Checker& c, const fdma_tensor& lse, const Dims& d, DType qdt, bool output) {
  c.layout(lse, "lse", 3, "[B, H, Sq]");
  if (qdt == DType::f64)
    c.dtype_in(lse, "lse", {DType::f32, DType::f64}, "float32 or float64");
  else
    c.dtype_in(lse, "lse", {DType::f32}, "float32");
  c.dim(lse, "lse", 0, d.B, "B");
  c.dim(lse, "lse", 1, d.H, "H");
  c.dim(lse, "lse", 2, d.Sq, "Sq");
  if (output) c.no_self_overlap(lse, "lse");
}

// Either q's dtype or float32: the rule for bias, key_scores and their gradients.
void check_q_or_f32(const Checker& c, const fdma_tensor& t, const char* name, DType qdt) {
  std::string expected = qdt == DType::f32 ? std::string("float32") : std::string(dtype_name(qdt)) + " (q's dtype) or float32";
  c.dtype_in(t, name, {qdt, DType::f32}, expected.c_str());
}

// A gradient's dtype: its input's, or float32 (dbias, dkey_scores).
void check_grad_dtype(const Checker& c, const fdma_tensor& grad, const char* name, const fdma_tensor& input,
                      const char* input_name) {
  const DType in = static_cast<DType>(input.dtype);
  std::string expected = std::string(dtype_name(in)) + " (" + input_name + "'s dtype) or float32";
  c.dtype_in(grad, name, {in, DType::f32}, expected.c_str());
}

void check_scalars(const Checker& c, double scale, double softcap) {
  c.finite(scale, "scale");
  c.finite(softcap, "softcap");
  if (softcap < 0) c.bad("softcap must be >= 0 (0 turns it off), got " + std::to_string(softcap));
}

double resolve_scale(double scale, int64_t D) { return scale == 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : scale; }

void check_key_scores(const Checker& c, const fdma_tensor& t, const char* name, int64_t B, int64_t Hk, int64_t Sk) {
  c.layout(t, name, 3, "[B, Hk, Sk]");
  c.dim(t, name, 0, B, "B");
  c.dim(t, name, 1, Hk, "Hk");
  c.dim(t, name, 2, Sk, "Sk");
}

void check_padding(const Checker& c, const fdma_tensor& t, int64_t B, int64_t Sk) {
  c.layout(t, "key_padding", 2, "[B, Sk]");
  c.dtype_in(t, "key_padding", {DType::boolean}, "bool");
  c.dim(t, "key_padding", 0, B, "B");
  c.dim(t, "key_padding", 1, Sk, "Sk");
}

void check_window(const Checker& c, int64_t window) {
  if (window < 1) c.bad("window must be >= 1, got " + std::to_string(window));
}

// What a validation collects for the overlap and device checks.
struct Collected {
  std::vector<Span> inputs, outputs;
  std::vector<std::pair<std::string, const void*>> ptrs;
  void input(const fdma_tensor& t, const char* name) {
    inputs.push_back(span_of(t, name));
    ptrs.emplace_back(name, t.data);
  }
  void output(const fdma_tensor& t, const char* name) {
    outputs.push_back(span_of(t, name));
    ptrs.emplace_back(name, t.data);
  }
};

// A packed batch's offsets are inputs of its packed view's checks: an output on top of them
// would move the sequences in the middle of the call.
template <class P>
void collect_offsets(const P& p, Collected& io) {
  if (present(p.cu_seqlens_q)) io.input(p.cu_seqlens_q, "cu_seqlens_q");
  if (present(p.cu_seqlens_k)) io.input(p.cu_seqlens_k, "cu_seqlens_k");
}

// The start of both operations' batched checks: q, k and v checked (their dims and dtype into
// prob) and collected as inputs, with a packed batch's offsets.
template <class P, class Problem>
Collected check_qkv_inputs(const Checker& c, const P& p, Problem& prob) {
  prob.dims = check_qkv(c, p.q, p.k, p.v);
  prob.dtype = static_cast<DType>(p.q.dtype);
  Collected io;
  io.input(p.q, "q");
  io.input(p.k, "k");
  io.input(p.v, "v");
  collect_offsets(p, io);
  return io;
}

// out and lse (forward outputs; backward inputs with dout) and dq, dk, dv: the same for
// attention and dynamic_mask_attention, whose params name these fields alike.
template <class P>
void check_attention_io(const Checker& c, const P& p, Pass pass, const Dims& d, DType dtype, Collected& io) {
  if (pass == Pass::forward) {
    check_like(c, p.out, "out", p.q, "q", true);
    io.output(p.out, "out");
    if (present(p.lse)) {
      check_lse(c, p.lse, d, dtype, true);
      io.output(p.lse, "lse");
    }
    return;
  }
  check_like(c, p.out, "out", p.q, "q", false);
  check_lse(c, p.lse, d, dtype, false);
  check_like(c, p.dout, "dout", p.q, "q", false);
  check_like(c, p.dq, "dq", p.q, "q", true);
  check_like(c, p.dk, "dk", p.k, "k", true);
  check_like(c, p.dv, "dv", p.v, "v", true);
  io.input(p.out, "out");
  io.input(p.lse, "lse");
  io.input(p.dout, "dout");
  io.output(p.dq, "dq");
  io.output(p.dk, "dk");
  io.output(p.dv, "dv");
}


// --- packed variable-length batches (fdma.h, "varlen") -------------------------------------
// The packed tensors' own shapes are checked here, under their own names and dims; the packed
// view (core/varlen.hpp) then goes through the batched checks (dtypes, overlaps, device),
// whose shape checks these make pass.

void check_like_3d(const Checker& c, const fdma_tensor& t, const char* name, const fdma_tensor& like,
                   const char* like_name) {
  c.layout(t, name, 3, like_name[0] == 'q' ? "[total_q, H, D]" : "[total_k, Hk, D]");
  for (int d = 0; d < 3; ++d)
    if (t.shape[d] != like.shape[d])
      c.bad(std::string(name) + " has shape " + shape_str(t) + ", expected " + like_name + "'s shape " + shape_str(like));
}

template <class P>
void check_varlen_tensors(const Checker& c, const P& p, Pass pass) {
  c.layout(p.q, "q", 3, "[total_q, H, D]");
  c.positive(p.q, "q", 1);
  c.positive(p.q, "q", 2);
  c.layout(p.k, "k", 3, "[total_k, Hk, D]");
  c.positive(p.k, "k", 1);
  c.dim(p.k, "k", 2, p.q.shape[2], "head dim D");
  check_like_3d(c, p.v, "v", p.k, "k");
  if (p.q.shape[1] % p.k.shape[1] != 0)
    c.bad("H = " + std::to_string(p.q.shape[1]) + " (q.shape[1]) must be a multiple of Hk = " +
          std::to_string(p.k.shape[1]) + " (k.shape[1])");
  const bool lse_needed = pass == Pass::backward;
  check_like_3d(c, p.out, "out", p.q, "q");
  if (lse_needed || present(p.lse)) {
    c.layout(p.lse, "lse", 2, "[H, total_q]");
    c.dim(p.lse, "lse", 0, p.q.shape[1], "H");
    c.dim(p.lse, "lse", 1, p.q.shape[0], "total_q");
  }
  if (pass == Pass::backward) {
    check_like_3d(c, p.dout, "dout", p.q, "q");
    check_like_3d(c, p.dq, "dq", p.q, "q");
    check_like_3d(c, p.dk, "dk", p.k, "k");
    check_like_3d(c, p.dv, "dv", p.k, "k");
  }
  if (!present(p.cu_seqlens_q) || !present(p.cu_seqlens_k))
    c.bad("cu_seqlens_q and cu_seqlens_k go together: give both (a packed batch) or neither");
  for (auto [t, name] : {std::pair{&p.cu_seqlens_q, "cu_seqlens_q"}, std::pair{&p.cu_seqlens_k, "cu_seqlens_k"}}) {
    c.layout(*t, name, 1, "[num_seqs + 1]");
    c.dtype_in(*t, name, {DType::i32}, "int32");
    c.positive(*t, name, 0);
  }
  if (p.cu_seqlens_k.shape[0] != p.cu_seqlens_q.shape[0])
    c.bad("cu_seqlens_k has " + std::to_string(p.cu_seqlens_k.shape[0]) + " entries but cu_seqlens_q has " +
          std::to_string(p.cu_seqlens_q.shape[0]) + ": both are [num_seqs + 1]");
  for (auto [m, name] : {std::pair{p.max_seqlen_q, "max_seqlen_q"}, std::pair{p.max_seqlen_k, "max_seqlen_k"}})
    if (m < 0 || m > kMaxDim)
      c.bad(std::string(name) + " must be in 0.." + std::to_string(kMaxDim) + ", got " + std::to_string(m));
}

// A per-key tensor of a packed batch: [heads, total_k] (heads one of `heads`), or [total_k].
void check_per_key(const Checker& c, const fdma_tensor& t, const char* name, int64_t total_k,
                   std::initializer_list<int64_t> heads, const char* doc) {
  c.layout(t, name, 2, doc);
  bool ok = false;
  for (int64_t h : heads) ok = ok || t.shape[0] == h;
  if (!ok) c.bad(std::string(name) + ".shape[0] = " + std::to_string(t.shape[0]) + " is not a head count of " + doc);
  c.dim(t, name, 1, total_k, "total_k");
}

// The sequences themselves: on the CPU the offsets are host memory and are checked whole; the
// CUDA backend cannot read them without a synchronization (its kernels clamp instead).
template <class P>
Varlen check_sequences(const Checker& c, const P& p, Backend& backend) {
  Varlen v;
  v.on = true;
  v.num_seqs = p.cu_seqlens_q.shape[0] - 1;
  v.max_q = p.max_seqlen_q;
  v.max_k = p.max_seqlen_k;
  // The offsets always have elements: with no query and no key (frameworks hand out null
  // pointers for those), the automatic backend follows them.
  const bool only_offsets = !p.q.data && !p.k.data;
  backend = c.backend(only_offsets ? p.backend : int32_t(backend), {{"q", p.q.data},
                                                                    {"k", p.k.data},
                                                                    {"cu_seqlens_q", p.cu_seqlens_q.data},
                                                                    {"cu_seqlens_k", p.cu_seqlens_k.data}});
  if (backend != Backend::cpu) return v;
  for (auto [t, name, total, max, total_name, max_name] :
       {std::tuple{&p.cu_seqlens_q, "cu_seqlens_q", p.q.shape[0], p.max_seqlen_q, "total_q = q.shape[0]", "max_seqlen_q"},
        std::tuple{&p.cu_seqlens_k, "cu_seqlens_k", p.k.shape[0], p.max_seqlen_k, "total_k = k.shape[0]",
                   "max_seqlen_k"}}) {
    const auto* cu = static_cast<const int32_t*>(t->data);
    const int64_t st = t->stride[0], n = v.num_seqs;
    const std::string what = name;  // a lambda may not capture a structured binding (C++17)
    auto at = [&](int64_t s) { return what + "[" + std::to_string(s) + "] = " + std::to_string(cu[s * st]); };
    if (cu[0] != 0) c.bad(at(0) + ", expected 0 (sequence 0 starts at row 0)");
    for (int64_t s = 0; s < n; ++s) {
      const int64_t len = int64_t(cu[(s + 1) * st]) - cu[s * st];
      if (len < 0) c.bad(at(s + 1) + " is below " + at(s) + ": offsets must be non-decreasing");
      if (len > max)
        c.bad("sequence " + std::to_string(s) + " has " + std::to_string(len) + " rows (" + name + "[" +
              std::to_string(s + 1) + "] - " + name + "[" + std::to_string(s) + "]) but " + max_name + " = " +
              std::to_string(max));
    }
    if (cu[n * st] != total) c.bad(at(n) + ", expected " + total_name + " = " + std::to_string(total));
  }
  return v;
}

AttentionProblem validate_attention_batched(const fdma_attention_params& p, Pass pass);  // below
DmaProblem validate_dma_batched(const fdma_dma_params& p, Pass pass);

AttentionProblem validate_attention_varlen(const fdma_attention_params& p, Pass pass) {
  Checker c(pass == Pass::forward ? "attention forward (packed)" : "attention backward (packed)");
  check_varlen_tensors(c, p, pass);
  const int64_t total_k = p.k.shape[0], H = p.q.shape[1], Hk = p.k.shape[1];
  const char* doc = "[1|Hk|H, total_k] (per key)";
  if (present(p.mask)) check_per_key(c, p.mask, "mask", total_k, {1, Hk, H}, doc);
  if (present(p.bias)) check_per_key(c, p.bias, "bias", total_k, {1, Hk, H}, doc);
  if (pass == Pass::backward && present(p.dbias)) check_per_key(c, p.dbias, "dbias", total_k, {1, Hk, H}, doc);
  AttentionProblem prob = validate_attention_batched(packed_view(p), pass);
  prob.varlen = check_sequences(c, p, prob.backend);
  return prob;
}

DmaProblem validate_dma_varlen(const fdma_dma_params& p, Pass pass) {
  Checker c(pass == Pass::forward ? "dynamic_mask_attention forward (packed)"
                                  : "dynamic_mask_attention backward (packed)");
  check_varlen_tensors(c, p, pass);
  const int64_t total_k = p.k.shape[0], Hk = p.k.shape[1];
  check_per_key(c, p.key_scores, "key_scores", total_k, {Hk}, "[Hk, total_k]");
  if (present(p.key_padding)) {
    c.layout(p.key_padding, "key_padding", 1, "[total_k]");
    c.dim(p.key_padding, "key_padding", 0, total_k, "total_k");
  }
  if (pass == Pass::backward && present(p.dkey_scores))
    check_per_key(c, p.dkey_scores, "dkey_scores", total_k, {Hk}, "[Hk, total_k]");
  for (auto [t, name] : {std::pair{&p.keep_begin, "keep_begin"}, std::pair{&p.keep_end, "keep_end"}})
    if (present(*t)) check_per_key(c, *t, name, total_k, {Hk}, "[Hk, total_k]");
  DmaProblem prob = validate_dma_batched(packed_view(p), pass);
  prob.varlen = check_sequences(c, p, prob.backend);
  return prob;
}


}  // namespace

void check_workspace(const char* op, const void* workspace, size_t bytes, size_t needed) {
  if (needed == 0) return;
  if (workspace == nullptr || bytes < needed)
    fail(Status::workspace, std::string(op) + ": workspace needs " + std::to_string(needed) + " bytes, got " +
                                (workspace ? std::to_string(bytes) : std::string("a null pointer")) +
                                " (ask the matching *_workspace_size function)");
}

namespace {
// The batched checks; a packed batch's view goes through them too (its offsets only as inputs
// that no output may overlap).
AttentionProblem validate_attention_batched(const fdma_attention_params& p, Pass pass) {
  Checker c(pass == Pass::forward ? "attention forward" : "attention backward");
  AttentionProblem prob;
  Collected io = check_qkv_inputs(c, p, prob);
  const Dims& d = prob.dims;
  if (present(p.mask)) {
    prob.mask = c.broadcast4(p.mask, "mask", d);
    c.dtype_in(p.mask, "mask", {DType::boolean}, "bool");
    io.input(p.mask, "mask");
  }
  if (present(p.bias)) {
    prob.bias = c.broadcast4(p.bias, "bias", d);
    check_q_or_f32(c, p.bias, "bias", prob.dtype);
    prob.bias_dtype = static_cast<DType>(p.bias.dtype);
    io.input(p.bias, "bias");
  }
  check_scalars(c, p.scale, p.softcap);
  prob.scale = resolve_scale(p.scale, d.D);
  prob.softcap = p.softcap;
  prob.causal = p.causal != 0;
  prob.deterministic = p.deterministic != 0;
  check_attention_io(c, p, pass, d, prob.dtype, io);
  if (pass == Pass::backward && present(p.dbias)) {
    if (!present(p.bias)) c.bad("dbias is given but bias is not");
    c.broadcast4(p.dbias, "dbias", d);
    for (int k = 0; k < 4; ++k)
      if (p.dbias.shape[k] != p.bias.shape[k])
        c.bad("dbias has shape " + shape_str(p.dbias) + ", expected bias's shape " + shape_str(p.bias));
    check_grad_dtype(c, p.dbias, "dbias", p.bias, "bias");
    c.no_self_overlap(p.dbias, "dbias");
    io.output(p.dbias, "dbias");
    prob.has_dbias = true;
    prob.dbias_dtype = static_cast<DType>(p.dbias.dtype);
  }
  c.no_overlap(io.outputs, io.inputs);
  prob.backend = c.backend(p.backend, io.ptrs);
  return prob;
}

}  // namespace

SelectProblem validate_select(const fdma_select_params& p) {
  Checker c("select");
  c.layout(p.key_scores, "key_scores", 3, "[B, Hk, Sk]");
  c.dtype_in(p.key_scores, "key_scores", {DType::f32, DType::f16, DType::bf16, DType::f64},
             "float16, bfloat16, float32 or float64");
  SelectProblem prob;
  prob.B = p.key_scores.shape[0];
  prob.Hk = p.key_scores.shape[1];
  prob.Sk = p.key_scores.shape[2];
  c.positive(p.key_scores, "key_scores", 1);
  if (p.num_queries < 0 || p.num_queries > kMaxDim)
    c.bad("num_queries must be in 0.." + std::to_string(kMaxDim) + ", got " + std::to_string(p.num_queries));
  prob.Sq = p.num_queries;
  check_window(c, p.window);
  prob.window = p.window;
  prob.causal = p.causal != 0;
  Collected io;
  io.input(p.key_scores, "key_scores");
  if (present(p.key_padding)) {
    check_padding(c, p.key_padding, prob.B, prob.Sk);
    prob.has_padding = true;
    io.input(p.key_padding, "key_padding");
  }
  for (auto [t, name] : {std::pair{&p.keep_begin, "keep_begin"}, std::pair{&p.keep_end, "keep_end"}}) {
    check_key_scores(c, *t, name, prob.B, prob.Hk, prob.Sk);
    c.dtype_in(*t, name, {DType::i32}, "int32");
    c.no_self_overlap(*t, name);
    io.output(*t, name);
  }
  c.no_overlap(io.outputs, io.inputs);
  prob.backend = c.backend(p.backend, io.ptrs);
  return prob;
}

namespace {
DmaProblem validate_dma_batched(const fdma_dma_params& p, Pass pass) {
  Checker c(pass == Pass::forward ? "dynamic_mask_attention forward" : "dynamic_mask_attention backward");
  DmaProblem prob;
  Collected io = check_qkv_inputs(c, p, prob);
  const Dims& d = prob.dims;
  check_key_scores(c, p.key_scores, "key_scores", d.B, d.Hk, d.Sk);
  check_q_or_f32(c, p.key_scores, "key_scores", prob.dtype);
  io.input(p.key_scores, "key_scores");
  if (present(p.key_padding)) {
    check_padding(c, p.key_padding, d.B, d.Sk);
    prob.has_padding = true;
    io.input(p.key_padding, "key_padding");
  }
  check_window(c, p.window);
  prob.window = p.window;
  prob.causal = p.causal != 0;
  prob.add_scores = p.add_scores != 0;
  prob.deterministic = p.deterministic != 0;
  check_scalars(c, p.scale, p.softcap);
  prob.scale = resolve_scale(p.scale, d.D);
  prob.softcap = p.softcap;
  check_attention_io(c, p, pass, d, prob.dtype, io);
  if (pass == Pass::backward && present(p.dkey_scores)) {
    check_key_scores(c, p.dkey_scores, "dkey_scores", d.B, d.Hk, d.Sk);
    check_grad_dtype(c, p.dkey_scores, "dkey_scores", p.key_scores, "key_scores");
    c.no_self_overlap(p.dkey_scores, "dkey_scores");
    io.output(p.dkey_scores, "dkey_scores");
    prob.has_dscores = true;
  }
  if (present(p.keep_begin) || present(p.keep_end)) {
    if (!present(p.keep_begin) || !present(p.keep_end)) c.bad("keep_begin and keep_end go together: give both or neither");
    for (auto [t, name] : {std::pair{&p.keep_begin, "keep_begin"}, std::pair{&p.keep_end, "keep_end"}}) {
      check_key_scores(c, *t, name, d.B, d.Hk, d.Sk);
      c.dtype_in(*t, name, {DType::i32}, "int32");
      if (pass == Pass::forward) {  // the forward writes the selection there
        c.no_self_overlap(*t, name);
        io.output(*t, name);
      } else {
        io.input(*t, name);
      }
    }
    prob.has_intervals = true;
  }
  c.no_overlap(io.outputs, io.inputs);
  prob.backend = c.backend(p.backend, io.ptrs);
  return prob;
}

}  // namespace

AttentionProblem validate_attention(const fdma_attention_params& p, Pass pass) {
  if (present(p.cu_seqlens_q) || present(p.cu_seqlens_k)) return validate_attention_varlen(p, pass);
  return validate_attention_batched(p, pass);
}

DmaProblem validate_dma(const fdma_dma_params& p, Pass pass) {
  if (present(p.cu_seqlens_q) || present(p.cu_seqlens_k)) return validate_dma_varlen(p, pass);
  return validate_dma_batched(p, pass);
}

namespace {

// Host-side checks of the lengths and page table, for the CPU backend, whose tensors are host
// memory (the CUDA backend clamps on the device instead: fdma.h).
void check_cache_contents(const Checker& c, const fdma_kvcache_params& p, const KvCacheProblem& prob) {
  const auto* lens = static_cast<const int32_t*>(p.cache_seqlens.data);
  const auto* table = static_cast<const int32_t*>(p.block_table.data);
  for (int64_t b = 0; b < prob.dims.B; ++b) {
    const int64_t len = lens ? lens[b * p.cache_seqlens.stride[0]] : prob.dims.Sk;
    if (len < 0 || len + prob.Snew > prob.dims.Sk)
      c.bad("cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(len) +
            (prob.Snew ? " plus " + std::to_string(prob.Snew) + " appended keys" : std::string()) +
            " does not fit the cache's " + std::to_string(prob.dims.Sk) + " positions");
    if (!prob.paged) continue;
    const int64_t pages = (len + prob.Snew + prob.page_size - 1) / prob.page_size;
    for (int64_t pg = 0; pg < pages; ++pg) {
      const int64_t page = table[b * p.block_table.stride[0] + pg * p.block_table.stride[1]];
      if (page < 0 || page >= prob.num_pages)
        c.bad("block_table[" + std::to_string(b) + ", " + std::to_string(pg) + "] = " + std::to_string(page) +
              " is not a page of the cache (0.." + std::to_string(prob.num_pages - 1) + ")");
    }
  }
}

}  // namespace

KvCacheProblem validate_kvcache(const fdma_kvcache_params& p) {
  Checker c("kvcache attention");
  KvCacheProblem prob;
  c.layout(p.q, "q", 4, "[B, Sq, H, D]");  // B and Sq may be 0: nothing to compute
  c.positive(p.q, "q", 2);
  c.positive(p.q, "q", 3);
  c.dtype_in(p.q, "q", {DType::f32, DType::f16, DType::bf16, DType::f64}, "float16, bfloat16, float32 or float64");
  prob.dtype = static_cast<DType>(p.q.dtype);
  Dims& d = prob.dims;
  d.B = p.q.shape[0], d.Sq = p.q.shape[1], d.H = p.q.shape[2], d.D = p.q.shape[3];
  if (d.D > FDMA_MAX_HEAD_DIM)
    c.bad("head dim D = q.shape[3] = " + std::to_string(d.D) + " is not supported (1 to " +
          std::to_string(FDMA_MAX_HEAD_DIM) + ")");
  c.unit_last_stride(p.q, "q");
  const std::string qdt = dtype_name(prob.dtype);
  Collected io;
  io.input(p.q, "q");

  prob.paged = present(p.block_table);
  const char* cache_dims = prob.paged ? "[num_pages, page_size, Hk, D]" : "[B, max_len, Hk, D]";
  for (auto [t, name] : {std::pair{&p.k_cache, "k_cache"}, std::pair{&p.v_cache, "v_cache"}}) {
    c.layout(*t, name, 4, cache_dims);
    for (int k = prob.paged ? 0 : 1; k < 3; ++k) c.positive(*t, name, k);
    if (t->dtype != p.q.dtype)
      c.bad(std::string(name) + " has dtype " + dtype_name(static_cast<DType>(t->dtype)) + ", expected q's dtype " + qdt);
    c.dim(*t, name, 3, d.D, "head dim D");
    c.unit_last_stride(*t, name);
  }
  d.Hk = p.k_cache.shape[2];
  for (int k = 0; k < 3; ++k) c.dim(p.v_cache, "v_cache", k, p.k_cache.shape[k], "k_cache's size");
  if (d.H % d.Hk != 0)
    c.bad("H = " + std::to_string(d.H) + " (q.shape[2]) must be a multiple of Hk = " + std::to_string(d.Hk) +
          " (k_cache.shape[2])");
  if (prob.paged) {
    prob.num_pages = p.k_cache.shape[0];
    prob.page_size = p.k_cache.shape[1];
    if (prob.page_size % 16 != 0)
      c.bad("page_size = k_cache.shape[1] = " + std::to_string(prob.page_size) + " must be a multiple of 16");
    c.layout(p.block_table, "block_table", 2, "[B, max_pages]");
    c.positive(p.block_table, "block_table", 1);
    c.dtype_in(p.block_table, "block_table", {DType::i32}, "int32");
    c.dim(p.block_table, "block_table", 0, d.B, "B");
    prob.max_pages = p.block_table.shape[1];
    d.Sk = prob.max_pages * prob.page_size;
    if (d.Sk > kMaxDim) c.bad("max_pages * page_size = " + std::to_string(d.Sk) + " exceeds 2^31 - 1 positions");
    io.input(p.block_table, "block_table");
  } else {
    c.dim(p.k_cache, "k_cache", 0, d.B, "B");
    d.Sk = p.k_cache.shape[1];
  }
  if (present(p.cache_seqlens)) {
    c.layout(p.cache_seqlens, "cache_seqlens", 1, "[B]");
    c.dtype_in(p.cache_seqlens, "cache_seqlens", {DType::i32}, "int32");
    c.dim(p.cache_seqlens, "cache_seqlens", 0, d.B, "B");
    io.input(p.cache_seqlens, "cache_seqlens");
  }

  prob.dynamic = present(p.score_cache);
  if (prob.dynamic) {
    if (prob.paged) {
      c.layout(p.score_cache, "score_cache", 3, "[num_pages, page_size, Hk]");
      c.dim(p.score_cache, "score_cache", 0, prob.num_pages, "num_pages");
      c.dim(p.score_cache, "score_cache", 1, prob.page_size, "page_size");
      c.dim(p.score_cache, "score_cache", 2, d.Hk, "Hk");
    } else {
      c.layout(p.score_cache, "score_cache", 3, "[B, Hk, max_len]");
      c.dim(p.score_cache, "score_cache", 0, d.B, "B");
      c.dim(p.score_cache, "score_cache", 1, d.Hk, "Hk");
      c.dim(p.score_cache, "score_cache", 2, d.Sk, "max_len");
    }
    check_q_or_f32(c, p.score_cache, "score_cache", prob.dtype);
    prob.score_dtype = static_cast<DType>(p.score_cache.dtype);
    check_window(c, p.window);
    prob.window = p.window;
  } else if (p.window != 0) {
    c.bad("window = " + std::to_string(p.window) + " needs score_cache (without it the call is dense attention, window 0)");
  }

  // New tokens to append.
  prob.append = present(p.k) || present(p.v) || present(p.scores);
  if (prob.append && !present(p.cache_seqlens))
    c.bad("k, v and scores are appended at cache_seqlens, which is not given (without it every cache is full)");
  if (prob.append) {
    if (!present(p.k) || !present(p.v)) c.bad("k and v go together: give both or neither");
    if (prob.dynamic && !present(p.scores)) c.bad("scores is required with k and v when score_cache is given");
    if (!prob.dynamic && present(p.scores)) c.bad("scores is given but score_cache is not");
    for (auto [t, name] : {std::pair{&p.k, "k"}, std::pair{&p.v, "v"}}) {
      c.layout(*t, name, 4, "[B, Snew, Hk, D]");
      c.positive(*t, name, 1);
      if (t->dtype != p.q.dtype)
        c.bad(std::string(name) + " has dtype " + dtype_name(static_cast<DType>(t->dtype)) + ", expected q's dtype " + qdt);
      c.dim(*t, name, 0, d.B, "B");
      c.dim(*t, name, 2, d.Hk, "Hk");
      c.dim(*t, name, 3, d.D, "head dim D");
      c.unit_last_stride(*t, name);
      io.input(*t, name);
    }
    prob.Snew = p.k.shape[1];
    c.dim(p.v, "v", 1, prob.Snew, "Snew (k.shape[1])");
    if (prob.dynamic) {
      c.layout(p.scores, "scores", 3, "[B, Hk, Snew]");
      c.dim(p.scores, "scores", 0, d.B, "B");
      c.dim(p.scores, "scores", 1, d.Hk, "Hk");
      c.dim(p.scores, "scores", 2, prob.Snew, "Snew (k.shape[1])");
      if (p.scores.dtype != p.score_cache.dtype)
        c.bad(std::string("scores has dtype ") + dtype_name(static_cast<DType>(p.scores.dtype)) +
              ", expected score_cache's dtype " + dtype_name(prob.score_dtype));
      io.input(p.scores, "scores");
    }
  }
  if (prob.append && d.Sq == 0 && d.B > 0)
    c.bad("q has no queries (Sq = 0) but k and v are given: the append runs with the attention, pass at least one "
          "query");
  // The caches are written when appending: they must not overlap each other or the inputs.
  std::vector<std::pair<const fdma_tensor*, const char*>> caches = {{&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}};
  if (prob.dynamic) caches.emplace_back(&p.score_cache, "score_cache");
  Collected written;
  if (present(p.select_state)) {
    if (!prob.dynamic) c.bad("select_state is given but score_cache is not (dense attention selects nothing)");
    prob.state_slots = std::min<int64_t>(prob.window, d.Sk);
    c.layout(p.select_state, "select_state", 3, "[B, Hk, 1 + 2 * min(window, capacity)]");
    c.dtype_in(p.select_state, "select_state", {DType::i32}, "int32");
    c.dim(p.select_state, "select_state", 0, d.B, "B");
    c.dim(p.select_state, "select_state", 1, d.Hk, "Hk");
    c.dim(p.select_state, "select_state", 2, 1 + 2 * prob.state_slots, "1 + 2 * min(window, capacity)");
    c.unit_last_stride(p.select_state, "select_state");
    c.no_self_overlap(p.select_state, "select_state");
    written.output(p.select_state, "select_state");
  }
  for (auto [t, name] : caches) {
    if (prob.append) {
      c.no_self_overlap(*t, name);
      written.output(*t, name);
    } else {
      io.input(*t, name);
    }
  }
  prob.causal = p.causal != 0;
  prob.add_scores = p.add_scores != 0;
  check_scalars(c, p.scale, p.softcap);
  prob.scale = resolve_scale(p.scale, d.D);
  prob.softcap = p.softcap;

  check_like(c, p.out, "out", p.q, "q", true);
  io.output(p.out, "out");
  if (present(p.lse)) {
    check_lse(c, p.lse, d, prob.dtype, true);
    io.output(p.lse, "lse");
  }
  // Outputs and written caches against every input; the caches are read too, so out and lse
  // must not overlap them either.
  std::vector<Span> outputs = io.outputs, inputs = io.inputs;
  outputs.insert(outputs.end(), written.outputs.begin(), written.outputs.end());
  c.no_overlap(outputs, inputs);
  auto ptrs = io.ptrs;
  ptrs.insert(ptrs.end(), written.ptrs.begin(), written.ptrs.end());
  prob.backend = c.backend(p.backend, ptrs);
  if (prob.backend == Backend::cpu) check_cache_contents(c, p, prob);
  return prob;
}

}  // namespace fdma::detail
