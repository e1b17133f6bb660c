// Host entry of the decode selection that keeps a caller-owned state (select_state.cu; the
// state's contract is fdma.h's select_state).
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// Calls with at most this many queries grow the state key by key. Longer ones either take the
// radix passes and then bring the state up to date (refresh), or, chunked prefill through
// prefill.cu, ask for the kept set of the keys before their queries (prefix).
constexpr int kStateMaxQueries = 16;

enum class StateMode {
  emit,     // grow the set key by key through the call's queries, write the kept list
  refresh,  // only bring the state up to date with [0, L)
  prefix,   // the top-w of [0, L - Sq) into prefix_pos / prefix_len; the state is only read
};

struct StateSelectArgs {
  CacheView cache;
  int Sq, w, slots;  // slots = min(w, capacity)
  bool causal;
  StateMode mode;
  int32_t* state;             // [B, Hk, 1 + 2 * slots], unit stride in the last dim; null: none (prefix)
  int64_t state_stride[2];    // b, hk
  int list_cap;
  SelectState* sel;  // [rows]: .listed
  KeptKey* list;     // [rows][list_cap]; null: only .listed (one query reads the state itself)
  int32_t* prefix_pos;  // prefix: [rows][slots], ascending
  int32_t* prefix_len;  // prefix: [rows]
};

// Positions the kernel can hold in shared memory on the current device (the limit on slots).
int select_state_max_slots();

// One CTA per (batch, KV head) row on `stream`. overlap: launched overlapping the call's append
// kernel (launch.cuh); the kernel reads the state and the keys below its prefix, which the
// append never writes, before it waits for it.
cudaError_t run_select_state(const StateSelectArgs& args, int rows, cudaStream_t stream, bool overlap = false);

}  // namespace fdma::cuda
