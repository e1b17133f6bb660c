// parallel_for alone: every item exactly once, worker indices in range, errors propagate.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/parallel.hpp"

using fdma::detail::parallel_for;

TEST(Parallel, CoversEveryItemOnce) {
  for (int workers : {1, 2, 3, 8})
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_worker{0};
      parallel_for(
          n, 3,
          [&](int64_t lo, int64_t hi, int w) {
            if (w < 0 || w >= workers) bad_worker++;
            for (int64_t i = lo; i < hi; ++i) hits[i]++;
          },
          workers);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " item " << i;
      EXPECT_EQ(bad_worker.load(), 0);
    }
}

TEST(Parallel, RethrowsWorkerErrors) {
  EXPECT_THROW(parallel_for(
                   100, 1,
                   [](int64_t lo, int64_t, int) {
                     if (lo == 57) throw std::runtime_error("boom");
                   },
                   4),
               std::runtime_error);
}
