// `fdma run`: the main job. A dynamic-mask attention forward and backward on a realistic
// problem, on the best backend present, checked against an independent float64 reference on
// a slice (sampled query rows and keys).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <tuple>

#include "cli.hpp"
#include "commands.hpp"
#include "device_mirror.hpp"
#include "dma_problem.hpp"
#include "slice_check.hpp"

namespace fdma::tool {

const char* const kRunHelp =
    "usage: fdma run [flags]\n"
    "\n"
    "Runs dynamic_mask_attention forward and backward: each query keeps the top-w keys by a\n"
    "per-key importance score (A * softplus(v . u) per KV head, as in the DMA papers) among the\n"
    "keys it may see, and attends to those alone. Runs on the GPU when one is present (bf16 and\n"
    "fp16; the CPU backend takes every dtype). Prints the backend, shapes, times, and the\n"
    "error against a float64 reference on sampled query rows (out, lse, dq) and keys (dk, dv,\n"
    "dkey_scores). Exits 1 if the error exceeds what the dtype allows.\n"
    "\n"
    "flags (default):\n"
    "  --batch N        (1)      --seqlen N     (2048)   query length Sq\n"
    "  --seqlen-k N     (0 = Sq) key length Sk\n"
    "  --heads N        (4)      --kv-heads N   (2)      GQA when heads > kv-heads\n"
    "  --headdim N      (64)     --window N     (256)    keys kept per query\n"
    "  --dtype T        (bf16)   bf16, fp16, fp32 or fp64\n"
    "  --causal 0|1     (1)      --backend B    (auto)   auto, cpu or cuda\n"
    "  --threads N      (0 = all cores)  --seed N (1)    --check 0|1 (1)\n"
    "  --packed L1,L2,...        a packed batch of sequences of these lengths (varlen: no\n"
    "                            padding; replaces --batch, --seqlen and --seqlen-k)\n"
    "\n"
    "The check runs on the CPU in float64 (its key part on --threads threads); a sampled key's\n"
    "gradients walk every query that keeps it, so it grows with the run (--check 0 skips it).\n"
    "A packed batch is checked on its first, longest and last sequences, each as its own problem.\n";

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// `auto`: the GPU when one is usable and the dtype is one its kernels take, else the CPU.
Backend parse_backend(const std::string& s, DType dtype, std::string& note) {
  if (s == "auto") {
    if (!cuda_available()) return Backend::cpu;
    if (dtype == DType::bf16 || dtype == DType::f16) return Backend::cuda;
    note = " (a GPU is present; its kernels take bf16 and fp16)";
    return Backend::cpu;
  }
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda") return Backend::cuda;
  throw std::invalid_argument("--backend must be auto, cpu or cuda, got '" + s + "'");
}

// max |a - r| / max |r| over a set of pairs.
struct ErrorStat {
  double worst = 0, scale = 0;
  void add(double a, double r) {
    worst = std::max(worst, std::fabs(a - r));
    scale = std::max(scale, std::fabs(r));
  }
  double rel() const { return scale > 0 ? worst / scale : worst; }
};

std::vector<int64_t> parse_lengths(const std::string& s) {
  std::vector<int64_t> lens;
  size_t at = 0;
  while (at < s.size()) {
    const size_t comma = s.find(',', at);
    const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0)
      throw std::invalid_argument("--packed expects lengths >= 0 separated by commas, got '" + s + "'");
    lens.push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return lens;
}

// The tensors of a batch of one without its batch dim: a packed batch's layouts.
Tensor drop_batch(Tensor t) {
  for (int d = 1; d < t.ndim; ++d) t.shape[d - 1] = t.shape[d], t.stride[d - 1] = t.stride[d];
  --t.ndim;
  return t;
}

// Sequence [start, start + len) of a packed run (B = 1) as its own problem, results included.
DmaProblemData sequence_slice(const DmaProblemData& d, int64_t start, int64_t len) {
  Shape s = d.s;
  s.Sq = s.Sk = len;
  DmaProblemData r(s, 0);
  auto copy_rows = [&](const test::HostTensor& from, test::HostTensor& to, int64_t row_elems) {
    for (int64_t e = 0; e < len * row_elems; ++e) to.set(e, from.get(start * row_elems + e));
  };
  for (auto [from, to, heads] : {std::tuple{&d.q, &r.q, s.H}, std::tuple{&d.out, &r.out, s.H}, std::tuple{&d.dout, &r.dout, s.H},
                                 std::tuple{&d.dq, &r.dq, s.H}, std::tuple{&d.k, &r.k, s.Hk}, std::tuple{&d.v, &r.v, s.Hk},
                                 std::tuple{&d.dk, &r.dk, s.Hk}, std::tuple{&d.dv, &r.dv, s.Hk}})
    copy_rows(*from, *to, heads * s.D);
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < len; ++i) r.lse.set(h * len + i, d.lse.get(h * d.s.Sq + start + i));
  for (int64_t hk = 0; hk < s.Hk; ++hk)
    for (int64_t j = 0; j < len; ++j) {
      r.scores.set(hk * len + j, d.scores.get(hk * d.s.Sk + start + j));
      r.dscores.set(hk * len + j, d.dscores.get(hk * d.s.Sk + start + j));
    }
  return r;
}

double allowed(DType dt, bool gradient) {
  const double unit = dt == DType::bf16 ? 1.0 / 256 : dt == DType::f16 ? 1.0 / 2048 : dt == DType::f32 ? 1e-5 : 1e-10;
  return (gradient ? 8.0 : 2.0) * unit;
}

struct Errors {
  ErrorStat out, lse, dq, dk, dv, ds;
  int rows = 0, keys = 0;
};

// Sampled rows (first, last and spread queries of every head of batch 0 and the last batch) and
// keys of one problem against the float64 reference.
void check_problem(const DmaProblemData& data, Errors& e) {
  const Shape& s = data.s;
  SliceReference ref(data);
  const int kRows = 8;
  for (int64_t b : {int64_t(0), s.B - 1}) {
    for (int64_t h = 0; h < s.H; ++h)
      for (int r = 0; r < kRows; ++r) {
        const int64_t i = r == kRows - 1 ? s.Sq - 1 : (s.Sq * r) / kRows;
        const auto& row = ref.row(b, h, i);
        for (int64_t dd = 0; dd < s.D; ++dd) {
          const int64_t idx = ((b * s.Sq + i) * s.H + h) * s.D + dd;
          e.out.add(data.out.get(idx), row.out[dd]);
          e.dq.add(data.dq.get(idx), row.dq[dd]);
        }
        const double lse = data.lse.get((b * s.H + h) * s.Sq + i);
        if (std::isfinite(row.lse)) e.lse.add(lse, row.lse);
        ++e.rows;
      }
    if (s.B == 1) break;
  }
  std::fprintf(stderr, "[fdma] checking keys against the float64 reference...\n");
  for (int64_t hk = 0; hk < s.Hk; ++hk) {
    // The ends, the middle, and the best-scored key: without a causal mask every query keeps
    // the same w keys, which the other three may all miss (their gradients then all zero).
    int64_t best = 0;
    for (int64_t j = 1; j < s.Sk; ++j)
      if (data.scores.get(hk * s.Sk + j) > data.scores.get(hk * s.Sk + best)) best = j;
    const std::vector<int64_t> sampled_keys = {0, s.Sk / 2, s.Sk - 1, best};
    const auto grads = ref.keys(0, hk, sampled_keys, num_threads());
    for (size_t k = 0; k < sampled_keys.size(); ++k) {
      const int64_t j = sampled_keys[k];
      const auto& g = grads[k];
      for (int64_t dd = 0; dd < s.D; ++dd) {
        const int64_t idx = ((0 * s.Sk + j) * s.Hk + hk) * s.D + dd;
        e.dk.add(data.dk.get(idx), g.dk[dd]);
        e.dv.add(data.dv.get(idx), g.dv[dd]);
      }
      e.ds.add(data.dscores.get(hk * s.Sk + j), g.dscore);
      ++e.keys;
    }
  }}

}  // namespace

int run_main_job(const std::vector<std::string>& argv) {
  cli::Args a(argv, {{"batch", "1"}, {"seqlen", "2048"}, {"seqlen-k", "0"}, {"heads", "4"}, {"kv-heads", "2"},
                     {"headdim", "64"}, {"window", "256"}, {"dtype", "bf16"}, {"causal", "1"}, {"backend", "auto"},
                     {"threads", "0"}, {"seed", "1"}, {"check", "1"}, {"packed", ""}});
  Shape s{a.integer("batch"), a.integer("seqlen"), a.integer("seqlen-k"), a.integer("heads"), a.integer("kv-heads"),
          a.integer("headdim"), a.integer("window"), a.integer("causal") != 0, parse_dtype(a.str("dtype"))};
  if (s.Sk == 0) s.Sk = s.Sq;
  const std::vector<int64_t> packed = a.str("packed").empty() ? std::vector<int64_t>{} : parse_lengths(a.str("packed"));
  int64_t longest = 0;
  if (!packed.empty()) {  // one row of every sequence, back to back
    s.B = 1, s.Sq = 0;
    for (int64_t len : packed) s.Sq += len, longest = std::max(longest, len);
    s.Sk = s.Sq;
  }
  if (s.B < 1 || s.Sq < 1 || s.Sk < 1 || s.H < 1 || s.Hk < 1 || s.D < 1)
    throw std::invalid_argument("sizes must be >= 1");
  set_num_threads(static_cast<int>(a.integer("threads")));
  std::string backend_note;
  const Backend backend = parse_backend(a.str("backend"), s.dtype, backend_note);
#ifndef FDMA_HAVE_CUDA
  if (backend == Backend::cuda) throw std::invalid_argument("this build has no CUDA backend; use --backend cpu");
#endif

  std::fprintf(stderr, "[fdma] preparing inputs...\n");
  DmaProblemData data(s, static_cast<uint64_t>(a.integer("seed")));
  DmaParams p = data.params(backend);
  std::vector<unsigned char> host_ws;
  test::HostTensor cu(DType::i32, {int64_t(packed.size()) + 1});
  for (size_t i = 0, at = 0; i < packed.size(); ++i) cu.set(int64_t(i + 1), double(at += packed[i]));
#ifdef FDMA_HAVE_CUDA
  DeviceMirror mirror;
  if (backend == Backend::cuda) {
    p.q = mirror.add(data.q), p.k = mirror.add(data.k), p.v = mirror.add(data.v);
    p.key_scores = mirror.add(data.scores), p.dout = mirror.add(data.dout);
    p.out = mirror.add(data.out), p.lse = mirror.add(data.lse);
    p.dq = mirror.add(data.dq), p.dk = mirror.add(data.dk), p.dv = mirror.add(data.dv);
    p.dkey_scores = mirror.add(data.dscores);
  }
#endif
  if (!packed.empty()) {
    for (fdma_tensor* t : {&p.q, &p.k, &p.v, &p.key_scores, &p.dout, &p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.dkey_scores})
      *t = drop_batch(*t);
    p.cu_seqlens_q = p.cu_seqlens_k = cu.view();
#ifdef FDMA_HAVE_CUDA
    if (backend == Backend::cuda) p.cu_seqlens_q = p.cu_seqlens_k = mirror.add(cu);
#endif
    p.max_seqlen_q = p.max_seqlen_k = longest;
  }
  const size_t ws_bytes = std::max(dma_workspace_size(p, Pass::forward), dma_workspace_size(p, Pass::backward));
#ifdef FDMA_HAVE_CUDA
  if (backend == Backend::cuda) p.workspace = mirror.scratch(ws_bytes);
#endif
  if (backend == Backend::cpu) {
    host_ws.resize(ws_bytes);
    p.workspace = host_ws.data();
  }
  p.workspace_bytes = ws_bytes;
  auto sync = [&] {
#ifdef FDMA_HAVE_CUDA
    if (backend == Backend::cuda) device_sync();
#endif
  };
  if (backend == Backend::cuda) {  // first launches pay one-time setup: warm up, then time
    dma_forward(p);
    dma_backward(p);
    sync();
  }

  std::fprintf(stderr, "[fdma] forward...\n");
  auto t0 = Clock::now();
  dma_forward(p);
  sync();
  const double t_fwd = seconds_since(t0);
  std::fprintf(stderr, "[fdma] backward...\n");
  t0 = Clock::now();
  dma_backward(p);
  sync();
  const double t_bwd = seconds_since(t0);
#ifdef FDMA_HAVE_CUDA
  if (backend == Backend::cuda) mirror.download_all();
#endif

  std::printf("fdma run: dynamic_mask_attention forward + backward\n");
  if (backend == Backend::cpu)
    std::printf("  backend    cpu (%d threads)%s\n", num_threads(), backend_note.c_str());
  else
    std::printf("  backend    cuda\n");
  std::printf("  shape      %s\n", s.str().c_str());
  if (!packed.empty())
    std::printf("  packed     %zu sequences, the longest %lld (cu_seqlens, no padding)\n", packed.size(),
                static_cast<long long>(longest));
  std::printf("  forward    %.3f ms\n  backward   %.3f ms\n  total      %.3f ms\n", 1e3 * t_fwd, 1e3 * t_bwd,
              1e3 * (t_fwd + t_bwd));
  std::printf("  workspace  %.1f MB\n", ws_bytes / 1e6);
  if (a.integer("check") == 0) return 0;

  Errors e;
  if (packed.empty()) {
    check_problem(data, e);
  } else {  // the first, longest and last sequences, each as its own problem
    std::vector<size_t> picked;
    auto pick = [&](size_t i) {
      if (packed[i] > 0 && std::find(picked.begin(), picked.end(), i) == picked.end()) picked.push_back(i);
    };
    for (size_t i = 0; i < packed.size() && picked.empty(); ++i) pick(i);  // the first non-empty
    pick(size_t(std::find(packed.begin(), packed.end(), longest) - packed.begin()));
    for (size_t i = packed.size(); i-- > 0;)  // the last non-empty
      if (packed[i] > 0) {
        pick(i);
        break;
      }
    std::vector<int64_t> starts(packed.size(), 0);
    for (size_t i = 1; i < packed.size(); ++i) starts[i] = starts[i - 1] + packed[i - 1];
    for (size_t i : picked) check_problem(sequence_slice(data, starts[i], packed[i]), e);
  }
  const int checked_rows = e.rows, checked_keys = e.keys;
  const ErrorStat &e_out = e.out, &e_lse = e.lse, &e_dq = e.dq, &e_dk = e.dk, &e_dv = e.dv, &e_ds = e.ds;
  const double fwd_tol = allowed(s.dtype, false), bwd_tol = allowed(s.dtype, true);
  bool ok = true;
  std::printf("  check      %d query rows and %d keys against a float64 reference (max |err| / max |ref|)\n",
              checked_rows, checked_keys);
  auto line = [&](const char* name, const ErrorStat& e, double tol) {
    const bool pass = e.rel() <= tol;
    ok &= pass;
    std::printf("    %-12s %.2e  (allowed %.1e)  %s\n", name, e.rel(), tol, pass ? "ok" : "FAIL");
  };
  line("out", e_out, fwd_tol);
  line("lse", e_lse, 1e-5);
  line("dq", e_dq, bwd_tol);
  line("dk", e_dk, bwd_tol);
  line("dv", e_dv, bwd_tol);
  line("dkey_scores", e_ds, bwd_tol);
  std::printf("  result     %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace fdma::tool
