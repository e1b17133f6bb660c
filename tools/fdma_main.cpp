// The fdma command: `fdma run` (the main job), `fdma bench`, `fdma version`, `fdma --help`.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fdma/fdma.hpp"

namespace {

const char* const kHelp =
    "fdma: Flash Dynamic Mask Attention\n"
    "\n"
    "usage: fdma <command> [flags]\n"
    "\n"
    "commands:\n"
    "  run       the main job: dynamic-mask attention forward + backward on an example\n"
    "            problem, on the best backend present, checked against a float64 reference\n"
    "  decode    the inference job: a generation loop against ragged (optionally paged) KV\n"
    "            caches, every step checked against a float64 reference\n"
    "  bench     time the CPU backend on the benchmark shape\n"
    "  version   library version, ABI version and whether a GPU is usable\n"
    "\n"
    "`fdma <command> --help` explains a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kHelp, stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  const bool help = !rest.empty() && (rest[0] == "--help" || rest[0] == "-h");
  try {
    if (cmd == "run") {
      if (help) return std::fputs(fdma::tool::kRunHelp, stdout), 0;
      return fdma::tool::run_main_job(rest);
    }
    if (cmd == "decode") {
      if (help) return std::fputs(fdma::tool::kDecodeHelp, stdout), 0;
      return fdma::tool::run_decode_job(rest);
    }
    if (cmd == "bench") {
      if (help) return std::fputs(fdma::tool::kBenchHelp, stdout), 0;
      return fdma::tool::run_bench(rest);
    }
    if (cmd == "version") {
      std::printf("flash-dma %s, C ABI %d, CUDA %s\n", fdma::version(), FDMA_ABI_VERSION,
                  fdma::cuda_available() ? "available" : "not available");
      return 0;
    }
    std::fprintf(stderr, "fdma: unknown command '%s'\n\n%s", cmd.c_str(), kHelp);
    return 2;
  } catch (const fdma::Error& e) {
    std::fprintf(stderr, "fdma %s: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fdma %s: %s (see fdma %s --help)\n", cmd.c_str(), e.what(), cmd.c_str());
    return 2;
  }
}
