// The CPU backend's only parallel primitive: hand out [begin, end) chunks of n items to up
// to num_threads() threads; the calling thread works too. `worker` is the thread's index in
// [0, num_threads()), used to pick its slice of scratch memory. Chunks are taken from a
// shared counter, so uneven items (causal rows) balance themselves.
#pragma once

#include <cstdint>
#include <functional>

namespace fdma::detail {

int num_threads();
void set_num_threads(int n);

using ChunkFn = std::function<void(int64_t begin, int64_t end, int worker)>;
// `workers` caps the threads (and so the worker indices); pass the count the caller sized
// its scratch for. 0 = num_threads().
void parallel_for(int64_t n, int64_t grain, const ChunkFn& fn, int workers = 0);

}  // namespace fdma::detail
