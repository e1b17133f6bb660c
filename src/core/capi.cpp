// The C ABI: each entry point calls the C++ API, turns any exception into a status code and
// keeps the message for fdma_last_error() on the calling thread.
#include <exception>
#include <new>
#include <string>

#include "fdma/fdma.h"
#include "fdma/fdma.hpp"

namespace {

thread_local std::string g_last_error;

template <class Fn>
int32_t guarded(Fn&& fn) {
  try {
    g_last_error.clear();
    fn();
    return FDMA_OK;
  } catch (const fdma::Error& e) {
    g_last_error = e.what();
    return static_cast<int32_t>(e.status());
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
    return FDMA_ERR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return FDMA_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return FDMA_ERR_INTERNAL;
  }
}

// Null params or output pointers are argument errors, not crashes.
template <class P>
void require(const P* p, const char* fn) {
  if (p == nullptr) throw fdma::Error(fdma::Status::invalid_argument, std::string(fn) + ": params pointer is null");
}
void require_out(const size_t* bytes, const char* fn) {
  if (bytes == nullptr) throw fdma::Error(fdma::Status::invalid_argument, std::string(fn) + ": bytes pointer is null");
}
fdma::Pass to_pass(int32_t pass, const char* fn) {
  if (pass != FDMA_PASS_FORWARD && pass != FDMA_PASS_BACKWARD)
    throw fdma::Error(fdma::Status::invalid_argument,
                      std::string(fn) + ": pass must be FDMA_PASS_FORWARD (0) or FDMA_PASS_BACKWARD (1), got " +
                          std::to_string(pass));
  return static_cast<fdma::Pass>(pass);
}

}  // namespace

extern "C" {

int32_t fdma_abi_version(void) { return FDMA_ABI_VERSION; }
const char* fdma_version_string(void) { return fdma::version(); }
const char* fdma_last_error(void) { return g_last_error.c_str(); }

const char* fdma_status_name(int32_t status) {
  switch (status) {
    case FDMA_OK: return "FDMA_OK";
    case FDMA_ERR_INVALID_ARGUMENT: return "FDMA_ERR_INVALID_ARGUMENT";
    case FDMA_ERR_UNSUPPORTED: return "FDMA_ERR_UNSUPPORTED";
    case FDMA_ERR_WORKSPACE: return "FDMA_ERR_WORKSPACE";
    case FDMA_ERR_DEVICE: return "FDMA_ERR_DEVICE";
    case FDMA_ERR_INTERNAL: return "FDMA_ERR_INTERNAL";
    default: return "FDMA_UNKNOWN_STATUS";
  }
}

int32_t fdma_set_num_threads(int32_t n) {
  return guarded([&] {
    if (n < 0) throw fdma::Error(fdma::Status::invalid_argument, "fdma_set_num_threads: n must be >= 0");
    fdma::set_num_threads(n);
  });
}
int32_t fdma_get_num_threads(void) { return fdma::num_threads(); }
int32_t fdma_cuda_available(void) { return fdma::cuda_available() ? 1 : 0; }

int32_t fdma_attention_workspace_size(const fdma_attention_params* p, int32_t pass, size_t* bytes) {
  return guarded([&] {
    require(p, "fdma_attention_workspace_size");
    require_out(bytes, "fdma_attention_workspace_size");
    *bytes = fdma::attention_workspace_size(*p, to_pass(pass, "fdma_attention_workspace_size"));
  });
}
int32_t fdma_attention_fwd(const fdma_attention_params* p) {
  return guarded([&] {
    require(p, "fdma_attention_fwd");
    fdma::attention_forward(*p);
  });
}
int32_t fdma_attention_bwd(const fdma_attention_params* p) {
  return guarded([&] {
    require(p, "fdma_attention_bwd");
    fdma::attention_backward(*p);
  });
}

int32_t fdma_select_workspace_size(const fdma_select_params* p, size_t* bytes) {
  return guarded([&] {
    require(p, "fdma_select_workspace_size");
    require_out(bytes, "fdma_select_workspace_size");
    *bytes = fdma::select_workspace_size(*p);
  });
}
int32_t fdma_select(const fdma_select_params* p) {
  return guarded([&] {
    require(p, "fdma_select");
    fdma::select_keys(*p);
  });
}

int32_t fdma_dma_workspace_size(const fdma_dma_params* p, int32_t pass, size_t* bytes) {
  return guarded([&] {
    require(p, "fdma_dma_workspace_size");
    require_out(bytes, "fdma_dma_workspace_size");
    *bytes = fdma::dma_workspace_size(*p, to_pass(pass, "fdma_dma_workspace_size"));
  });
}
int32_t fdma_dma_fwd(const fdma_dma_params* p) {
  return guarded([&] {
    require(p, "fdma_dma_fwd");
    fdma::dma_forward(*p);
  });
}
int32_t fdma_dma_bwd(const fdma_dma_params* p) {
  return guarded([&] {
    require(p, "fdma_dma_bwd");
    fdma::dma_backward(*p);
  });
}

int32_t fdma_kvcache_workspace_size(const fdma_kvcache_params* p, size_t* bytes) {
  return guarded([&] {
    require(p, "fdma_kvcache_workspace_size");
    require_out(bytes, "fdma_kvcache_workspace_size");
    *bytes = fdma::kvcache_workspace_size(*p);
  });
}
int32_t fdma_kvcache_fwd(const fdma_kvcache_params* p) {
  return guarded([&] {
    require(p, "fdma_kvcache_fwd");
    fdma::kvcache_forward(*p);
  });
}

}  // extern "C"
