// The environment switches that choose between equivalent GPU paths, read per call so that
// tests and bench/bench_switches.py can run both ways (docs/design.md, "Dispatch", lists them all).
#pragma once

#include <cstdlib>
#include <cstring>

namespace fdma::cuda {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env && std::strcmp(env, value) == 0;
}

}  // namespace fdma::cuda
