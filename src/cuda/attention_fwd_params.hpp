// The plain struct the attention forward kernel reads: pointers, sizes, element strides
// (0 on broadcast dims), flags. Filled on the host from a validated AttentionProblem.
#pragma once

#include <cstdint>

namespace fdma::cuda {

struct AttentionFwdParams {
  const void *q, *k, *v;
  void* out;
  float* lse;  // optional
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3], lse_stride[3];  // (batch, seq, head) / lse (b, h, i)
  const uint8_t* mask;  // optional; [b, head, i, j] strides
  int64_t mask_stride[4];
  int mask_head_mode;  // 0 shared, 1 per KV head, 2 per query head
  const void* bias;    // optional
  bool bias_f32;       // else q's dtype
  int64_t bias_stride[4];
  int bias_head_mode;
  // Tiles of mask/bias stream through shared memory with K/V when their rows allow 16-byte
  // copies (key stride 1, aligned rows); otherwise each score reads global memory itself.
  bool mask_tiled, bias_tiled;
  // Per (mask batch, mask head, query tile, key tile): nonzero if the mask keeps any key
  // there (mask_tile_summary.cu). Null without a mask. Tiles of zero are skipped whole.
  const uint8_t* tile_active;
  int active_batches, active_heads;    // the mask's own batch and head counts
  int active_q_tiles, active_k_tiles;  // 1 when the mask broadcasts over that dim
  int B, Sq, Sk, H, Hk, G, D;
  float scale, softcap;
  bool causal;
};

}  // namespace fdma::cuda
