// Persistent NUMA-aware worker pool.
//
// Workers are created once, spin for a short while after each job (so the next
// MoE layer of a decode step starts without a syscall) and then park on a
// futex: no core is burnt while there is no MoE work. A job is run by all
// workers together (each calls Job::run with its own context) and jobs run one
// after another in submission order, so every forward sees the whole machine.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cpu/host_memory.h"
#include "cpu/numa_topology.h"

namespace lk {

enum class Binding { kCpuCore, kNumaNode, kNone };

struct PoolConfig {
  int threads = 0;            // <= 0: physical cores of the allowed CPUs
  Binding binding = Binding::kCpuCore;
  int spin_us = 1000;         // busy-wait before parking
  std::string sysfs_root = "/sys";
  std::vector<int> allowed;   // empty: sched_getaffinity
};

class ThreadPool;

constexpr int kWorkerBufferSlots = 16;  // per-worker scratch slots (WorkerCtx::buffer)
constexpr int kSharedBufferSlots = 16;  // pool-wide ones (ThreadPool::shared_buffer)

// What one worker knows while running a job.
struct WorkerCtx {
  int tid = 0;          // 0 .. num_threads-1
  int node = 0;         // node slot (index into the pool's active nodes)
  int node_rank = 0;    // rank among the node's threads
  int node_threads = 1;
  int num_threads = 1;
  ThreadPool* pool = nullptr;
  // Per-worker scratch, grown on demand and kept (steady state allocates nothing).
  void* buffer(int slot, size_t bytes);
  void barrier();  // all workers of the pool
  std::vector<HostBuffer>* buffers = nullptr;
};

class Job {
 public:
  virtual ~Job() = default;
  virtual void run(WorkerCtx& ctx) = 0;
  // Completion is read from the pool's counter, never from the job, so the pool
  // does not touch a job after the last worker finished it (the owner may free it).
  bool done() const;
  void wait();  // parks the caller until the job finished; no-op if never submitted
 private:
  friend class ThreadPool;
  ThreadPool* pool_ = nullptr;
  uint32_t seq_ = 0;
};

class ThreadPool {
 public:
  explicit ThreadPool(const PoolConfig& cfg);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()); }
  int num_nodes() const { return int(node_ids_.size()); }          // nodes that got threads
  int node_id(int slot) const { return node_ids_[slot]; }          // kernel id of a node slot
  int threads_on_node(int slot) const { return node_threads_[slot]; }
  const std::vector<int>& cpus_of_thread(int tid) const { return thread_cpus_[tid]; }
  const Topology& topology() const { return topo_; }
  // Place memory with mbind only on a real multi-node machine.
  bool numa_placement() const { return place_memory_; }
  Binding binding() const { return cfg_.binding; }
  int spin_us() const { return cfg_.spin_us; }

  // Queue a job; it must stay alive until done(). Thread-safe. Returns its sequence number.
  uint32_t submit(Job* job);
  bool finished(uint32_t seq) const {
    return int32_t(completed_.load(std::memory_order_acquire) - seq) > 0;
  }
  void wait_for(uint32_t seq);
  // When the workers started job `seq` (steady_clock nanoseconds; the first worker to take it stamps
  // it). Kept per ring slot: valid once finished(seq), until kRing later jobs were submitted.
  int64_t started_ns(uint32_t seq) const { return started_ns_[seq % kRing].load(std::memory_order_acquire); }
  // Pool-wide scratch for the job being run (jobs never overlap).
  HostBuffer& shared_buffer(int slot);

  // Bring parked workers back to spinning (for spin_us) without a job, so that a job known to be
  // coming soon (e.g. while the GPU computes a layer's router) does not pay the wake-up.
  void wake();

  // Submit-to-completion time of an empty job, in microseconds, `iters` times; before each,
  // the pool idles `idle_us` (longer than spin_us: workers are parked and must be woken).
  // prewake_us >= 0: call wake() that long before submitting.
  std::vector<double> round_trip_us(int iters, int idle_us, int prewake_us = -1);

  // Counters for benchmarks: jobs run, and how often workers had to be woken from the futex.
  uint64_t jobs_run() const { return completed_.load(std::memory_order_relaxed); }
  uint64_t futex_wakes() const { return futex_wakes_.load(std::memory_order_relaxed); }

 private:
  friend struct WorkerCtx;
  friend class Job;
  void worker_main(int tid);
  // Inside a job the others arrive within microseconds unless one of them lost its CPU (another
  // process or the GPU-driving threads share the core): then waiting in the kernel hands that
  // CPU back to it, where spinning for the whole LK_SPIN_US would hold the job up.
  int barrier_spin_us() const { return cfg_.spin_us < 50 ? cfg_.spin_us : 50; }
  void barrier_wait(bool end_of_job = false);
  bool spin_until_changed(const std::atomic<uint32_t>& word, uint32_t old, int spin_us) const;

  PoolConfig cfg_;
  Topology topo_;
  bool place_memory_ = false;
  bool caller_may_spin_ = false;  // fewer workers than allowed CPUs
  std::vector<int> node_ids_, node_threads_;
  std::vector<WorkerCtx> ctx_;
  std::vector<std::vector<int>> thread_cpus_;
  std::vector<std::vector<HostBuffer>> worker_buffers_;
  std::vector<HostBuffer> shared_buffers_;
  std::vector<std::thread> workers_;

  static constexpr uint32_t kRing = 256;
  Job* ring_[kRing] = {};
  std::atomic<int64_t> started_ns_[kRing] = {};
  std::mutex submit_mu_;
  std::atomic<uint32_t> submitted_{0};  // futex word: jobs queued so far
  std::atomic<uint32_t> completed_{0};  // futex word: jobs finished so far
  std::atomic<uint32_t> doorbell_{0};  // futex word of parked workers: bumped by submit and wake
  std::atomic<uint32_t> idle_sleepers_{0};
  std::atomic<uint32_t> submit_waiters_{0};  // submitters blocked on a full ring or on wait()
  std::atomic<bool> stop_{false};

  std::atomic<uint32_t> bar_count_{0};
  std::atomic<uint32_t> bar_gen_{0};
  std::atomic<uint32_t> bar_sleepers_{0};
  std::atomic<uint64_t> futex_wakes_{0};
};

}  // namespace lk
