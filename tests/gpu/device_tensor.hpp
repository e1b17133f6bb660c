// A device copy of a HostTensor: the same bytes and strides in CUDA memory.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "host_tensor.hpp"
#include "test_util.hpp"

namespace fdma::test {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no usable GPU: CUDA tests skipped"

// The largest |a - r| where the reference is finite (NaN/Inf parity is checked apart).
inline double max_err(const std::vector<double>& a, const std::vector<double>& r) {
  double m = 0;
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isfinite(r[i])) m = std::max(m, std::fabs(a[i] - r[i]));
  return m;
}

#define FDMA_CUDA_OK(expr)                                                               \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);           \
  } while (0)

// A vector's copy in device memory (null where it cannot be allocated; the caller frees it),
// and n elements of device memory copied back.
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  if (!h.empty()) cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// A path switch the library reads from the environment per call (FDMA_SELECT_PATH and the
// others in src/cuda/primitives/path_switches.hpp's users): set and cleared by the test, and cleared when
// it ends, pass or fail.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {}
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { clear(); }
  void set(const char* value) const { setenv(name_, value, 1); }
  void clear() const { unsetenv(name_); }

 private:
  const char* name_;
};

// The GPU's error against the float64 reference may be twice the CPU backend's on the same
// stored inputs, plus one rounding unit of the largest reference value (scale_of), plus a
// floor where a test knows of an exact cancellation the two backends round differently.
inline ::testing::AssertionResult within_precision(const std::vector<double>& gpu, const std::vector<double>& cpu,
                                                   const std::vector<double>& ref, double scale_of, DType dt,
                                                   const char* what, double floor = 0) {
  const double cpu_err = max_err(cpu, ref);
  const double bound = 2 * cpu_err + unit(dt) * std::max(1e-3, scale_of) + floor;
  auto res = all_close(gpu, ref, {bound, 0.0}, std::string(what) + " (GPU)");
  if (!res) res << "\n  CPU backend error " << cpu_err;
  return res;
}

// A device workspace of `bytes` (none for 0), freed at scope end; its bytes 0xFF (NaN floats,
// -1 ints) on entry: the library must write what it reads first, whatever the caller's buffer
// last held (fdma.h).
struct DeviceWorkspace {
  void* ptr = nullptr;
  explicit DeviceWorkspace(size_t bytes) {
    if (bytes && cudaMalloc(&ptr, bytes) == cudaSuccess) cudaMemset(ptr, 0xFF, bytes);
  }
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  ~DeviceWorkspace() {
    if (ptr) cudaFree(ptr);
  }
};

class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(HostTensor& host) : host_(&host) {
    bytes_ = host.bytes().size();
    if (cudaMalloc(&ptr_, bytes_) != cudaSuccess) ptr_ = nullptr;
    upload();
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr_) cudaFree(ptr_);
  }
  void upload() { cudaMemcpy(ptr_, host_->bytes().data(), bytes_, cudaMemcpyHostToDevice); }
  void download() { cudaMemcpy(host_->bytes().data(), ptr_, bytes_, cudaMemcpyDeviceToHost); }
  void poison() { cudaMemset(ptr_, 0xFF, bytes_); }
  Tensor view() const {
    Tensor t = host_->view();
    t.data = ptr_;
    return t;
  }
  bool ok() const { return ptr_ != nullptr; }

 private:
  HostTensor* host_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fdma::test
