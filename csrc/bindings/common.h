// What the files of the Python boundary of the CPU engine (lk_moe._C) share: the argument checks
// (every input is validated in these files, so a wrong tensor is a TypeError/ValueError naming it,
// never a crash), the Layer (the engine layer behind lk_moe._C.Layer) and the Handle of a forward.
// One file per job: module.cpp (the module: tiers, pools, hooks), layer.cpp (bf16 layers, forwards,
// properties), checkpoints.cpp (the quantized formats' checkpoint adapters), dequantized.cpp (the
// test-only fp4 dequantizer), gpu_export.cpp (views of the packed weights for the GPU paths),
// host_call.cpp (CUDA-stream calls).
#pragma once

#include <torch/extension.h>

#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cpu/format.h"
#include "cpu/moe_layer.h"
#include "cpu/thread_pool.h"

namespace lk_bind {

namespace py = pybind11;
using lk::DType;

inline std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline void require_cpu_contiguous(const at::Tensor& t, const char* name) {
  if (!t.device().is_cpu())
    throw py::value_error(std::string(name) + " must be a CPU tensor, got one on " + t.device().str());
  if (!t.is_contiguous()) throw py::value_error(std::string(name) + " must be contiguous (call .contiguous())");
}

inline void require_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> want, const char* what) {
  bool ok = t.dim() == int64_t(want.size());
  int64_t i = 0;
  for (int64_t w : want) {
    if (ok && t.size(i) != w) ok = false;
    ++i;
  }
  if (!ok) throw py::value_error(std::string(name) + " must have shape " + what + ", got " + shape_str(t));
}

inline DType half_type(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::kBFloat16) return DType::kBF16;
  if (t.scalar_type() == at::kHalf) return DType::kFP16;
  throw py::type_error(std::string(name) + " must be bfloat16 or float16, got " + dtype_name(t));
}

inline lk::Binding parse_binding(const std::string& s) {
  if (s == "CPU_CORE") return lk::Binding::kCpuCore;
  if (s == "NUMA_NODE") return lk::Binding::kNumaNode;
  if (s == "NONE") return lk::Binding::kNone;
  throw py::value_error("thread binding must be CPU_CORE, NUMA_NODE or NONE, got '" + s + "'");
}

// The activation a checkpoint adapter was given, for every format: "silu", "silu_clamp" (silu with vLLM's
// swiglu_limit: needs swiglu_limit > 0), "situ" (Kimi's SituGLU: situ_beta > 0, situ_linear_beta >= 0, 0 = up
// not clipped) or "swigluoai" (gpt-oss, MiniMax-M3: swiglu_alpha, swiglu_limit; 0 = gpt-oss's 7.0).
struct ActivationArg {
  lk::Activation act = lk::Activation::kSiLU;
  float clamp_limit = 0;  // kSiLUClamp's bound (lk::WeightSource::clamp_limit)
  float situ_beta = 0, situ_linear_beta = 0;  // kSitu's constants (lk::WeightSource::situ_beta, ...)
  float oai_alpha = 1.702f, oai_limit = 7.0f;  // kSwigluOAI's constants (lk::WeightSource::oai_alpha, ...)
};
inline ActivationArg parse_activation(const std::string& activation, double swiglu_limit, double situ_beta,
                                      double situ_linear_beta, const std::string& format, double swiglu_alpha = 1.702) {
  if (activation == "silu") return {};
  if (activation == "swigluoai") {
    const double limit = swiglu_limit == 0 ? 7.0 : swiglu_limit;
    if (!std::isfinite(swiglu_alpha) || !(limit > 0) || !std::isfinite(limit))
      throw py::value_error("activation 'swigluoai' needs a finite swiglu_alpha and a finite swiglu_limit > 0, got " +
                            std::to_string(swiglu_alpha) + " and " + std::to_string(swiglu_limit));
    ActivationArg a{lk::Activation::kSwigluOAI};
    a.oai_alpha = float(swiglu_alpha);
    a.oai_limit = float(limit);
    return a;
  }
  if (activation == "silu_clamp") {
    if (!(swiglu_limit > 0) || !std::isfinite(swiglu_limit))
      throw py::value_error("activation 'silu_clamp' needs swiglu_limit > 0 (finite), got " + std::to_string(swiglu_limit));
    return {lk::Activation::kSiLUClamp, float(swiglu_limit)};
  }
  if (activation == "situ") {
    if (!(situ_beta > 0) || !std::isfinite(situ_beta) || !(situ_linear_beta >= 0) || !std::isfinite(situ_linear_beta))
      throw py::value_error("activation 'situ' needs situ_beta > 0 and situ_linear_beta >= 0 (0: none), finite; got " +
                            std::to_string(situ_beta) + " and " + std::to_string(situ_linear_beta));
    return {lk::Activation::kSitu, 0, float(situ_beta), float(situ_linear_beta)};
  }
  throw py::value_error("activation '" + activation + "' is not supported for " + format +
                        " (supported: silu, silu_clamp, situ, swigluoai)");
}

// "[a, b, c]": the shape a tensor must have, for an error message.
inline std::string dims(std::initializer_list<int64_t> v) {
  std::string r = "[";
  for (int64_t x : v) r += (r.size() > 1 ? ", " : "") + std::to_string(x);
  return r + "]";
}

// A forward in flight: keeps its tensors (and the layer) alive until the job finished. The job reads
// and writes them through raw pointers, so a handle dropped without wait() waits in its destructor
// (a handle that was waited, as forward()'s always is, has nothing left to wait for). Move-only: one
// owner per job.
struct Handle {
  std::shared_ptr<lk::MoELayer> layer;
  at::Tensor x, ids, weights, out;
  uint32_t seq = 0;
  bool pending = false;  // submitted and not yet seen finished

  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept
      : layer(std::move(o.layer)), x(std::move(o.x)), ids(std::move(o.ids)), weights(std::move(o.weights)),
        out(std::move(o.out)), seq(o.seq), pending(std::exchange(o.pending, false)) {}
  Handle& operator=(Handle&&) = delete;
  ~Handle() { finish(); }

  bool done() const { return !pending || layer->pool().finished(seq); }
  at::Tensor wait() {
    finish();
    return out;
  }

 private:
  void finish() {
    if (!pending) return;
    if (!layer->pool().finished(seq)) {
      if (PyGILState_Check()) {
        py::gil_scoped_release nogil;
        layer->pool().wait_for(seq);
      } else {
        layer->pool().wait_for(seq);
      }
    }
    pending = false;
  }
};

struct Layer {
  std::shared_ptr<lk::MoELayer> impl;

  Layer() = default;
  // bf16 / fp16 experts: w13 [E, 2I, H], w2 [E, H, I] (layer.cpp).
  Layer(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
        const std::string& activation, double swiglu_limit, double situ_beta, double situ_linear_beta,
        double swiglu_alpha);
  // Builds the engine layer without the GIL; a shape the engine cannot take is a ValueError.
  static Layer build(std::shared_ptr<lk::ThreadPool> pool, lk::WeightSource src, int64_t E, int64_t I,
                     int64_t H, ActivationArg act = {});
  Handle submit(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights, const at::Tensor& out);

  // The quantized formats' checkpoint adapters (checkpoints.cpp).
  static std::array<int64_t, 3> check_byte_weights(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& s13,
                                                   const at::Tensor& s2, at::ScalarType code,
                                                   const std::string& code_what, const char* s13_name,
                                                   const char* s2_name, at::ScalarType scale = at::kFloat,
                                                   const std::string& scale_what = "float32");
  static Layer fp8_block(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                         const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                         int64_t block_n, int64_t block_k, double swiglu_limit, double situ_beta,
                         double situ_linear_beta, double swiglu_alpha);
  static Layer per_channel(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                           const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                           const std::string& format, double swiglu_limit, double situ_beta,
                           double situ_linear_beta, double swiglu_alpha);
  static Layer mxfp8(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& s13, const at::Tensor& s2, const std::string& activation, double swiglu_limit,
                     double situ_beta, double situ_linear_beta, double swiglu_alpha);
  static Layer wna16_int4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                          const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> z13,
                          std::optional<at::Tensor> z2, const std::string& activation, double swiglu_limit,
                          double situ_beta, double situ_linear_beta, double swiglu_alpha);
  static Layer mxfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> b13,
                     std::optional<at::Tensor> b2, const std::string& activation, int64_t hidden_size,
                     int64_t intermediate_size, bool interleaved, double alpha, double limit, double situ_beta,
                     double situ_linear_beta);
  static Layer nvfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& s13, const at::Tensor& s2, const at::Tensor& g13, const at::Tensor& g2,
                     std::optional<at::Tensor> a13, std::optional<at::Tensor> a2, const std::string& activation,
                     double swiglu_limit, double situ_beta, double situ_linear_beta, double swiglu_alpha);

  py::tuple dequantized() const;  // dequantized.cpp
};

// Each file's part of the module (module.cpp calls them in this order).
void def_host_call(py::module_& m);              // host_call.cpp: HostCallCounters, HostCall
void def_layer(py::module_& m);                  // layer.cpp: Handle, Layer (and the parts below)
void def_checkpoints(py::class_<Layer>& layer);  // checkpoints.cpp
void def_dequantized(py::class_<Layer>& layer);  // dequantized.cpp
void def_gpu_export(py::class_<Layer>& layer);   // gpu_export.cpp

}  // namespace lk_bind
