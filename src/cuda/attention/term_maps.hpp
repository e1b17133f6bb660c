// Copy-engine maps (tensor_map.hpp) of an attention call's mask and bias with the call's
// broadcast strides, for the warp-specialized kernels: tiles of box_keys keys by box_rows
// queries of one head, or, for a term broadcast over queries, box_keys keys of its one row.
// False where the copy engine cannot read the layout (the caller takes another kernel).
#pragma once

#include <cuda.h>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/primitives/tensor_map.hpp"

namespace fdma::cuda {

// The heads a mask or bias holds: per query head, per KV head, or one.
inline int term_heads(const AttentionFwdParams& p, int head_mode) {
  return head_mode == 2 ? p.H : head_mode == 1 ? p.Hk : 1;
}

// A mask as tiles of box_keys = 128 or 64 bytes a row, with the swizzle of that width (the
// readers' swizzled_row<box_keys>).
inline bool encode_mask_tiles(CUtensorMap& map, const AttentionFwdParams& p, int box_keys, int box_rows) {
  if (box_keys != 128 && box_keys != 64) return false;
  return encode_tile_map(map, p.mask, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.Sk, p.Sq, term_heads(p, p.mask_head_mode),
                         p.mask_stride[0] == 0 ? 1 : p.B, p.mask_stride[2], p.mask_stride[1], p.mask_stride[0],
                         box_keys, box_rows, box_keys == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}
inline bool encode_mask_keys(CUtensorMap& map, const AttentionFwdParams& p, int box_keys) {
  return encode_key_rows_map(map, p.mask, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.Sk, term_heads(p, p.mask_head_mode),
                             p.mask_stride[0] == 0 ? 1 : p.B, p.mask_stride[0], p.mask_stride[1], box_keys);
}

// A bias with a query dim in a 16-bit dtype: boxes of 64 keys (128 bytes, the 128-byte swizzle's row).
inline bool encode_bias_tiles(CUtensorMap& map, const AttentionFwdParams& p, CUtensorMapDataType dtype, int box_rows) {
  return encode_tile_map(map, p.bias, dtype, 2, p.Sk, p.Sq, term_heads(p, p.bias_head_mode),
                         p.bias_stride[0] == 0 ? 1 : p.B, p.bias_stride[2], p.bias_stride[1], p.bias_stride[0], 64,
                         box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}
inline bool encode_bias_keys(CUtensorMap& map, const AttentionFwdParams& p, CUtensorMapDataType dtype, int box_keys) {
  return encode_key_rows_map(map, p.bias, dtype, p.bias_f32 ? 4 : 2, p.Sk, term_heads(p, p.bias_head_mode),
                             p.bias_stride[0] == 0 ? 1 : p.B, p.bias_stride[0], p.bias_stride[1], box_keys);
}

}  // namespace fdma::cuda
