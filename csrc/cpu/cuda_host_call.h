// The CPU expert call as a CUDA stream operation (graph-capturable), with no link-time CUDA
// dependency: the CUDA runtime that torch already loaded is looked up at first use, so the
// engine still loads on machines without CUDA.
//
// Three ways for the stream to hand the call to the engine (LK_CPU_SIGNAL; the default, auto,
// takes the kernel below for decode-sized calls and hostfn for bigger ones, see lk_moe/config.py):
// - hostfn: a host-function node (cudaLaunchHostFunc). It needs no spinning CPU core and
//   no SM while waiting, runs identically eager and inside captured graphs (FULL, PIECEWISE), and
//   cannot hang the GPU if the engine fails. The caller's stream copies the inputs/output.
// - mailbox: stream memory operations on a mapped pinned page served by a polling thread (saves
//   the callback-thread wake-up).
// - kernel: ONE CUDA kernel per call (csrc/cuda/cpu_signal.cu, launched from Python through
//   lk_moe/_lk_cuda.so) copies the inputs into the mapped pinned buffers, writes a request word,
//   spins until this file's poller thread answers, copies the output back: one graph node instead
//   of five. Costs one spinning block and one spinning host thread; gives up after a timeout
//   (NaN output, counted by take_errors) so a dead engine cannot hang the GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cpu/moe_layer.h"

namespace lk {

// Running totals of the host-node runs of one layer's calls, shared by its HostForwards. Counted
// in the host function itself, so CUDA-graph replays (where no Python runs) are included.
struct PathCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> rows{0};  // rows with at least one expert id (vLLM's graph padding is all -1)
  std::atomic<uint64_t> ns{0};    // wall time of the runs: wait for the pool + compute
};
struct HostCallCounters {
  // By the engine's own split: a call whose active experts average fewer than kDecodeSlots slots
  // (token x expert pairs) each runs the decode tiles; a call without any expert id counts as decode.
  static constexpr int kDecodeSlots = 16;
  PathCounters decode, prefill;
  std::atomic<uint64_t> queue_ns{0};  // host-function start to the pool starting the job (both paths)
};

// One immutable call: fixed pinned buffers and a fixed token count, so a graph that captured
// it replays exactly this call. The engine writes out_host; the caller's stream copies it back.
class HostForward {
 public:
  HostForward(std::shared_ptr<MoELayer> layer, const ForwardArgs& args,
              std::shared_ptr<HostCallCounters> counters = nullptr);
  ~HostForward();
  HostForward(const HostForward&) = delete;
  HostForward& operator=(const HostForward&) = delete;
  // Enqueue the engine call on a CUDA stream (cudaStream_t as an integer) as a host-function node.
  void enqueue(uintptr_t stream);
  // The same through a mailbox in mapped pinned memory: stream memory operations ring a
  // doorbell that a spinning poller thread serves, then the stream waits for the done word
  // (no driver callback thread, no kernel). Experimental: measured against enqueue().
  void enqueue_mailbox(uintptr_t stream);
  // The device-side addresses the single-kernel signal (csrc/cuda/cpu_signal.cu, LK_CPU_SIGNAL=kernel)
  // needs: the mapped request/done words of the process-wide kernel channel, this call's mapped
  // timeout counter, and the mapped pinned x/ids/weights/out buffers. Registers the call with the
  // channel's poller thread (started on first use) the first time. Throws if mapped memory is
  // unavailable.
  struct KernelArgs {
    uintptr_t req, done, timeouts;
    uint32_t call_id;
    uintptr_t x, ids, weights, out;
  };
  KernelArgs kernel_args();
  // Number of calls that found an invalid expert id (their output rows are NaN), plus runs of the
  // kernel signal that timed out waiting for the host (NaN too); reset on read.
  uint32_t take_errors();
  // Time of the last host-node run, split: wait for the pool + compute, in microseconds.
  double last_host_us() const { return last_us_.load(std::memory_order_relaxed); }

 private:
  static void run(void* self);
 public:
  static void serve(HostForward* self);  // for the mailbox poller
 private:
  uint32_t mailbox_id_ = 0;
  uint32_t kernel_id_ = 0;               // slot in the kernel channel (0: not registered)
  uint32_t kernel_timeouts_seen_ = 0;    // timeouts[kernel_id_] already reported
  KernelArgs kernel_args_{};
  std::shared_ptr<MoELayer> layer_;
  ForwardArgs args_;
  std::atomic<uint32_t> errors_{0};
  std::atomic<double> last_us_{0};
  std::shared_ptr<HostCallCounters> counters_;
};

bool cuda_runtime_available(std::string* why);

// Test hook: while paused, the kernel channel's poller answers nothing (the GPU side then times out).
void kernel_poller_pause(bool paused);

// Page-lock [ptr, ptr+bytes) for fast async copies to the GPU (cudaHostRegister); throws with the
// CUDA error on failure (and clears it, so torch does not trip over it later). unregister takes the
// same range back.
void register_host_memory(void* ptr, size_t bytes);
void unregister_host_memory(void* ptr, size_t bytes);
// Bytes registered by register_host_memory and not yet unregistered, process-wide (for /metrics: the
// kernel's VmPin does not count CUDA's page-locking).
size_t registered_host_bytes();

}  // namespace lk
