// Device copies of the job's host tensors, for running the job on the CUDA backend. Only
// built with CUDA (FDMA_HAVE_CUDA); the CPU-only build never includes the runtime.
#pragma once

#ifdef FDMA_HAVE_CUDA
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "host_tensor.hpp"

namespace fdma::tool {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// One device buffer per host tensor, same bytes and strides; views point at device memory.
class DeviceMirror {
 public:
  ~DeviceMirror() {
    for (auto& e : entries_) cudaFree(e.ptr);
  }
  Tensor add(test::HostTensor& host) {
    Entry e{&host, nullptr, host.bytes().size()};
    cuda_check(cudaMalloc(&e.ptr, e.bytes), "cudaMalloc");
    cuda_check(cudaMemcpy(e.ptr, host.bytes().data(), e.bytes, cudaMemcpyHostToDevice), "upload");
    entries_.push_back(e);
    Tensor t = host.view();
    t.data = e.ptr;
    return t;
  }
  void* scratch(size_t bytes) {
    Entry e{nullptr, nullptr, bytes};
    cuda_check(cudaMalloc(&e.ptr, bytes ? bytes : 1), "cudaMalloc");
    entries_.push_back(e);
    return e.ptr;
  }
  // Copies one mirrored host tensor's bytes to the device, or back.
  void upload(test::HostTensor& host) {
    for (auto& e : entries_)
      if (e.host == &host) cuda_check(cudaMemcpy(e.ptr, host.bytes().data(), e.bytes, cudaMemcpyHostToDevice), "upload");
  }
  void download(test::HostTensor& host) {
    for (auto& e : entries_)
      if (e.host == &host) cuda_check(cudaMemcpy(host.bytes().data(), e.ptr, e.bytes, cudaMemcpyDeviceToHost), "download");
  }
  void download_all() {
    cuda_check(cudaDeviceSynchronize(), "kernels");
    for (auto& e : entries_)
      if (e.host) cuda_check(cudaMemcpy(e.host->bytes().data(), e.ptr, e.bytes, cudaMemcpyDeviceToHost), "download");
  }

 private:
  struct Entry {
    test::HostTensor* host;
    void* ptr;
    size_t bytes;
  };
  std::vector<Entry> entries_;
};

inline void device_sync() { cuda_check(cudaDeviceSynchronize(), "kernels"); }

}  // namespace fdma::tool
#endif
