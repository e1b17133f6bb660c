// Empty problems on the CPU backend (empty_case.hpp), with the null data pointers frameworks
// pass for tensors with no elements, in every dtype the CPU takes.
#include <gtest/gtest.h>

#include "empty_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

struct HostPlace {
  Tensor put(HostTensor& t) {
    Tensor v = t.view();
    if (t.numel() == 0) v.data = nullptr;
    return v;
  }
  void back() {}
};

}  // namespace

TEST(Empty, EveryOperationReturnsWhatAnEmptyProblemComputes) {
  HostPlace place;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    check_empty_problems(place, dt);
  }
}
