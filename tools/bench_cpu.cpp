// `fdma bench`: CPU backend timings of dynamic_mask_attention forward and backward, median
// of several runs after a warm-up. GPU benchmarks live with the GPU kernels.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "dma_problem.hpp"

namespace fdma::tool {

const char* const kBenchHelp =
    "usage: fdma bench [flags]\n"
    "\n"
    "Times dynamic_mask_attention forward and backward on the CPU backend (median of --repeat\n"
    "runs after one warm-up) for each dtype in --dtypes, and prints a table. Useful TF/s counts\n"
    "only kept (query, key) pairs: fwd 4*D flops per pair, bwd 2.5x that.\n"
    "\n"
    "flags (default): --batch 1 --seqlen 2048 --heads 4 --kv-heads 2 --headdim 64 --window 256\n"
    "                 --causal 1 --dtypes fp32,bf16 --repeat 3 --threads 0\n";

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int run_bench(const std::vector<std::string>& argv) {
  cli::Args a(argv, {{"batch", "1"}, {"seqlen", "2048"}, {"heads", "4"}, {"kv-heads", "2"}, {"headdim", "64"},
                     {"window", "256"}, {"causal", "1"}, {"dtypes", "fp32,bf16"}, {"repeat", "3"}, {"threads", "0"}});
  set_num_threads(static_cast<int>(a.integer("threads")));
  const int repeat = static_cast<int>(std::max<int64_t>(1, a.integer("repeat")));
  std::vector<std::string> dtypes;
  {
    std::string list = a.str("dtypes"), item;
    for (char c : list + ",") {
      if (c == ',') {
        if (!item.empty()) dtypes.push_back(item);
        item.clear();
      } else {
        item += c;
      }
    }
  }
  std::printf("fdma bench: dynamic_mask_attention on the CPU backend, %d threads, median of %d\n", num_threads(), repeat);
  std::printf("| dtype | shape | fwd s | bwd s | fwd+bwd s | useful GFLOP/s fwd+bwd |\n|---|---|---|---|---|---|\n");
  for (const std::string& name : dtypes) {
    Shape s{a.integer("batch"), a.integer("seqlen"), a.integer("seqlen"), a.integer("heads"), a.integer("kv-heads"),
            a.integer("headdim"), a.integer("window"), a.integer("causal") != 0, parse_dtype(name)};
    DmaProblemData data(s, 1);
    DmaParams p = data.params(Backend::cpu);
    std::vector<unsigned char> ws(std::max(dma_workspace_size(p, Pass::forward), dma_workspace_size(p, Pass::backward)));
    p.workspace = ws.data(), p.workspace_bytes = ws.size();
    std::vector<double> tf, tb;
    for (int r = 0; r <= repeat; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      dma_forward(p);
      auto t1 = std::chrono::steady_clock::now();
      dma_backward(p);
      auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;  // warm-up
      tf.push_back(std::chrono::duration<double>(t1 - t0).count());
      tb.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    // Kept pairs: causal query i keeps min(w, i + 1 + Sk - Sq) keys (clamped), non-causal min(w, Sk).
    double pairs = 0;
    for (int64_t i = 0; i < s.Sq; ++i) {
      const int64_t cand = s.causal ? std::clamp<int64_t>(i + 1 + s.Sk - s.Sq, 0, s.Sk) : s.Sk;
      pairs += double(std::min(cand, s.w));
    }
    pairs *= double(s.B * s.H);
    const double flops = pairs * 4.0 * double(s.D) * 3.5;  // fwd + 2.5x bwd
    const double f = median(tf), b = median(tb);
    std::printf("| %s | %s | %.3f | %.3f | %.3f | %.1f |\n", dtype_name(s.dtype), s.str().c_str(), f, b, f + b,
                flops / (f + b) / 1e9);
  }
  return 0;
}

}  // namespace fdma::tool
