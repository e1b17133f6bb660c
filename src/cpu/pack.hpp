// Gathers strided user tensors into packed arrays of the accumulation type, so the inner
// loops of the CPU backend run over contiguous rows whatever the input layout and dtype.
#pragma once

#include <cstdint>

#include "core/parallel.hpp"
#include "cpu/convert.hpp"

namespace fdma::cpu {

inline DType dtype_of(const fdma_tensor& t) { return static_cast<DType>(t.dtype); }

// [B, S, Hx, D] strided -> [B, Hx, S, D] packed.
template <class Acc>
void pack_bshd(const fdma_tensor& t, Acc* dst) {
  const int64_t B = t.shape[0], S = t.shape[1], Hx = t.shape[2], D = t.shape[3];
  detail::parallel_for(B * Hx * S, 256, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = r % S, h = (r / S) % Hx, b = r / (S * Hx);
      const int64_t off = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
      load_strided(byte_ptr(t.data, dtype_of(t), off), dtype_of(t), D, 1, dst + r * D);
    }
  });
}

// [X, Y, Z] strided -> packed (lse, key_scores).
template <class Acc>
void pack_3d(const fdma_tensor& t, Acc* dst) {
  const int64_t X = t.shape[0], Y = t.shape[1], Z = t.shape[2];
  for (int64_t x = 0; x < X; ++x)
    for (int64_t y = 0; y < Y; ++y)
      load_strided(byte_ptr(t.data, dtype_of(t), x * t.stride[0] + y * t.stride[1]), dtype_of(t), Z, t.stride[2],
                   dst + (x * Y + y) * Z);
}

// One [D] row of a [B, S, Hx, D] tensor.
inline int64_t bshd_offset(const fdma_tensor& t, int64_t b, int64_t s, int64_t h) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
}

template <class Acc>
void load_bshd_row(const fdma_tensor& t, int64_t b, int64_t s, int64_t h, Acc* dst) {
  load_strided(byte_ptr(t.data, dtype_of(t), bshd_offset(t, b, s, h)), dtype_of(t), t.shape[3], 1, dst);
}

template <class Acc>
void store_bshd_row(const fdma_tensor& t, int64_t b, int64_t s, int64_t h, const Acc* src) {
  store_strided(byte_ptr(const_cast<void*>(t.data), dtype_of(t), bshd_offset(t, b, s, h)), dtype_of(t), t.shape[3], 1,
                src);
}

inline int64_t offset3(const fdma_tensor& t, int64_t x, int64_t y, int64_t z) {
  return x * t.stride[0] + y * t.stride[1] + z * t.stride[2];
}

}  // namespace fdma::cpu
