#include "cpu/thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <stdexcept>

namespace lk {
namespace {

void futex_wait(const std::atomic<uint32_t>& word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(const std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() { __builtin_ia32_pause(); }

// Threads per node in proportion to the node's physical cores; nodes may get 0.
std::vector<int> split_threads(int total, const Topology& topo) {
  const int cores = std::max(1, topo.physical_cores());
  std::vector<int> per(topo.nodes.size(), 0);
  int given = 0;
  for (size_t n = 0; n < topo.nodes.size(); ++n) {
    per[n] = int(int64_t(total) * int64_t(topo.nodes[n].cores.size()) / cores);
    given += per[n];
  }
  for (size_t n = 0; given < total; n = (n + 1) % per.size()) {  // remainder: one each, in node order
    ++per[n];
    ++given;
  }
  return per;
}

}  // namespace

void* WorkerCtx::buffer(int slot, size_t bytes) {
  HostBuffer& b = (*buffers)[slot];
  b.ensure(bytes, pool->numa_placement() ? pool->node_id(node) : -1);
  return b.data();
}

void WorkerCtx::barrier() { pool->barrier_wait(); }

bool Job::done() const { return pool_ && pool_->finished(seq_); }

void Job::wait() {
  if (pool_) pool_->wait_for(seq_);
}

void ThreadPool::wait_for(uint32_t seq) {
  // Spinning saves the caller a futex wake-up (10-50 us in a VM; it is on the critical path of
  // every decode layer), but only when a CPU is left over for it: with every CPU running a
  // worker, a spinning caller would delay the very job it waits for.
  using clock = std::chrono::steady_clock;
  const int spin = caller_may_spin_ ? cfg_.spin_us : 0;
  const auto deadline = clock::now() + std::chrono::microseconds(spin);
  for (uint32_t i = 1; spin > 0 && int32_t(completed_.load(std::memory_order_acquire) - seq) <= 0; ++i) {
    cpu_relax();
    if ((i & 63) == 0) {
      if (clock::now() >= deadline) break;
      sched_yield();
    }
  }
  for (;;) {
    const uint32_t c = completed_.load(std::memory_order_seq_cst);
    if (int32_t(c - seq) > 0) return;
    submit_waiters_.fetch_add(1, std::memory_order_seq_cst);
    if (int32_t(completed_.load(std::memory_order_seq_cst) - seq) <= 0) futex_wait(completed_, c);
    submit_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

ThreadPool::ThreadPool(const PoolConfig& cfg) : cfg_(cfg) {
  std::vector<int> allowed = cfg.allowed.empty() ? allowed_cpus() : cfg.allowed;
  topo_ = read_topology(cfg.sysfs_root, allowed);
  const int total = cfg.threads > 0 ? cfg.threads : std::max(1, topo_.physical_cores());
  cfg_.threads = total;
  const std::vector<int> per = split_threads(total, topo_);

  for (size_t n = 0; n < topo_.nodes.size(); ++n) {
    if (per[n] == 0) continue;
    const NumaNode& node = topo_.nodes[n];
    const int slot = int(node_ids_.size());
    node_ids_.push_back(node.id);
    node_threads_.push_back(per[n]);
    std::vector<int> node_cpus;
    for (const auto& core : node.cores) node_cpus.insert(node_cpus.end(), core.begin(), core.end());
    for (int r = 0; r < per[n]; ++r) {
      WorkerCtx c;
      c.tid = int(ctx_.size());
      c.node = slot;
      c.node_rank = r;
      c.node_threads = per[n];
      c.num_threads = total;
      c.pool = this;
      ctx_.push_back(c);
      std::vector<int> cpus;
      if (cfg.binding == Binding::kCpuCore) {
        // Physical cores first; hyperthread siblings only once every core has a thread.
        const auto& core = node.cores[r % node.cores.size()];
        cpus.push_back(core[(r / node.cores.size()) % core.size()]);
      } else if (cfg.binding == Binding::kNumaNode) {
        cpus = node_cpus;
      }
      thread_cpus_.push_back(cpus);
    }
  }
  caller_may_spin_ = total < int(allowed.size());
  place_memory_ = topo_.numa_from_sysfs && cfg.sysfs_root == "/sys" && node_ids_.size() > 1;

  worker_buffers_.resize(ctx_.size());
  for (auto& b : worker_buffers_) b.resize(kWorkerBufferSlots);
  for (size_t t = 0; t < ctx_.size(); ++t) ctx_[t].buffers = &worker_buffers_[t];
  shared_buffers_.resize(kSharedBufferSlots);
  workers_.reserve(ctx_.size());
  for (size_t t = 0; t < ctx_.size(); ++t) workers_.emplace_back(&ThreadPool::worker_main, this, int(t));
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    stop_.store(true, std::memory_order_seq_cst);
    submitted_.fetch_add(1, std::memory_order_seq_cst);
    doorbell_.fetch_add(1, std::memory_order_seq_cst);
  }
  futex_wake_all(doorbell_);
  for (auto& t : workers_) t.join();
}

HostBuffer& ThreadPool::shared_buffer(int slot) { return shared_buffers_.at(slot); }

bool ThreadPool::spin_until_changed(const std::atomic<uint32_t>& word, uint32_t old, int spin_us) const {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::microseconds(spin_us);
  for (uint32_t i = 1;; ++i) {
    if (word.load(std::memory_order_acquire) != old) return true;
    cpu_relax();
    if ((i & 63) == 0) {
      if (clock::now() >= deadline) return false;
      // Oversubscribed (workers + the caller's thread > cores): let a runnable thread that shares
      // this core in, or a barrier we spin on can only complete when the spin budget runs out.
      if ((i & 1023) == 0) sched_yield();
    }
  }
}

uint32_t ThreadPool::submit(Job* job) {
  uint32_t seq;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    seq = submitted_.load(std::memory_order_relaxed);
    for (;;) {  // ring full: wait for the oldest job to finish
      const uint32_t done = completed_.load(std::memory_order_seq_cst);
      if (seq - done < kRing) break;
      submit_waiters_.fetch_add(1, std::memory_order_seq_cst);
      futex_wait(completed_, done);
      submit_waiters_.fetch_sub(1, std::memory_order_seq_cst);
    }
    job->pool_ = this;
    job->seq_ = seq;
    ring_[seq % kRing] = job;
    submitted_.store(seq + 1, std::memory_order_seq_cst);
  }
  wake();
  return seq;
}

void ThreadPool::wake() {
  doorbell_.fetch_add(1, std::memory_order_seq_cst);
  if (idle_sleepers_.load(std::memory_order_seq_cst) > 0) {
    futex_wakes_.fetch_add(1, std::memory_order_relaxed);
    futex_wake_all(doorbell_);
  }
}

std::vector<double> ThreadPool::round_trip_us(int iters, int idle_us, int prewake_us) {
  struct Noop : Job {
    void run(WorkerCtx&) override {}
  } job;
  std::vector<double> out;
  for (int i = 0; i < iters; ++i) {
    if (idle_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    if (prewake_us >= 0) {
      wake();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(prewake_us);
      while (std::chrono::steady_clock::now() < until) cpu_relax();
    }
    const auto t0 = std::chrono::steady_clock::now();
    submit(&job);
    job.wait();
    out.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

void ThreadPool::barrier_wait(bool end_of_job) {
  const uint32_t n = uint32_t(ctx_.size());
  const uint32_t gen = bar_gen_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    bar_count_.store(0, std::memory_order_relaxed);
    if (end_of_job) {  // the last worker out publishes completion; the job may be freed from here on
      completed_.fetch_add(1, std::memory_order_seq_cst);
      if (submit_waiters_.load(std::memory_order_seq_cst)) futex_wake_all(completed_);
    }
    bar_gen_.fetch_add(1, std::memory_order_seq_cst);
    if (bar_sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(bar_gen_);
    return;
  }
  if (spin_until_changed(bar_gen_, gen, barrier_spin_us())) return;
  bar_sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (bar_gen_.load(std::memory_order_seq_cst) == gen) futex_wait(bar_gen_, gen);
  bar_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

void ThreadPool::worker_main(int tid) {
  char name[16];  // at most 15 characters: what top -H and the benchmarks' CPU census show
  snprintf(name, sizeof(name), "lk_moe-w%d", tid);
  pthread_setname_np(pthread_self(), name);
  const std::vector<int>& cpus = thread_cpus_[tid];
  if (!cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    // Best effort: a failure (CPU taken away since start-up) leaves the thread unbound.
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  WorkerCtx& ctx = ctx_[tid];
  uint32_t seq = 0;
  for (;;) {
    // Spin for spin_us, then park until the doorbell rings (a job, a wake() or shutdown);
    // after a wake() without a job, spin again.
    while (!spin_until_changed(submitted_, seq, cfg_.spin_us)) {
      const uint32_t bell = doorbell_.load(std::memory_order_seq_cst);
      idle_sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (submitted_.load(std::memory_order_seq_cst) == seq) futex_wait(doorbell_, bell);
      idle_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    Job* job = ring_[seq % kRing];
    if (tid == 0)
      started_ns_[seq % kRing].store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count(),
          std::memory_order_release);
    job->run(ctx);
    barrier_wait(/*end_of_job=*/true);
    ++seq;
  }
}

}  // namespace lk
