#include "cpu/cuda_host_call.h"

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace lk {
namespace {

// The few runtime entry points used, declared here (stable C ABI of libcudart).
using cudaError_t = int;
using cudaStream_t = void*;
using cudaHostFn_t = void (*)(void*);
using LaunchHostFunc = cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*);
using GetErrorString = const char* (*)(cudaError_t);

using HostRegister = cudaError_t (*)(void*, size_t, unsigned);
using HostUnregister = cudaError_t (*)(void*);
using GetLastError = cudaError_t (*)();
using HostAlloc = cudaError_t (*)(void**, size_t, unsigned);
using HostGetDevicePointer = cudaError_t (*)(void**, void*, unsigned);

struct CudaRuntime {
  LaunchHostFunc launch_host_func = nullptr;
  GetErrorString error_string = nullptr;
  HostRegister host_register = nullptr;
  HostUnregister host_unregister = nullptr;
  GetLastError get_last_error = nullptr;
  HostAlloc host_alloc = nullptr;
  HostGetDevicePointer host_device_pointer = nullptr;
  std::string why;
};

const CudaRuntime& runtime() {
  static CudaRuntime rt = [] {
    CudaRuntime r;
    void* lib = nullptr;
    // Prefer the runtime torch has already loaded (same process-wide state and streams).
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      if (lib) break;
    }
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (lib) break;
      lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    }
    if (!lib) {
      r.why = "the CUDA runtime (libcudart) is not loaded and could not be opened";
      return r;
    }
    r.launch_host_func = reinterpret_cast<LaunchHostFunc>(dlsym(lib, "cudaLaunchHostFunc"));
    r.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cudaGetErrorString"));
    r.host_register = reinterpret_cast<HostRegister>(dlsym(lib, "cudaHostRegister"));
    r.host_unregister = reinterpret_cast<HostUnregister>(dlsym(lib, "cudaHostUnregister"));
    r.get_last_error = reinterpret_cast<GetLastError>(dlsym(lib, "cudaGetLastError"));
    r.host_alloc = reinterpret_cast<HostAlloc>(dlsym(lib, "cudaHostAlloc"));
    r.host_device_pointer = reinterpret_cast<HostGetDevicePointer>(dlsym(lib, "cudaHostGetDevicePointer"));
    if (!r.launch_host_func || !r.error_string) r.why = "libcudart lacks cudaLaunchHostFunc";
    return r;
  }();
  return rt;
}

void fill_nan(const ForwardArgs& a, int hidden) {
  // bf16 and fp16 quiet NaN patterns: the fault shows up downstream instead of garbage.
  const uint16_t nan = a.out_type == DType::kBF16 ? 0x7fc0 : 0x7e00;
  uint16_t* o = static_cast<uint16_t*>(a.out);
  for (int64_t i = 0; i < a.tokens * hidden; ++i) o[i] = nan;
}

// ---- mailbox: driver stream memory operations on a mapped pinned page
using CUresult = int;
using CUdeviceptr = unsigned long long;
using WriteValue32 = CUresult (*)(void*, CUdeviceptr, uint32_t, unsigned);
using WaitValue32 = CUresult (*)(void*, CUdeviceptr, uint32_t, unsigned);
constexpr unsigned kWaitEq = 0x1;
constexpr uint32_t kMaxCalls = 8192;

struct Mailbox {
  volatile uint32_t* req = nullptr;   // id of the call the GPU asks for (0: none)
  volatile uint32_t* done = nullptr;  // done[id] = 1 when the call finished
  CUdeviceptr req_dev = 0, done_dev = 0;
  WriteValue32 write = nullptr;
  WaitValue32 wait = nullptr;
  std::mutex mu;
  std::vector<HostForward*> calls{nullptr};  // id -> call (0 unused)
  std::string why;
};

void poll_forever(Mailbox* mb);

// A zeroed page of mapped pinned memory that host and GPU both address (mailbox and kernel-signal
// flags). Returns the host pointer and sets *dev, or nullptr with *why set.
void* alloc_mapped_page(const CudaRuntime& rt, size_t bytes, uintptr_t* dev, std::string* why) {
  void* page = nullptr;
  constexpr unsigned kPortableMapped = 0x1 | 0x2;  // cudaHostAllocPortable | cudaHostAllocMapped
  if (rt.host_alloc(&page, bytes, kPortableMapped) != 0) {
    if (rt.get_last_error) rt.get_last_error();
    *why = "cudaHostAlloc(mapped) failed";
    return nullptr;
  }
  memset(page, 0, bytes);
  void* d = nullptr;
  if (rt.host_device_pointer(&d, page, 0) != 0) {
    if (rt.get_last_error) rt.get_last_error();
    *why = "cudaHostGetDevicePointer failed";
    return nullptr;
  }
  *dev = reinterpret_cast<uintptr_t>(d);
  return page;
}

Mailbox& mailbox() {
  static Mailbox* mb = [] {
    auto* m = new Mailbox;  // lives for the process: the poller thread reads it until exit
    const CudaRuntime& rt = runtime();
    void* drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!drv) drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (!drv || !rt.host_alloc || !rt.host_device_pointer) {
      m->why = "CUDA driver or runtime not loaded";
      return m;
    }
    m->write = reinterpret_cast<WriteValue32>(dlsym(drv, "cuStreamWriteValue32_v2"));
    m->wait = reinterpret_cast<WaitValue32>(dlsym(drv, "cuStreamWaitValue32_v2"));
    if (!m->write || !m->wait) {
      m->why = "stream memory operations not found in the CUDA driver";
      return m;
    }
    uintptr_t dev = 0;
    void* page = alloc_mapped_page(rt, 64 + kMaxCalls * 4, &dev, &m->why);
    if (!page) return m;
    m->req = static_cast<volatile uint32_t*>(page);
    m->done = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(page) + 64);
    m->req_dev = static_cast<CUdeviceptr>(dev);
    m->done_dev = m->req_dev + 64;
    std::thread(poll_forever, m).detach();
    return m;
  }();
  return *mb;
}

// The pollers' loop: `serve_one()` answers one pending request and returns true, or returns false
// when there is none. Spins while requests keep coming, naps 20 us between looks once idle for 2 ms.
template <class ServeOne>
[[noreturn]] void poll_with_naps(ServeOne serve_one) {
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  for (uint32_t i = 0;; ++i) {
    if (serve_one()) {
      last = clock::now();
      continue;
    }
    __builtin_ia32_pause();
    if ((i & 255) == 0 && clock::now() - last > std::chrono::milliseconds(2)) {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    }
  }
}

// Serves doorbells: the id of the call asked for, 0 for none.
void poll_forever(Mailbox* mb) {
  pthread_setname_np(pthread_self(), "lk_moe-mailbox");  // names show in top -H and the benchmarks' CPU census
  poll_with_naps([mb] {
    const uint32_t id = *mb->req;
    if (id == 0) return false;
    *mb->req = 0;
    HostForward* call = nullptr;
    {
      std::lock_guard<std::mutex> lock(mb->mu);
      if (id < mb->calls.size()) call = mb->calls[id];
    }
    if (call) HostForward::serve(call);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    mb->done[id] = 1;
    return true;
  });
}

// ---- kernel channel (LK_CPU_SIGNAL=kernel): one CUDA kernel per call copies the inputs into the
// mapped pinned buffers, writes `req` = call_id << 32 | seq and spins until `done` == seq
// (csrc/cuda/cpu_signal.cu explains the protocol and its costs). Layout of the mapped page:
//   [0, 8)      req (u64, written by the GPU)
//   [64, 68)    done (u32, written by this poller)
//   [128, ...)  timeouts[call_id] (u32, written by the GPU: runs that gave up waiting)
struct KernelChannel {
  volatile uint64_t* req = nullptr;
  volatile uint32_t* done = nullptr;
  volatile uint32_t* timeouts = nullptr;
  uintptr_t req_dev = 0, done_dev = 0, timeouts_dev = 0;
  std::mutex mu;
  std::vector<HostForward*> calls{nullptr};  // id -> call (0 unused)
  std::atomic<bool> paused{false};           // test hook: answer nothing
  std::unordered_map<const void*, uintptr_t> mapped;  // host pointer -> device address (cached, so a
                                                      // call first made during graph capture needs no CUDA call)
  std::string why;
};

void poll_kernel_channel(KernelChannel* ch);

KernelChannel& kernel_channel() {
  static KernelChannel* ch = [] {
    auto* c = new KernelChannel;  // lives for the process: the poller thread reads it until exit
    const CudaRuntime& rt = runtime();
    if (!rt.host_alloc || !rt.host_device_pointer) {
      c->why = "the CUDA runtime is not loaded (" + rt.why + ")";
      return c;
    }
    uintptr_t dev = 0;
    void* page = alloc_mapped_page(rt, 128 + size_t(kMaxCalls) * 4, &dev, &c->why);
    if (!page) return c;
    c->req = static_cast<volatile uint64_t*>(page);
    c->done = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(page) + 64);
    c->timeouts = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(page) + 128);
    c->req_dev = dev;
    c->done_dev = c->req_dev + 64;
    c->timeouts_dev = c->req_dev + 128;
    std::thread(poll_kernel_channel, c).detach();
    return c;
  }();
  return *ch;
}

// Serves requests: a request is new when its seq differs from the last one answered (each run of
// the kernel, graph replays included, takes a fresh seq). Answers with the seq it saw, so a late
// answer to a run that already gave up is ignored by the next run.
void poll_kernel_channel(KernelChannel* ch) {
  pthread_setname_np(pthread_self(), "lk_moe-poller");
  uint32_t answered = 0;
  poll_with_naps([ch, &answered] {
    const uint64_t r = *ch->req;  // one aligned 8-byte load: call id and seq together
    const uint32_t seq = uint32_t(r);
    if (seq == answered || ch->paused.load(std::memory_order_relaxed)) return false;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the inputs were written before the request
    const uint32_t id = uint32_t(r >> 32);
    {
      // Held while serving, so ~HostForward (which clears its slot under this lock) cannot free
      // the call mid-run; registration of new calls waits for at most one engine run.
      std::lock_guard<std::mutex> lock(ch->mu);
      if (id < ch->calls.size() && ch->calls[id]) HostForward::serve(ch->calls[id]);
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // mfence: the output (streaming stores too) first
    *ch->done = seq;
    answered = seq;
    return true;
  });
}

// Called with the channel's lock held.
uintptr_t mapped_device_address(KernelChannel& ch, const void* host, const char* what) {
  auto hit = ch.mapped.find(host);
  if (hit != ch.mapped.end()) return hit->second;
  const CudaRuntime& rt = runtime();
  void* dev = nullptr;
  if (!rt.host_device_pointer || rt.host_device_pointer(&dev, const_cast<void*>(host), 0) != 0) {
    if (rt.get_last_error) rt.get_last_error();
    throw std::runtime_error(std::string("the kernel signal needs the pinned ") + what +
                             " buffer mapped into the GPU's address space (cudaHostGetDevicePointer failed)");
  }
  ch.mapped.emplace(host, reinterpret_cast<uintptr_t>(dev));
  return reinterpret_cast<uintptr_t>(dev);
}

}  // namespace

void kernel_poller_pause(bool paused) { kernel_channel().paused.store(paused); }

HostForward::KernelArgs HostForward::kernel_args() {
  if (kernel_id_ != 0) return kernel_args_;
  KernelChannel& ch = kernel_channel();
  if (!ch.req) throw std::runtime_error("kernel signal unavailable: " + ch.why);
  KernelArgs k;
  k.req = ch.req_dev;
  k.done = ch.done_dev;
  {
    std::lock_guard<std::mutex> lock(ch.mu);
    k.x = mapped_device_address(ch, args_.x, "x");
    k.ids = mapped_device_address(ch, args_.ids, "ids");
    k.weights = mapped_device_address(ch, args_.weights, "weights");
    k.out = mapped_device_address(ch, args_.out, "output");
    if (ch.calls.size() >= kMaxCalls) throw std::runtime_error("too many kernel-signal calls");
    k.call_id = uint32_t(ch.calls.size());
    ch.calls.push_back(this);
  }
  k.timeouts = ch.timeouts_dev + 4ull * k.call_id;
  kernel_timeouts_seen_ = ch.timeouts[k.call_id];
  kernel_args_ = k;
  kernel_id_ = k.call_id;
  return k;
}

void HostForward::serve(HostForward* self) { run(self); }

HostForward::~HostForward() {
  if (kernel_id_ != 0) {
    KernelChannel& ch = kernel_channel();
    std::lock_guard<std::mutex> lock(ch.mu);
    ch.calls[kernel_id_] = nullptr;  // a stale request for it is answered without running
  }
}

void HostForward::enqueue_mailbox(uintptr_t stream) {
  Mailbox& mb = mailbox();
  if (!mb.req) throw std::runtime_error("mailbox unavailable: " + mb.why);
  if (mailbox_id_ == 0) {
    std::lock_guard<std::mutex> lock(mb.mu);
    if (mb.calls.size() >= kMaxCalls) throw std::runtime_error("too many mailbox calls");
    mailbox_id_ = uint32_t(mb.calls.size());
    mb.calls.push_back(this);
  }
  void* s = reinterpret_cast<void*>(stream);
  const CUdeviceptr done = mb.done_dev + 4ull * mailbox_id_;
  CUresult r = mb.write(s, done, 0, 0);
  if (r == 0) r = mb.write(s, mb.req_dev, mailbox_id_, 0);
  if (r == 0) r = mb.wait(s, done, 1, kWaitEq);
  if (r != 0) throw std::runtime_error("CUDA stream memory operation failed (CUresult " + std::to_string(r) + ")");
}

bool cuda_runtime_available(std::string* why) {
  const CudaRuntime& r = runtime();
  if (why) *why = r.why;
  return r.launch_host_func != nullptr;
}

namespace {
std::atomic<size_t> g_registered_bytes{0};
}

size_t registered_host_bytes() { return g_registered_bytes.load(std::memory_order_relaxed); }

void register_host_memory(void* ptr, size_t bytes) {
  const CudaRuntime& r = runtime();
  if (!r.host_register) throw std::runtime_error("cannot pin expert memory: " + r.why);
  const cudaError_t err = r.host_register(ptr, bytes, 0);
  if (err != 0) {
    if (r.get_last_error) r.get_last_error();  // not sticky: clear it for torch
    throw std::runtime_error("cudaHostRegister of " + std::to_string(bytes >> 20) + " MiB of expert memory failed: " +
                             r.error_string(err) + " (check the locked-memory limit, `ulimit -l`)");
  }
  g_registered_bytes += bytes;
}

void unregister_host_memory(void* ptr, size_t bytes) {
  const CudaRuntime& r = runtime();
  if (r.host_unregister && r.host_unregister(ptr) != 0 && r.get_last_error) r.get_last_error();
  g_registered_bytes -= bytes;
}

HostForward::HostForward(std::shared_ptr<MoELayer> layer, const ForwardArgs& args,
                         std::shared_ptr<HostCallCounters> counters)
    : layer_(std::move(layer)), args_(args), counters_(std::move(counters)) {
  std::string why;
  if (!cuda_runtime_available(&why)) throw std::runtime_error("CPU expert path needs CUDA: " + why);
}

void HostForward::enqueue(uintptr_t stream) {
  const CudaRuntime& r = runtime();
  const cudaError_t err = r.launch_host_func(reinterpret_cast<cudaStream_t>(stream), &HostForward::run, this);
  if (err != 0) throw std::runtime_error(std::string("cudaLaunchHostFunc failed: ") + r.error_string(err));
}

uint32_t HostForward::take_errors() {
  uint32_t n = errors_.exchange(0);
  if (kernel_id_ != 0) {  // runs of the kernel signal that gave up waiting (written by the GPU)
    const uint32_t seen = kernel_channel().timeouts[kernel_id_];
    n += seen - kernel_timeouts_seen_;
    kernel_timeouts_seen_ = seen;
  }
  return n;
}

// Runs on CUDA's callback thread: no CUDA calls, no exceptions, no GIL.
void HostForward::run(void* p) {
  HostForward* self = static_cast<HostForward*>(p);
  const auto t0 = std::chrono::steady_clock::now();
  const ForwardArgs& a = self->args_;
  const int E = self->layer_->shape().experts;
  bool ok = true;
  int64_t rows = 0, slots = 0;
  // Distinct experts used (for the decode/prefill split of the counters); layers past 4096 experts
  // count every slot's expert as new, which only tilts the split towards decode.
  uint64_t seen[64] = {};
  int64_t active = 0;
  for (int64_t t = 0; t < a.tokens; ++t) {
    bool used = false;
    for (int k = 0; k < a.top_k; ++k) {
      const int32_t id = a.ids[t * a.top_k + k];
      ok &= id >= -1 && id < E;
      if (id < 0) continue;
      used = true;
      ++slots;
      if (id >= 64 * 64) { ++active; continue; }
      const uint64_t bit = uint64_t(1) << (id & 63);
      active += (seen[id >> 6] & bit) == 0;
      seen[id >> 6] |= bit;
    }
    rows += used;
  }
  int64_t start_ns = -1;  // when the pool started the job (steady clock), if one ran
  if (!ok) {
    self->errors_.fetch_add(1);
    fill_nan(a, self->layer_->shape().hidden);
  } else {
    try {
      MoELayer& layer = *self->layer_;
      const uint32_t seq = layer.submit(a);
      layer.pool().wait_for(seq);
      start_ns = layer.pool().started_ns(seq);
    } catch (...) {
      self->errors_.fetch_add(1);
      fill_nan(a, self->layer_->shape().hidden);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const auto dt = t1 - t0;
  self->last_us_.store(std::chrono::duration<double, std::micro>(dt).count(), std::memory_order_relaxed);
  if (HostCallCounters* c = self->counters_.get()) {
    const bool decode = slots < HostCallCounters::kDecodeSlots * std::max<int64_t>(active, 1);
    PathCounters& p = decode ? c->decode : c->prefill;
    p.calls.fetch_add(1, std::memory_order_relaxed);
    p.rows.fetch_add(uint64_t(rows), std::memory_order_relaxed);
    p.ns.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count()),
                   std::memory_order_relaxed);
    const int64_t t0_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
    if (start_ns >= t0_ns)
      c->queue_ns.fetch_add(uint64_t(start_ns - t0_ns), std::memory_order_relaxed);
  }
}

}  // namespace lk
