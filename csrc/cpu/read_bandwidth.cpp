#include "cpu/read_bandwidth.h"

#include <atomic>
#include <chrono>
#include <cstring>

#include "cpu/cpu_dispatch.h"

namespace lk {
namespace {

enum { kProbeSlot = kWorkerBufferSlots - 1 };  // a per-worker buffer slot of its own

class ReadJob : public Job {
 public:
  ReadJob(size_t share, bool touch) : share_(share), touch_(touch) {}
  void run(WorkerCtx& ctx) override {
    char* p = static_cast<char*>(ctx.buffer(kProbeSlot, share_));
    if (touch_) {
      memset(p, 1, share_);  // first touch by the reading thread: pages on its node
      return;
    }
    sink_.fetch_add(active_kernels()->read_sum(p, share_), std::memory_order_relaxed);
  }
  std::atomic<uint64_t> sink_{0};

 private:
  size_t share_;
  bool touch_;
};

class ReleaseJob : public Job {
 public:
  void run(WorkerCtx& ctx) override { (*ctx.buffers)[kProbeSlot] = HostBuffer(); }
};

}  // namespace

std::vector<double> measure_read_bandwidth(ThreadPool& pool, size_t bytes, int iters) {
  const size_t share = (bytes / pool.num_threads()) / 4096 * 4096;
  ReadJob touch(share, true);
  pool.submit(&touch);
  touch.wait();
  std::vector<double> out;
  ReadJob read(share, false);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.submit(&read);
    read.wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(double(share) * pool.num_threads() / s / 1e9);
  }
  // Give the probe's memory back: it is as large as the caller asked (>> caches).
  ReleaseJob release;
  pool.submit(&release);
  release.wait();
  return out;
}

}  // namespace lk
