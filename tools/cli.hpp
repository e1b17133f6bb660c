// Tiny command-line parsing for the fdma command: --name value flags with defaults.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fdma::cli {

class Args {
 public:
  // args: everything after the subcommand. Throws std::invalid_argument on a malformed flag.
  Args(const std::vector<std::string>& args, const std::map<std::string, std::string>& defaults) : values_(defaults) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
      std::string name = a.substr(2), value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        throw std::invalid_argument("flag --" + name + " needs a value");
      }
      if (!values_.count(name)) throw std::invalid_argument("unknown flag --" + name);
      values_[name] = value;
    }
  }
  std::string str(const std::string& name) const { return values_.at(name); }
  int64_t integer(const std::string& name) const {
    const std::string& s = values_.at(name);
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') throw std::invalid_argument("--" + name + " expects an integer, got '" + s + "'");
    return v;
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace fdma::cli
