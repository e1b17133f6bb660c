// Flash-DMA C++ API.
//
// The params structs are the C ABI's own structs (fdma.h) with zero-initialising
// constructors, so C++, C and Python fill in exactly the same layout. Functions throw
// fdma::Error on bad input or failure; nothing is written to any output when they do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "fdma/fdma.h"

namespace fdma {

enum class Status : int32_t {
  ok = FDMA_OK,
  invalid_argument = FDMA_ERR_INVALID_ARGUMENT,
  unsupported = FDMA_ERR_UNSUPPORTED,
  workspace = FDMA_ERR_WORKSPACE,
  device = FDMA_ERR_DEVICE,
  internal = FDMA_ERR_INTERNAL,
};

enum class DType : int32_t {
  unset = FDMA_DTYPE_UNSET,
  f32 = FDMA_FLOAT32,
  f16 = FDMA_FLOAT16,
  bf16 = FDMA_BFLOAT16,
  f64 = FDMA_FLOAT64,
  boolean = FDMA_BOOL,
  i32 = FDMA_INT32,
};

enum class Backend : int32_t { automatic = FDMA_BACKEND_AUTO, cpu = FDMA_BACKEND_CPU, cuda = FDMA_BACKEND_CUDA };
enum class Pass : int32_t { forward = FDMA_PASS_FORWARD, backward = FDMA_PASS_BACKWARD };

class FDMA_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

FDMA_API size_t dtype_size(DType dtype);
FDMA_API const char* dtype_name(DType dtype);

// A strided view (strides in elements). Default-constructed = absent.
struct FDMA_API Tensor : fdma_tensor {
  Tensor() : fdma_tensor{} {}
  Tensor(const fdma_tensor& t) : fdma_tensor(t) {}
  // Row-major contiguous view of `shape`.
  Tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape);
  Tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape,
         std::initializer_list<int64_t> strides);
  // Given, as an optional argument: a data pointer, or a shape (a tensor with no elements may
  // have a null pointer; an absent one is all zeros).
  bool present() const { return data != nullptr || ndim != 0; }
  int64_t numel() const;
};

struct AttentionParams : fdma_attention_params {
  AttentionParams() : fdma_attention_params{} {}
};
struct SelectParams : fdma_select_params {
  SelectParams() : fdma_select_params{} {}
};
struct DmaParams : fdma_dma_params {
  DmaParams() : fdma_dma_params{} {}
};
struct KvCacheParams : fdma_kvcache_params {
  KvCacheParams() : fdma_kvcache_params{} {}
};

FDMA_API size_t attention_workspace_size(const fdma_attention_params& p, Pass pass);
FDMA_API void attention_forward(const fdma_attention_params& p);
FDMA_API void attention_backward(const fdma_attention_params& p);

FDMA_API size_t select_workspace_size(const fdma_select_params& p);
FDMA_API void select_keys(const fdma_select_params& p);

FDMA_API size_t dma_workspace_size(const fdma_dma_params& p, Pass pass);
FDMA_API void dma_forward(const fdma_dma_params& p);
FDMA_API void dma_backward(const fdma_dma_params& p);

// Decode / chunked prefill against a KV cache (fdma.h, fdma_kvcache_params): dynamic-mask
// attention with score_cache, dense attention without. Appends k, v, scores first when given.
FDMA_API size_t kvcache_workspace_size(const fdma_kvcache_params& p);
FDMA_API void kvcache_forward(const fdma_kvcache_params& p);

FDMA_API void set_num_threads(int n);  // 0 = default
FDMA_API int num_threads();
FDMA_API bool cuda_available();
FDMA_API const char* version();

}  // namespace fdma
