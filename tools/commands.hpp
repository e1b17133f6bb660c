// Subcommands of the fdma command.
#pragma once

#include <string>
#include <vector>

namespace fdma::tool {

int run_main_job(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_decode_job(const std::vector<std::string>& args);
extern const char* const kDecodeHelp;
extern const char* const kRunHelp;
extern const char* const kBenchHelp;

}  // namespace fdma::tool
