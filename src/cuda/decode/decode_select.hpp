// Host entry of the decode path's top-w selection (decode_select.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/decode/decode_params.hpp"

namespace fdma::cuda {

// Where the selection's pieces sit in its workspace (byte offsets, 256-aligned). The state and
// histograms come first: they are zeroed before each call (zeroed_bytes).
struct SelectScratch {
  size_t state_offset, hist_offset, eq_offset, list_offset, zeroed_bytes;
};
size_t decode_select_workspace(int rows, int chunks, int list_cap, SelectScratch* s);

// The kept lists (args.list, per-row counts in args.state[row].listed) on `stream`: on Hopper,
// rows of up to 8192 candidates take one launch of one CTA per row (the cluster kernel),
// longer rows and other GPUs 5 to 7 launches of the portable passes; FDMA_DECODE_SELECT=
// passes|cluster forces either. `zeroed` is the workspace's start.
cudaError_t run_decode_select(const DecodeSelectArgs& args, int rows, void* zeroed, size_t zeroed_bytes,
                              cudaStream_t stream);

}  // namespace fdma::cuda
