// Every environment switch of the CUDA backend, read here and nowhere else. Each one chooses
// between paths that compute the same result, so that the tests can run both and bench/ can
// time both; the defaults are the measured winners. docs/design.md ("Dispatch") has the table.
// They are read per call (except FDMA_DISABLE_WGMMA, read once), so one process can switch.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fdma::cuda {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env && std::strcmp(env, value) == 0;
}

// FDMA_DISABLE_WGMMA=1: the mma.sync kernels on Hopper too.
inline bool wgmma_disabled() {
  const char* env = std::getenv("FDMA_DISABLE_WGMMA");
  return env && env[0] == '1';
}

// FDMA_FWD_WS=0: Hopper forwards (dense, masked, biased, gathered) on the cp.async wgmma kernel
// (mma.sync at D = 256), not the warp-specialized one.
inline bool fwd_ws_allowed() { return !env_is("FDMA_FWD_WS", "0"); }

// FDMA_FWD_FOLD_BIAS=0: the gathered warp-specialized forward adds each key's term to its
// scores (a multiply-add a score) instead of folding it into S = Q K^T (attention_fwd_params.hpp).
inline bool fold_bias_allowed() { return !env_is("FDMA_FWD_FOLD_BIAS", "0"); }

// FDMA_BWD_FUSED_DQ=0: non-deterministic backwards on the two-kernel path too (no dq atomics).
inline bool fused_dq_allowed() { return !env_is("FDMA_BWD_FUSED_DQ", "0"); }

// FDMA_BWD_WS=0: fused-dq backwards at D = 64 and 128 on the dk/dv kernel, not the warp-specialized
// one (masked ones at D = 128, and those with a dbias with a query dim, on the two kernels, as
// that kernel declines them); at D = 256 the two kernels.
inline bool bwd_ws_allowed() { return !env_is("FDMA_BWD_WS", "0"); }

// FDMA_SELECT_PATH=cluster|shared|global|levels: the training selection's path ("" = per call).
inline const char* forced_select_path() {
  const char* env = std::getenv("FDMA_SELECT_PATH");
  return env ? env : "";
}

// FDMA_SELECT_ENDS=wavelet: causal interval ends through the wavelet matrix where the walk
// (select_walk.cuh) would take the row.
inline bool select_walk_allowed() { return !env_is("FDMA_SELECT_ENDS", "wavelet"); }

// FDMA_WALK_NARROW=k: the walk cuts the k * w ranks after rank w one step (32 positions) a
// piece (walk_pieces.cuh; 0: none). Unset (-1): select_topw.cu chooses per call.
inline int walk_narrow_ranks() {
  const char* env = std::getenv("FDMA_WALK_NARROW");
  return env ? std::clamp(std::atoi(env), 0, 64) : -1;
}

// FDMA_FWD_LAST_TILE=full: a list's last key tile as wide as the others.
inline bool narrow_last_tile() { return !env_is("FDMA_FWD_LAST_TILE", "full"); }

// FDMA_TILE_CHECKPOINTS=n: tiles a checkpoint list of the causal tile lists (0: none; unset:
// the default, dma_lists.cu).
inline int forced_tile_checkpoints() {
  const char* env = std::getenv("FDMA_TILE_CHECKPOINTS");
  return env ? std::max(0, std::atoi(env)) : -1;
}

// FDMA_OVERLAP_LAUNCHES=0: no programmatic dependent launch.
inline bool overlap_launches_allowed() { return !env_is("FDMA_OVERLAP_LAUNCHES", "0"); }

// FDMA_NEXT_ACTIVE_TABLE=0: masked kernels walk the tile summary per step.
inline bool next_active_table_allowed() { return !env_is("FDMA_NEXT_ACTIVE_TABLE", "0"); }

// FDMA_DKDV_GROUPS=1|2: warp groups per dk/dv CTA (0: chosen per call).
inline int forced_dkdv_groups() {
  return env_is("FDMA_DKDV_GROUPS", "1") ? 1 : env_is("FDMA_DKDV_GROUPS", "2") ? 2 : 0;
}

// FDMA_DKDV_SPLITS=n: shares of each gathered dk/dv key group's query walk (1-16; 0: chosen
// per call, dma_cuda.cu).
inline int forced_dkdv_splits() {
  const char* env = std::getenv("FDMA_DKDV_SPLITS");
  return env ? std::clamp(std::atoi(env), 1, 16) : 0;
}

// FDMA_DECODE_SELECT=passes|cluster: the decode radix selection's path ("" = per call).
inline const char* forced_decode_select() {
  const char* env = std::getenv("FDMA_DECODE_SELECT");
  return env ? env : "";
}

// FDMA_DECODE_CTAS_PER_SM=n: the CTAs an SM is taken to hold when splitting decode attention
// (0: the kernel's occupancy).
inline int forced_decode_ctas_per_sm() {
  const char* env = std::getenv("FDMA_DECODE_CTAS_PER_SM");
  return env ? std::max(1, std::atoi(env)) : 0;
}

// FDMA_DECODE_STAGES=2|3: 64-key blocks in flight per decode attention CTA (0: chosen per
// call, kvcache_cuda.cu).
inline int forced_decode_stages() {
  return env_is("FDMA_DECODE_STAGES", "2") ? 2 : env_is("FDMA_DECODE_STAGES", "3") ? 3 : 0;
}

// FDMA_STATE_ROWS_PER_CTA=1|2|4: rows a select_state update CTA takes (0: chosen per call,
// select_state.cu).
inline int forced_state_rows_per_cta() {
  return env_is("FDMA_STATE_ROWS_PER_CTA", "1") ? 1
         : env_is("FDMA_STATE_ROWS_PER_CTA", "2") ? 2
         : env_is("FDMA_STATE_ROWS_PER_CTA", "4") ? 4
                                                 : 0;
}

// FDMA_DMA_DECODE=0: dynamic_mask_attention's small inference calls stay on the training kernels.
inline bool dma_decode_allowed() { return !env_is("FDMA_DMA_DECODE", "0"); }

}  // namespace fdma::cuda
