// Host read bandwidth with the pool's own threads: the physical limit that
// decode (memory bound) is measured against, taken in the same run.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu/thread_pool.h"

namespace lk {

// Each worker reads its own node-local share of `bytes`; returns GB/s of each of `iters` passes.
std::vector<double> measure_read_bandwidth(ThreadPool& pool, size_t bytes, int iters);

}  // namespace lk
