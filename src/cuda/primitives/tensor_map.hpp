// Host side of tma.cuh: the CUtensorMaps the copy engine reads. The driver's encoder is found
// once through the runtime, so the library still links only against cudart.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fdma::cuda {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // no encoder is an answer (no TMA path), not the caller's error
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// The encoder's own requirements on a tensor, checked first so that it is only called where
// it succeeds (its refusals show up as API errors under compute-sanitizer): a 16-byte
// aligned base and strides that are multiples of 16 bytes below 2^40.
inline bool tma_layout_ok(const void* base, const cuuint64_t* strides, int n) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  for (int i = 0; i < n; ++i)
    if (strides[i] % 16 != 0 || strides[i] >= (cuuint64_t(1) << 40)) return false;
  return true;
}

// A map over a (batch, head, row, col) tensor of `esize`-byte elements, columns contiguous,
// with element strides between rows, heads and batches, as 4-D (col, row, head, batch). Its
// box is box_cols x box_rows of one head, landing in shared memory with `swizzle` (box_cols *
// esize bytes a row, at most the swizzle's span). False when the driver has no encoder or
// rejects the layout: the caller takes a path without TMA.
inline bool encode_tile_map(CUtensorMap& map, const void* base, CUtensorMapDataType dtype, int esize, int cols,
                            int rows, int heads, int batch, int64_t row_stride, int64_t head_stride,
                            int64_t batch_stride, int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode || rows <= 0 || cols <= 0) return false;
  // A dim of size 1 never moves its coordinate; its stride only has to be a legal one.
  auto bytes = [&](int64_t elements, int size) { return cuuint64_t(size == 1 ? 16 : elements * esize); };
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {bytes(row_stride, rows), bytes(head_stride, heads), bytes(batch_stride, batch)};
  if (!tma_layout_ok(base, strides, 3)) return false;
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(&map, dtype, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A map over a (batch, seq, head, D) tensor of 16-bit elements with element strides `stride`
// (batch, seq, head; D contiguous). Its box is 64 columns (128 bytes, the 128-byte swizzle's
// row) by box_rows rows of one head, in the layout the wgmma descriptors read.
inline bool encode_rows_map(CUtensorMap& map, const void* base, bool bf16, int D, int seq, int heads, int batch,
                            const int64_t (&stride)[3], int box_rows) {
  return encode_tile_map(map, base, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, D,
                         seq, heads, batch, stride[1], stride[2], stride[0], 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

// A map over rows of keys, a (batch, head, key) tensor of `esize`-byte elements with element
// strides (batch, head; keys contiguous), as 3-D (key, head, batch), unswizzled. Its box is
// box_keys keys of one head: a per-key bias row per key tile. False as encode_rows_map.
inline bool encode_key_rows_map(CUtensorMap& map, const void* base, CUtensorMapDataType dtype, int esize, int keys,
                                int heads, int batch, int64_t batch_stride, int64_t head_stride, int box_keys) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode || keys <= 0) return false;
  auto bytes = [&](int64_t elements, int size) { return cuuint64_t(size == 1 ? 16 : elements * esize); };
  const cuuint64_t dims[3] = {cuuint64_t(keys), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[2] = {bytes(head_stride, heads), bytes(batch_stride, batch)};
  if (!tma_layout_ok(base, strides, 2)) return false;
  const cuuint32_t box[3] = {cuuint32_t(box_keys), 1, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(&map, dtype, 3, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace fdma::cuda
