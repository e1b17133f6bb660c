// `fdma run`: the main job. A dynamic-mask attention forward and backward on a realistic
// problem, on the best backend present, checked against an independent float64 reference on
// a slice (sampled query rows and keys).
#include <chrono>
#include <cstdio>
#include <stdexcept>

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
    "\n"
    "The check runs on the CPU in float64 (its key part on --threads threads); a sampled key's\n"
    "gradients walk every query that keeps it, so it grows with the run (--check 0 skips it).\n";

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

double allowed(DType dt, bool gradient) {
  const double unit = dt == DType::bf16 ? 1.0 / 256 : dt == DType::f16 ? 1.0 / 2048 : dt == DType::f32 ? 1e-5 : 1e-10;
  return (gradient ? 8.0 : 2.0) * unit;
}

}  // namespace

int run_main_job(const std::vector<std::string>& argv) {
  cli::Args a(argv, {{"batch", "1"}, {"seqlen", "2048"}, {"seqlen-k", "0"}, {"heads", "4"}, {"kv-heads", "2"},
                     {"headdim", "64"}, {"window", "256"}, {"dtype", "bf16"}, {"causal", "1"}, {"backend", "auto"},
                     {"threads", "0"}, {"seed", "1"}, {"check", "1"}});
  Shape s{a.integer("batch"), a.integer("seqlen"), a.integer("seqlen-k"), a.integer("heads"), a.integer("kv-heads"),
          a.integer("headdim"), a.integer("window"), a.integer("causal") != 0, parse_dtype(a.str("dtype"))};
  if (s.Sk == 0) s.Sk = s.Sq;
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
  std::printf("  forward    %.3f ms\n  backward   %.3f ms\n  total      %.3f ms\n", 1e3 * t_fwd, 1e3 * t_bwd,
              1e3 * (t_fwd + t_bwd));
  std::printf("  workspace  %.1f MB\n", ws_bytes / 1e6);
  if (a.integer("check") == 0) return 0;

  // Sampled rows: first, last and spread queries of every head of batch 0 and the last batch.
  SliceReference ref(data);
  ErrorStat e_out, e_lse, e_dq, e_dk, e_dv, e_ds;
  const int kRows = 8;
  int checked_rows = 0, checked_keys = 0;
  for (int64_t b : {int64_t(0), s.B - 1}) {
    for (int64_t h = 0; h < s.H; ++h)
      for (int r = 0; r < kRows; ++r) {
        const int64_t i = r == kRows - 1 ? s.Sq - 1 : (s.Sq * r) / kRows;
        const auto& row = ref.row(b, h, i);
        for (int64_t dd = 0; dd < s.D; ++dd) {
          const int64_t idx = ((b * s.Sq + i) * s.H + h) * s.D + dd;
          e_out.add(data.out.get(idx), row.out[dd]);
          e_dq.add(data.dq.get(idx), row.dq[dd]);
        }
        const double lse = data.lse.get((b * s.H + h) * s.Sq + i);
        if (std::isfinite(row.lse)) e_lse.add(lse, row.lse);
        ++checked_rows;
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
        e_dk.add(data.dk.get(idx), g.dk[dd]);
        e_dv.add(data.dv.get(idx), g.dv[dd]);
      }
      e_ds.add(data.dscores.get(hk * s.Sk + j), g.dscore);
      ++checked_keys;
    }
  }
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
