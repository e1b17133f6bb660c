// Validated, normalised descriptions of each operation. The validation layer (validate.cpp)
// turns a params struct into one of these or throws fdma::Error naming the bad argument;
// backends only ever see problems that passed it.
#pragma once

#include <cstdint>
#include <string>

#include "fdma/fdma.hpp"

namespace fdma::detail {

[[noreturn]] void fail(Status status, const std::string& message);

struct Dims {
  int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hk = 0, D = 0;
  int64_t G() const { return H / Hk; }
  // Causal offset: key j is visible to query i iff j <= i + causal_offset().
  int64_t causal_offset() const { return Sk - Sq; }
};

// How a [B|1, 1|Hk|H, Sq|1, Sk|1] mask or bias maps (b, h, i, j) to an element.
struct Broadcast {
  bool present = false;
  enum HeadMode { shared = 0, per_kv_head = 1, per_head = 2 } head_mode = shared;
  int64_t size[4] = {1, 1, 1, 1};    // declared sizes
  int64_t stride[4] = {0, 0, 0, 0};  // 0 on every broadcast (size 1) dim
  int64_t head_index(int64_t h, int64_t G) const {
    return head_mode == per_head ? h : head_mode == per_kv_head ? h / G : 0;
  }
  int64_t offset(int64_t b, int64_t hidx, int64_t i, int64_t j) const {
    return b * stride[0] + hidx * stride[1] + i * stride[2] + j * stride[3];
  }
};

// A packed variable-length batch (fdma.h, "varlen"): the problem's dims then describe its
// packed view (core/varlen.hpp) as one batch, B = 1, Sq = total_q, Sk = total_k, and the
// sequences come from cu_seqlens.
struct Varlen {
  bool on = false;
  int64_t num_seqs = 0, max_q = 0, max_k = 0;
};

struct AttentionProblem {
  Dims dims;
  Varlen varlen;
  Broadcast mask, bias;
  DType bias_dtype = DType::unset, dbias_dtype = DType::unset;  // each q's or float32
  bool has_dbias = false;
  bool causal = false;
  bool deterministic = false;  // backward: bitwise reproducible (no atomics)
  double scale = 0, softcap = 0;
  DType dtype = DType::unset;  // q's dtype
  Backend backend = Backend::cpu;
};

struct SelectProblem {
  int64_t B = 0, Hk = 0, Sk = 0, Sq = 0, window = 0;
  bool causal = false, has_padding = false;
  Backend backend = Backend::cpu;
};

struct DmaProblem {
  Dims dims;
  Varlen varlen;
  int64_t window = 0;
  bool causal = false, add_scores = false, has_padding = false, has_dscores = false;
  bool has_intervals = false;  // keep_begin/keep_end given: forward writes them, backward reads them
  bool deterministic = false;  // backward: bitwise reproducible (no atomics)
  double scale = 0, softcap = 0;
  DType dtype = DType::unset;
  Backend backend = Backend::cpu;
  SelectProblem select() const {
    return SelectProblem{dims.B, dims.Hk, dims.Sk, dims.Sq, window, causal, has_padding, backend};
  }
};

// A KV-cache call: dims.Sk is the cache's capacity (max_len, or max_pages * page_size), the
// most keys a sequence can hold; each sequence's own length is read from cache_seqlens.
struct KvCacheProblem {
  Dims dims;
  bool paged = false, dynamic = false, append = false, causal = false, add_scores = false;
  int64_t page_size = 0, num_pages = 0, max_pages = 0;  // paged
  int64_t Snew = 0;                                     // appended tokens per sequence
  int64_t window = 0;                                   // dynamic
  int64_t state_slots = 0;  // select_state given: its kept-position slots, min(window, Sk)
  double scale = 0, softcap = 0;
  DType dtype = DType::unset, score_dtype = DType::unset;
  Backend backend = Backend::cpu;
};

AttentionProblem validate_attention(const fdma_attention_params& p, Pass pass);
SelectProblem validate_select(const fdma_select_params& p);
DmaProblem validate_dma(const fdma_dma_params& p, Pass pass);
KvCacheProblem validate_kvcache(const fdma_kvcache_params& p);

// Throws FDMA_ERR_WORKSPACE unless [workspace, +bytes) holds `needed` bytes.
void check_workspace(const char* op, const void* workspace, size_t bytes, size_t needed);

}  // namespace fdma::detail
