// Comparison helpers: tolerances from the precision, NaN/Inf parity checked apart from the
// numeric tolerance, readable reports that stop after 10 mismatches.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "fdma/fdma.hpp"

namespace fdma::test {

struct Tol {
  double atol, rtol;
};

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// Rounding unit of the stored dtype (the CPU accumulates in float32, float64 for f64).
inline double unit(DType dt) {
  switch (dt) {
    case DType::bf16: return 1.0 / 256;
    case DType::f16: return 1.0 / 2048;
    case DType::f64: return 1e-13;
    default: return 2e-6;
  }
}

// Outputs of the forward: stored-dtype rounding plus float32 accumulation error.
inline Tol forward_tol(DType dt, const std::vector<double>& ref) {
  const double u = unit(dt);
  return {std::max(u, 5e-6) * 0.5 * std::max(1.0, max_abs(ref)), u};
}

// Gradients: low-precision inputs also round `out` and `dout`, and dS = P (dP - delta)
// cancels, so the absolute part scales with the largest gradient.
inline Tol grad_tol(DType dt, const std::vector<double>& ref) {
  const double u = unit(dt);
  const double k = dt == DType::f32 ? 20.0 : dt == DType::f64 ? 100.0 : 4.0;
  return {k * std::max(u, 5e-6) * std::max(1e-3, max_abs(ref)), 2 * u};
}

inline ::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& ref, Tol tol,
                                            const std::string& what) {
  if (actual.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << actual.size() << " vs reference " << ref.size();
  std::ostringstream os;
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = actual[i], r = ref[i];
    bool ok;
    if (std::isnan(r) || std::isnan(a)) ok = std::isnan(r) && std::isnan(a);  // NaN parity
    else if (std::isinf(r) || std::isinf(a)) ok = a == r;                     // Inf parity, sign included
    else {
      const double err = std::fabs(a - r);
      worst = std::max(worst, err);
      ok = err <= tol.atol + tol.rtol * std::fabs(r);
    }
    if (!ok && ++bad <= 10) os << "\n  [" << i << "] got " << a << ", expected " << r;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size()
                                       << " elements differ (atol " << tol.atol << ", rtol " << tol.rtol
                                       << ", worst finite error " << worst << ")" << os.str();
}

}  // namespace fdma::test
