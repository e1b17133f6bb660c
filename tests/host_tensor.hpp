// Test-side tensors: owned storage in any dtype, viewed through arbitrary strides, with
// logical-order float64 access. Used to build inputs in every layout the API accepts.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "../src/cpu/convert.hpp"
#include "fdma/fdma.hpp"

namespace fdma::test {

class HostTensor {
 public:
  HostTensor() = default;

  // Contiguous in the physical order `perm` (perm[0] outermost), each non-innermost physical
  // dim padded by `pad` elements and the innermost by `inner_pad`. perm = identity, pad = 0
  // is plain row-major.
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int> perm = {}, int64_t pad = 0,
             int64_t inner_pad = 0)
      : dtype_(dtype), shape_(std::move(shape)) {
    const int n = static_cast<int>(shape_.size());
    if (perm.empty()) {
      perm.resize(n);
      std::iota(perm.begin(), perm.end(), 0);
    }
    strides_.assign(n, 0);
    int64_t stride = 1;
    for (int k = n - 1; k >= 0; --k) {
      strides_[perm[k]] = stride;
      stride *= shape_[perm[k]] + (k == n - 1 ? inner_pad : pad);
    }
    storage_.assign(static_cast<size_t>(stride) * dtype_size(dtype_) + 64, 0);
    row_major_ = strides_are_row_major();
  }

  // A view with size-1 dims stretched to `expanded` sizes by stride 0 (torch's expand).
  HostTensor expanded(const std::vector<int64_t>& sizes) const {
    HostTensor t = *this;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (shape_[d] == 1 && sizes[d] != 1) {
        t.shape_[d] = sizes[d];
        t.strides_[d] = 0;
      }
    t.row_major_ = t.strides_are_row_major();
    return t;
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }

  Tensor view() const {
    Tensor t;
    t.data = const_cast<unsigned char*>(storage_.data());
    t.dtype = static_cast<int32_t>(dtype_);
    t.ndim = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) {
      t.shape[d] = shape_[d];
      t.stride[d] = strides_[d];
    }
    return t;
  }

  // Logical linear index (row-major over shape) -> element offset. Plain row-major tensors map
  // it to itself: the per-dim divisions made building a 40K-key cache take seconds.
  int64_t offset(int64_t linear) const {
    if (row_major_) return linear;
    int64_t off = 0;
    for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
      off += (linear % shape_[d]) * strides_[d];
      linear /= shape_[d];
    }
    return off;
  }

  double get(int64_t linear) const {
    const int64_t o = offset(linear);
    switch (dtype_) {
      case DType::boolean: return storage_[o] ? 1.0 : 0.0;
      case DType::i32: {
        int32_t x;
        std::memcpy(&x, storage_.data() + 4 * o, 4);
        return x;
      }
      default: return cpu::load_one<double>(storage_.data(), dtype_, o);
    }
  }

  void set(int64_t linear, double x) {
    const int64_t o = offset(linear);
    switch (dtype_) {
      case DType::boolean: storage_[o] = x != 0; break;
      case DType::i32: {
        int32_t v = static_cast<int32_t>(x);
        std::memcpy(storage_.data() + 4 * o, &v, 4);
        break;
      }
      default:
        // Round through float for 16-bit types so stored values are exactly representable.
        cpu::store_one<double>(storage_.data(), dtype_, o, x);
    }
  }

  std::vector<double> values() const {
    std::vector<double> v(numel());
    for (int64_t i = 0; i < numel(); ++i) v[i] = get(i);
    return v;
  }

  void fill_uniform(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set(i, u(rng));
  }

  void fill_bool(std::mt19937_64& rng, double p_true) {
    std::bernoulli_distribution bern(p_true);
    for (int64_t i = 0; i < numel(); ++i) set(i, bern(rng) ? 1 : 0);
  }

  // Every byte 0xFF: NaN in every float type, -1 in int32. Outputs start poisoned so an
  // element the library forgot to write is caught.
  void poison() { std::fill(storage_.begin(), storage_.end(), 0xFF); }
  bool all_poisoned() const {
    return std::all_of(storage_.begin(), storage_.end(), [](unsigned char c) { return c == 0xFF; });
  }
  // Whether every byte outside the elements (padding, the slack past the end) is still 0xFF:
  // a kernel wrote nothing beyond its output's elements.
  bool gaps_poisoned() const {
    std::vector<bool> element(storage_.size(), false);
    const int64_t size = int64_t(dtype_size(dtype_));
    for (int64_t i = 0; i < numel(); ++i)
      std::fill_n(element.begin() + offset(i) * size, size, true);
    for (size_t k = 0; k < storage_.size(); ++k)
      if (!element[k] && storage_[k] != 0xFF) return false;
    return true;
  }
  const std::vector<unsigned char>& bytes() const { return storage_; }
  std::vector<unsigned char>& bytes() { return storage_; }

 private:
  bool strides_are_row_major() const {
    int64_t stride = 1;
    for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
      if (shape_[d] != 1 && strides_[d] != stride) return false;
      stride *= shape_[d];
    }
    return true;
  }

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, strides_;
  bool row_major_ = true;
  std::vector<unsigned char> storage_;
};

}  // namespace fdma::test
