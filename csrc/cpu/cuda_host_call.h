// The CPU expert call as a CUDA stream operation (graph-capturable), with no link-time CUDA
// dependency: the CUDA runtime that torch already loaded is looked up at first use, so the
// engine still loads on machines without CUDA.
//
// Why a host-function node (cudaLaunchHostFunc) and not a GPU<->host mailbox: it needs no
// spinning CPU core and no SM while waiting, runs identically eager and inside captured graphs
// (FULL, PIECEWISE), and cannot hang the GPU if the engine fails. The mailbox saves ~20 us per
// layer (shared/design/vllm-0.26-integration.md, section 3.4); it stays the optimisation to
// try if the measured host-node overhead is too high.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cpu/moe_layer.h"

namespace lk {

// Running totals of the host-node runs of one layer's calls, shared by its HostForwards. Counted
// in the host function itself, so CUDA-graph replays (where no Python runs) are included.
struct HostCallCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> rows{0};  // rows with at least one expert id (vLLM's graph padding is all -1)
  std::atomic<uint64_t> ns{0};    // wall time of the runs: wait for the pool + compute
};

// One immutable call: fixed pinned buffers and a fixed token count, so a graph that captured
// it replays exactly this call. The engine writes out_host; the caller's stream copies it back.
class HostForward {
 public:
  HostForward(std::shared_ptr<MoELayer> layer, const ForwardArgs& args,
              std::shared_ptr<HostCallCounters> counters = nullptr);
  // Enqueue the engine call on a CUDA stream (cudaStream_t as an integer) as a host-function node.
  void enqueue(uintptr_t stream);
  // The same through a mailbox in mapped pinned memory: stream memory operations ring a
  // doorbell that a spinning poller thread serves, then the stream waits for the done word
  // (no driver callback thread, no kernel). Experimental: measured against enqueue().
  void enqueue_mailbox(uintptr_t stream);
  // Number of calls that found an invalid expert id (their output rows are NaN); reset on read.
  uint32_t take_errors();
  // Time of the last host-node run, split: wait for the pool + compute, in microseconds.
  double last_host_us() const { return last_us_.load(std::memory_order_relaxed); }

 private:
  static void run(void* self);
 public:
  static void serve(HostForward* self);  // for the mailbox poller
 private:
  uint32_t mailbox_id_ = 0;
  std::shared_ptr<MoELayer> layer_;
  ForwardArgs args_;
  std::atomic<uint32_t> errors_{0};
  std::atomic<double> last_us_{0};
  std::shared_ptr<HostCallCounters> counters_;
};

bool cuda_runtime_available(std::string* why);

// Page-lock [ptr, ptr+bytes) for fast async copies to the GPU (cudaHostRegister); throws with the
// CUDA error on failure (and clears it, so torch does not trip over it later).
void register_host_memory(void* ptr, size_t bytes);
void unregister_host_memory(void* ptr);

}  // namespace lk
