#include "cpu/cuda_host_call.h"

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace lk {
namespace {

// The few runtime entry points used, declared here (stable C ABI of libcudart).
using cudaError_t = int;
using cudaStream_t = void*;
using cudaHostFn_t = void (*)(void*);
using LaunchHostFunc = cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*);
using GetErrorString = const char* (*)(cudaError_t);

struct CudaRuntime {
  LaunchHostFunc launch_host_func = nullptr;
  GetErrorString error_string = nullptr;
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

}  // namespace

bool cuda_runtime_available(std::string* why) {
  const CudaRuntime& r = runtime();
  if (why) *why = r.why;
  return r.launch_host_func != nullptr;
}

HostForward::HostForward(std::shared_ptr<MoELayer> layer, const ForwardArgs& args)
    : layer_(std::move(layer)), args_(args) {
  std::string why;
  if (!cuda_runtime_available(&why)) throw std::runtime_error("CPU expert path needs CUDA: " + why);
}

void HostForward::enqueue(uintptr_t stream) {
  const CudaRuntime& r = runtime();
  const cudaError_t err = r.launch_host_func(reinterpret_cast<cudaStream_t>(stream), &HostForward::run, this);
  if (err != 0) throw std::runtime_error(std::string("cudaLaunchHostFunc failed: ") + r.error_string(err));
}

uint32_t HostForward::take_errors() { return errors_.exchange(0); }

// Runs on CUDA's callback thread: no CUDA calls, no exceptions, no GIL.
void HostForward::run(void* p) {
  HostForward* self = static_cast<HostForward*>(p);
  const auto t0 = std::chrono::steady_clock::now();
  const ForwardArgs& a = self->args_;
  const int E = self->layer_->shape().experts;
  bool ok = true;
  for (int64_t i = 0; i < a.tokens * a.top_k; ++i) ok &= a.ids[i] >= -1 && a.ids[i] < E;
  if (!ok) {
    self->errors_.fetch_add(1);
    fill_nan(a, self->layer_->shape().hidden);
  } else {
    try {
      self->layer_->submit(a)->wait();
    } catch (...) {
      self->errors_.fetch_add(1);
      fill_nan(a, self->layer_->shape().hidden);
    }
  }
  self->last_us_.store(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(),
                       std::memory_order_relaxed);
}

}  // namespace lk
