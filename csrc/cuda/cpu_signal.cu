// The CPU expert call as ONE kernel (LK_CPU_SIGNAL=kernel): copy the inputs into the mapped pinned
// host buffers, ring the host, spin until the engine answers, copy the output back.
//
// Why it should cut the per-layer overhead (measured at M = 1, graph-captured, H200: hostfn
// ~93-123 us, mailbox ~64 us, of which the copies alone ~14 us; target <= 40 us):
//   - one graph node instead of five (3 D2H copies + signal + 1 H2D copy): each copy node costs a
//     DMA-engine setup and a dependency hop of a few microseconds even for a few KB; here the
//     inputs of a decode step (x: M*H*2 bytes, ids/weights: M*K*4 bytes each) are a handful of
//     zero-copy stores over PCIe (posted writes) from one block, and the output one round of loads;
//   - no driver callback thread to wake up (hostfn) and no stream memory operations (mailbox): the
//     host's poller thread sees the request word change ~1 us after the GPU wrote it, and the
//     kernel sees the done word on its next poll (one PCIe read round trip).
// What it costs:
//   - one block (512 threads, one SM slot) sits on an SM spinning while the CPU computes; other
//     kernels (shared experts on a side stream) still get every other SM;
//   - a host thread spins on the request word (one core; it naps 20 us between looks after 2 ms
//     without requests), as the mailbox poller does;
//   - copies are bandwidth-limited from one block: large batches (prefill sizes) should move their
//     data with ordinary copies; the caller passes null sources/destinations to skip a phase
//     (lk_moe/cpu_path.py does so above a size threshold).
//
// Protocol (the mapped words live in a page allocated by csrc/cpu/cuda_host_call.cpp):
//   req  (u64, GPU writes, host reads):  call_id << 32 | seq
//   done (u32, host writes, GPU reads):  the seq the host answered
//   timeouts[call_id] (u32, GPU writes, host reads): count of this call's timed-out runs
// seq comes from a device-side counter that every run increments (atomicAdd, skipping 0), so each
// replay of a captured graph is a new request; the host answers with the seq it saw. A device-side
// lock serialises runs from concurrent streams (they share the one request word). One CUDA device
// per process: the counter and lock are per device (per module instance), the request word is not
// (lk_moe/cpu_path.py refuses a second device).
//
// Deadlock guard: a run gives up after timeout_ns of globaltimer time (10 s by default) waiting for
// the lock or the done word: it writes NaN into the device output, bumps timeouts[call_id] (which
// HostForward::take_errors(), hence CpuExpertPath.check_errors(), reports) and releases the lock.
// A dead or stuck engine therefore delays each call by the timeout but never hangs the GPU. A late
// answer (done = an old seq) is ignored: the kernel waits for its own seq only.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: 32 KB a round over the block

__device__ unsigned int g_seq = 0;  // last request number handed out (device-wide)
__device__ int g_lock = 0;          // 1 while a run owns the request word

struct Args {
  unsigned long long* req;
  const unsigned int* done;
  unsigned int* timeouts;  // this call's counter
  unsigned int call_id;
  const void* in_src[3];   // device x, ids, weights (null: the caller copied them already)
  void* in_dst[3];         // their mapped pinned host buffers (device addresses)
  long long in_bytes[3];
  const void* out_src;     // mapped pinned output (device address); null: the caller copies it
  void* out_dst;           // device output (or the mapped output when out_src is null): NaN on timeout
  long long out_bytes;
  unsigned short nan_bits; // quiet NaN of the output's 16-bit type
  unsigned long long timeout_ns;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned int load_acquire_sys(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Block-wide copy; kFromHost: the source is mapped host memory written by the CPU, read with
// ld.global.cv (never a stale cached line).
template <bool kFromHost>
__device__ void block_copy(const void* src, void* dst, long long n) {
  const int tid = threadIdx.x;
  long long head = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const long long nv = n / 16;
    const int4* s = static_cast<const int4*>(src);
    int4* d = static_cast<int4*>(dst);
    for (long long base = 0; base < nv; base += (long long)kUnroll * kThreads) {
      int4 r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long i = base + u * kThreads + tid;
        if (i < nv) r[u] = kFromHost ? __ldcv(s + i) : s[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long i = base + u * kThreads + tid;
        if (i < nv) d[i] = r[u];
      }
    }
    head = nv * 16;
  }
  const unsigned char* sb = static_cast<const unsigned char*>(src);
  unsigned char* db = static_cast<unsigned char*>(dst);
  for (long long i = head + tid; i < n; i += kThreads) db[i] = kFromHost ? __ldcv(sb + i) : sb[i];
}

__device__ void fill_nan(unsigned short* out, long long elems, unsigned short bits) {
  for (long long i = threadIdx.x; i < elems; i += kThreads) out[i] = bits;
}

__global__ void __launch_bounds__(kThreads) cpu_call_kernel(Args a) {
  __shared__ int s_ok;
  const unsigned long long t0 = global_ns();
  if (threadIdx.x == 0) {
    int ok = 1;
    unsigned int nap = 32;
    while (atomicCAS(&g_lock, 0, 1) != 0) {
      if (global_ns() - t0 > a.timeout_ns) {
        ok = 0;
        break;
      }
      __nanosleep(nap);
      nap = nap < 1024 ? nap * 2 : 1024;
    }
    __threadfence();  // acquire: the previous owner's writes (pinned buffers reused) come first
    s_ok = ok;
  }
  __syncthreads();
  const bool locked = s_ok;
  if (locked) {
    // (1) inputs -> mapped pinned host buffers (zero-copy stores over PCIe)
    for (int j = 0; j < 3; ++j)
      if (a.in_src[j]) block_copy<false>(a.in_src[j], a.in_dst[j], a.in_bytes[j]);
    __threadfence_system();  // each thread's stores reach host memory before the request
    __syncthreads();
    if (threadIdx.x == 0) {
      // (2) the request: a fresh sequence number (every run, graph replays included)
      unsigned int seq = atomicAdd(&g_seq, 1u) + 1u;
      if (seq == 0) seq = atomicAdd(&g_seq, 1u) + 1u;  // 0 means "none"
      __threadfence_system();
      store_release_sys(a.req, (static_cast<unsigned long long>(a.call_id) << 32) | seq);
      // (3) wait for the host's answer, bounded
      int ok = 1;
      unsigned int nap = 0;
      while (load_acquire_sys(a.done) != seq) {
        if (global_ns() - t0 > a.timeout_ns) {
          ok = 0;
          break;
        }
        if (nap) __nanosleep(nap);
        nap = nap ? (nap < 512 ? nap * 2 : 512) : 32;
      }
      s_ok = ok;
    }
    __syncthreads();
  }
  const bool answered = locked && s_ok;
  if (answered) {
    // (4) output: mapped pinned host buffer -> device tensor
    if (a.out_src) block_copy<true>(a.out_src, a.out_dst, a.out_bytes);
  } else {
    if (a.out_dst) fill_nan(static_cast<unsigned short*>(a.out_dst), a.out_bytes / 2, a.nan_bits);
    __threadfence_system();  // out_dst may be the mapped output that a DMA copy reads next
    if (threadIdx.x == 0) {
      volatile unsigned int* t = a.timeouts;
      *t = *t + 1u;  // only this call's runs write it; the host only reads it
      __threadfence_system();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && locked) {
    __threadfence();
    atomicExch(&g_lock, 0);
  }
}

}  // namespace

#define LK_EXPORT __attribute__((visibility("default")))

extern "C" {

// One CPU expert call on `stream` (graph-capturable: a single kernel launch). Pointers to mapped
// memory are device addresses (cudaHostGetDevicePointer). A null *_src skips that copy (the caller
// moves the data with ordinary copies); out_dst is where a timed-out run writes NaN: the device
// output, or the mapped output buffer itself when the caller copies it back. Returns a cudaError_t.
LK_EXPORT int lk_cpu_call_kernel(void* req, const void* done, void* timeouts, unsigned int call_id,
                                 const void* x_src, void* x_host, long long x_bytes,
                                 const void* ids_src, void* ids_host, long long ids_bytes,
                                 const void* w_src, void* w_host, long long w_bytes,
                                 const void* out_host, void* out_dst, long long out_bytes,
                                 unsigned int nan_bits, unsigned long long timeout_ns,
                                 void* stream) {
  if (!req || !done || !timeouts || !out_dst || out_bytes < 0 || out_bytes % 2 || x_bytes < 0 || ids_bytes < 0 ||
      w_bytes < 0)
    return int(cudaErrorInvalidValue);
  Args a;
  a.req = static_cast<unsigned long long*>(req);
  a.done = static_cast<const unsigned int*>(done);
  a.timeouts = static_cast<unsigned int*>(timeouts);
  a.call_id = call_id;
  a.in_src[0] = x_src;
  a.in_src[1] = ids_src;
  a.in_src[2] = w_src;
  a.in_dst[0] = x_host;
  a.in_dst[1] = ids_host;
  a.in_dst[2] = w_host;
  a.in_bytes[0] = x_bytes;
  a.in_bytes[1] = ids_bytes;
  a.in_bytes[2] = w_bytes;
  a.out_src = out_host;
  a.out_dst = out_dst;
  a.out_bytes = out_bytes;
  a.nan_bits = static_cast<unsigned short>(nan_bits);
  a.timeout_ns = timeout_ns;
  cpu_call_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return int(cudaGetLastError());
}

}  // extern "C"
