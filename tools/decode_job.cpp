// `fdma decode`: the inference variant of the main job. A batch of ragged KV caches
// (contiguous or paged with shuffled pages), then a short generation loop: each step appends
// its new tokens (keys, values, scores) and attends with the new queries, each keeping its
// top-w cached keys. Every step is checked against a float64 reference over the whole cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "cli.hpp"
#include "commands.hpp"
#include "device_mirror.hpp"
#include "kvcache_case.hpp"

namespace fdma::tool {

const char* const kDecodeHelp =
    "usage: fdma decode [flags]\n"
    "\n"
    "Decodes against a KV cache: B sequences whose caches hold about --cache keys each\n"
    "(ragged: sequence b holds cache - b * cache / (2B)), then --steps steps that each append\n"
    "--queries new tokens (keys, values and per-key scores) and attend with as many queries,\n"
    "each keeping the top --window cached keys it may see (causal). Runs on the GPU when one\n"
    "is present (bf16, fp16), else on the CPU. Prints the backend, shapes, the time per step,\n"
    "and each step's error against a float64 reference; exits 1 if one exceeds what the dtype\n"
    "allows.\n"
    "\n"
    "flags (default):\n"
    "  --batch N     (4)      --cache N      (8192)   keys per sequence before the first step\n"
    "  --heads N     (8)      --kv-heads N   (2)      --headdim N (64)\n"
    "  --window N    (256)    --queries N    (1)      new tokens per step (speculative: > 1)\n"
    "  --steps N     (8)      --page-size N  (0 = contiguous cache; a multiple of 16: paged)\n"
    "  --dtype T     (bf16)   bf16, fp16, fp32 or fp64 (the last two on the CPU)\n"
    "  --backend B   (auto)   auto, cpu or cuda     --seed N (1)   --check 0|1 (1)\n"
    "  --state 0|1   (1)      keep a select_state across steps (each step grows the kept sets\n"
    "                         by its new keys instead of selecting over the whole cache)\n";

namespace {

using Clock = std::chrono::steady_clock;

DType decode_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::f16;
  if (s == "fp32") return DType::f32;
  if (s == "fp64") return DType::f64;
  throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or fp64, got '" + s + "'");
}

double max_rel(const std::vector<double>& got, const std::vector<double>& ref) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace

int run_decode_job(const std::vector<std::string>& argv) {
  cli::Args a(argv, {{"batch", "4"}, {"cache", "8192"}, {"heads", "8"}, {"kv-heads", "2"}, {"headdim", "64"},
                     {"window", "256"}, {"queries", "1"}, {"steps", "8"}, {"page-size", "0"}, {"dtype", "bf16"},
                     {"backend", "auto"}, {"seed", "1"}, {"check", "1"}, {"state", "1"}});
  test::KvCase c;
  c.B = a.integer("batch"), c.H = a.integer("heads"), c.Hk = a.integer("kv-heads"), c.D = a.integer("headdim");
  c.w = a.integer("window"), c.Sq = a.integer("queries"), c.Snew = c.Sq, c.page_size = a.integer("page-size");
  c.dtype = decode_dtype(a.str("dtype"));
  c.score_dtype = DType::f32;
  c.seed = static_cast<uint64_t>(a.integer("seed"));
  c.state = a.integer("state") != 0;
  const int64_t cache = a.integer("cache"), steps = a.integer("steps");
  if (c.B < 1 || c.H < 1 || c.Hk < 1 || c.D < 1 || c.w < 1 || c.Sq < 1 || cache < 0 || steps < 1)
    throw std::invalid_argument("sizes must be >= 1 (--cache >= 0)");
  c.max_len = cache + steps * c.Sq;
  for (int64_t b = 0; b < c.B; ++b) c.lens.push_back(cache - b * cache / (2 * c.B));
  std::string backend = a.str("backend");
  if (backend == "auto") backend = cuda_available() && (c.dtype == DType::bf16 || c.dtype == DType::f16) ? "cuda" : "cpu";
  if (backend != "cpu" && backend != "cuda") throw std::invalid_argument("--backend must be auto, cpu or cuda");
#ifndef FDMA_HAVE_CUDA
  if (backend == "cuda") throw std::invalid_argument("this build has no CUDA backend; use --backend cpu");
#endif
  const bool gpu = backend == "cuda";

  std::fprintf(stderr, "[fdma] preparing caches...\n");
  test::KvRun r(c);
  KvCacheParams p = r.params();
  p.backend = gpu ? FDMA_BACKEND_CUDA : FDMA_BACKEND_CPU;
  std::vector<unsigned char> host_ws;
#ifdef FDMA_HAVE_CUDA
  DeviceMirror mirror;
  if (gpu) {
    p.q = mirror.add(r.q), p.k_cache = mirror.add(r.k_cache), p.v_cache = mirror.add(r.v_cache);
    p.score_cache = mirror.add(r.score_cache), p.cache_seqlens = mirror.add(r.seqlens);
    if (c.page_size) p.block_table = mirror.add(r.table);
    p.k = mirror.add(r.k_new), p.v = mirror.add(r.v_new), p.scores = mirror.add(r.s_new);
    p.out = mirror.add(r.out), p.lse = mirror.add(r.lse);
    if (c.state) p.select_state = mirror.add(r.state);
  }
#endif
  const size_t ws_bytes = kvcache_workspace_size(p);
#ifdef FDMA_HAVE_CUDA
  if (gpu) p.workspace = mirror.scratch(ws_bytes);
#endif
  if (!gpu) {
    host_ws.resize(ws_bytes);
    p.workspace = host_ws.data();
  }
  p.workspace_bytes = ws_bytes;

  std::printf("fdma decode: dynamic_mask_attention against a KV cache, %lld steps\n", static_cast<long long>(steps));
  std::printf("  backend    %s\n", gpu ? "cuda" : "cpu");
  std::printf("  shape      B%lld H%lld Hk%lld D%lld w%lld, %lld new tokens a step, caches of %lld..%lld keys, %s, %s\n",
              static_cast<long long>(c.B), static_cast<long long>(c.H), static_cast<long long>(c.Hk),
              static_cast<long long>(c.D), static_cast<long long>(c.w), static_cast<long long>(c.Sq),
              static_cast<long long>(c.lens.back()), static_cast<long long>(c.lens.front()),
              c.page_size ? ("paged (" + std::to_string(c.page_size) + " keys a page, shuffled)").c_str() : "contiguous",
              dtype_name(c.dtype));
  std::printf("  selection  %s\n", c.state ? "a select_state kept across steps" : "over the whole cache every step");
  const double tol = (c.dtype == DType::bf16 ? 1.0 / 256 : c.dtype == DType::f16 ? 1.0 / 2048 : 1e-5) * 2;
  std::mt19937_64 rng(c.seed + 1000);
  std::vector<double> times;
  bool ok = true;
  for (int64_t step = 0; step < steps; ++step) {
    r.q.fill_uniform(rng, -1.5, 1.5);
    r.k_new.fill_uniform(rng, -1.5, 1.5);
    r.v_new.fill_uniform(rng, -1, 1);
    r.s_new.fill_uniform(rng, -2, 2);
    for (int64_t b = 0; b < c.B; ++b) r.seqlens.set(b, double(r.c.lens[b]));
#ifdef FDMA_HAVE_CUDA
    if (gpu) {
      for (test::HostTensor* t : {&r.q, &r.k_new, &r.v_new, &r.s_new, &r.seqlens}) mirror.upload(*t);
    }
#endif
    const auto t0 = Clock::now();
    kvcache_forward(p);
#ifdef FDMA_HAVE_CUDA
    if (gpu) device_sync();
#endif
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
#ifdef FDMA_HAVE_CUDA
    if (gpu) mirror.download(r.out), mirror.download(r.lse);
#endif
    if (a.integer("check")) {
      r.append_reference();
      const auto [ref_out, ref_lse] = r.reference();
      const double err = max_rel(r.out.values(), ref_out);
      const bool pass = err <= tol;
      ok &= pass;
      std::printf("  step %-4lld  %.3f ms   out error %.2e (allowed %.1e)  %s\n", static_cast<long long>(step),
                  1e3 * times.back(), err, tol, pass ? "ok" : "FAIL");
    } else {
      std::printf("  step %-4lld  %.3f ms\n", static_cast<long long>(step), 1e3 * times.back());
    }
    for (int64_t b = 0; b < c.B; ++b) r.c.lens[b] += c.Sq;  // the caller advances the lengths
  }
  std::vector<double> sorted(times.begin() + (times.size() > 1 ? 1 : 0), times.end());
  std::sort(sorted.begin(), sorted.end());
  std::printf("  median     %.3f ms a step (host clock around one call, after the first)\n",
              1e3 * sorted[sorted.size() / 2]);
  std::printf("  workspace  %.1f MB\n", ws_bytes / 1e6);
  if (a.integer("check")) std::printf("  result     %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace fdma::tool
