// Carves the caller's workspace. The same code computes the size (base == nullptr) and the
// pointers, so the size a *_workspace_size query reports can never drift from what a run uses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fdma::cpu {

class Arena {
 public:
  static constexpr size_t kAlign = 64;
  explicit Arena(void* base = nullptr) : base_(align_up(reinterpret_cast<uintptr_t>(base))), counting_(base == nullptr) {}

  template <class T>
  T* take(int64_t count) {
    offset_ = align_up(offset_);
    T* p = counting_ ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += static_cast<size_t>(count) * sizeof(T);
    return p;
  }
  // Bytes needed, with slack for aligning an arbitrary caller pointer.
  size_t bytes() const { return offset_ == 0 ? 0 : offset_ + kAlign; }

 private:
  static uintptr_t align_up(uintptr_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
  uintptr_t base_;
  bool counting_;
  size_t offset_ = 0;
};

}  // namespace fdma::cpu
