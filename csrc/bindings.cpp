// Python boundary of the CPU engine (lk_moe._C). Every input is validated here,
// so a wrong tensor is a TypeError/ValueError naming it, never a crash.
#include <torch/extension.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cpu/cpu_dispatch.h"
#include "cpu/cpu_features.h"
#include "cpu/cuda_host_call.h"
#include "cpu/host_memory.h"
#include "cpu/moe_layer.h"
#include "cpu/numa_topology.h"
#include "cpu/read_bandwidth.h"
#include "cpu/thread_pool.h"

namespace py = pybind11;
using lk::DType;

namespace {

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void require_cpu_contiguous(const at::Tensor& t, const char* name) {
  if (!t.device().is_cpu())
    throw py::value_error(std::string(name) + " must be a CPU tensor, got one on " + t.device().str());
  if (!t.is_contiguous()) throw py::value_error(std::string(name) + " must be contiguous (call .contiguous())");
}

void require_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> want, const char* what) {
  bool ok = t.dim() == int64_t(want.size());
  int64_t i = 0;
  for (int64_t w : want) {
    if (ok && t.size(i) != w) ok = false;
    ++i;
  }
  if (!ok) throw py::value_error(std::string(name) + " must have shape " + what + ", got " + shape_str(t));
}

DType half_type(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::kBFloat16) return DType::kBF16;
  if (t.scalar_type() == at::kHalf) return DType::kFP16;
  throw py::type_error(std::string(name) + " must be bfloat16 or float16, got " + dtype_name(t));
}

lk::Binding parse_binding(const std::string& s) {
  if (s == "CPU_CORE") return lk::Binding::kCpuCore;
  if (s == "NUMA_NODE") return lk::Binding::kNumaNode;
  if (s == "NONE") return lk::Binding::kNone;
  throw py::value_error("thread binding must be CPU_CORE, NUMA_NODE or NONE, got '" + s + "'");
}

void require_silu(const std::string& activation) {
  if (activation != "silu")
    throw py::value_error("activation '" + activation + "' is not supported (supported: silu)");
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

  Layer(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
        const std::string& activation) {
    require_silu(activation);
    const DType t13 = half_type(w13, "w13"), t2 = half_type(w2, "w2");
    if (t13 != t2) throw py::type_error("w13 and w2 must have the same dtype, got " + dtype_name(w13) + " and " + dtype_name(w2));
    if (w13.dim() != 3) throw py::value_error("w13 must have shape [E, 2*I, H], got " + shape_str(w13));
    const int64_t E = w13.size(0), I2 = w13.size(1), H = w13.size(2);
    if (E < 1 || I2 < 2 || I2 % 2 || H < 1)
      throw py::value_error("w13 must have shape [E, 2*I, H] with E >= 1, I >= 1, H >= 1, got " + shape_str(w13));
    const int64_t I = I2 / 2;
    const std::string want2 = "[E, H, I] = [" + std::to_string(E) + ", " + std::to_string(H) + ", " + std::to_string(I) + "]";
    require_shape(w2, "w2", {E, H, I}, want2.c_str());
    require_cpu_contiguous(w13, "w13");
    require_cpu_contiguous(w2, "w2");
    if (E > (1 << 20) || H > (1 << 20) || I > (1 << 20)) throw py::value_error("expert dimensions are implausibly large: " + shape_str(w13));
    lk::WeightSource src;
    src.type = t13;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    impl = build(std::move(pool), src, E, I, H).impl;
  }

  // Checks shared by the byte-quantized formats: weights of `code` dtype shaped [E, 2I, H] and
  // [E, H, I], fp32 scales, everything CPU-contiguous. Returns {E, I, H}. Names in errors are vLLM's.
  static std::array<int64_t, 3> check_byte_weights(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& s13,
                                                   const at::Tensor& s2, at::ScalarType code,
                                                   const std::string& code_what, const char* s13_name,
                                                   const char* s2_name) {
    for (auto [t, name] : {std::pair{&w13, "w13_weight"}, std::pair{&w2, "w2_weight"}})
      if (t->scalar_type() != code)
        throw py::type_error(std::string(name) + " must be " + code_what + ", got " + dtype_name(*t));
    for (auto [t, name] : {std::pair{&s13, s13_name}, std::pair{&s2, s2_name}})
      if (t->scalar_type() != at::kFloat) throw py::type_error(std::string(name) + " must be float32, got " + dtype_name(*t));
    if (w13.dim() != 3 || w13.size(1) % 2) throw py::value_error("w13_weight must be [E, 2*I, H], got " + shape_str(w13));
    const int64_t E = w13.size(0), I = w13.size(1) / 2, H = w13.size(2);
    if (E < 1 || I < 1 || H < 1)
      throw py::value_error("w13_weight must be [E, 2*I, H] with E >= 1, I >= 1, H >= 1, got " + shape_str(w13));
    if (E > (1 << 20) || H > (1 << 20) || I > (1 << 20))
      throw py::value_error("expert dimensions are implausibly large: w13_weight " + shape_str(w13));
    const std::string want2 = "[" + std::to_string(E) + ", " + std::to_string(H) + ", " + std::to_string(I) + "]";
    require_shape(w2, "w2_weight", {E, H, I}, want2.c_str());
    for (auto [t, name] : {std::pair{&w13, "w13_weight"}, std::pair{&w2, "w2_weight"}, std::pair{&s13, s13_name},
                           std::pair{&s2, s2_name}})
      require_cpu_contiguous(*t, name);
    return {E, I, H};
  }

  // Builds the engine layer without the GIL; a shape the engine cannot take is a ValueError.
  static Layer build(std::shared_ptr<lk::ThreadPool> pool, const lk::WeightSource& src, int64_t E, int64_t I,
                     int64_t H, lk::Activation act = lk::Activation::kSiLU) {
    Layer l;
    try {
      py::gil_scoped_release nogil;
      l.impl = std::make_shared<lk::MoELayer>(std::move(pool), src, int(E), int(I), int(H), act);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
    return l;
  }

  // fp8_block: vLLM Fp8MoEMethod after loading (block quant): w13_weight / w2_weight float8_e4m3fn,
  // w13_weight_scale_inv / w2_weight_scale_inv fp32 per (bn x bk) block.
  static Layer fp8_block(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                         const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                         int64_t block_n, int64_t block_k) {
    require_silu(activation);
    const auto [E, I, H] = check_byte_weights(w13, w2, s13, s2, at::kFloat8_e4m3fn, "float8_e4m3fn",
                                              "w13_weight_scale_inv", "w2_weight_scale_inv");
    if (s13.dim() != 3 || s13.size(0) != E || s2.dim() != 3 || s2.size(0) != E || s13.size(1) < 1 ||
        s13.size(2) < 1 || s2.size(1) < 1 || s2.size(2) < 1)
      throw py::value_error("w13_weight_scale_inv / w2_weight_scale_inv must be [E, row blocks, col blocks] with at "
                            "least one block each way, got " + shape_str(s13) + " and " + shape_str(s2));
    // Block size from the shapes when they tile exactly (real checkpoints: 128 x 128); otherwise
    // the caller must say it (block_size), as a grid alone is ambiguous then. (0, 0): infer.
    int64_t bn = block_n, bk = block_k;
    if ((bn || bk) && (bn < 1 || bk < 1 || bn > (1 << 20) || bk > (1 << 20)))
      throw py::value_error("block_size must be (rows, cols) with 1 <= rows, cols <= 1048576, got (" +
                            std::to_string(bn) + ", " + std::to_string(bk) + ")");
    if (bn == 0) {
      if ((2 * I) % s13.size(1) || H % s13.size(2))
        throw py::value_error("cannot infer the fp8 block size from w13_weight " + shape_str(w13) +
                              " and w13_weight_scale_inv " + shape_str(s13) + "; pass block_size=(rows, cols)");
      bn = 2 * I / s13.size(1);
      bk = H / s13.size(2);
    }
    if (s13.size(1) != (2 * I + bn - 1) / bn || s13.size(2) != (H + bk - 1) / bk || s2.size(1) != (H + bn - 1) / bn ||
        s2.size(2) != (I + bk - 1) / bk)
      throw py::value_error("scale shapes " + shape_str(s13) + " / " + shape_str(s2) + " do not match block size " +
                            std::to_string(bn) + "x" + std::to_string(bk) + " for w13 [E, 2I, H] = " + shape_str(w13));
    lk::WeightSource src;
    src.type = lk::DType::kFP8E4M3;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    src.s13 = s13.data_ptr<float>();
    src.s2 = s2.data_ptr<float>();
    src.bn = int(bn);
    src.bk = int(bk);
    return build(std::move(pool), src, E, I, H);
  }

  // fp8_channel / int8_channel: compressed-tensors channel quantization (vLLM CT W8A8 int8, CT FP8
  // channel): w13_weight / w2_weight fp8 or int8, w13_weight_scale [E, 2I, 1], w2_weight_scale [E, H, 1].
  static Layer per_channel(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                           const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                           const std::string& format) {
    require_silu(activation);
    const bool int8 = format == "int8_channel";
    const auto [E, I, H] =
        check_byte_weights(w13, w2, s13, s2, int8 ? at::kChar : at::kFloat8_e4m3fn,
                           std::string(int8 ? "int8" : "float8_e4m3fn") + " for " + format, "w13_weight_scale",
                           "w2_weight_scale");
    auto rows_ok = [](const at::Tensor& t, int64_t e, int64_t r) {
      return (t.dim() == 3 && t.size(0) == e && t.size(1) == r && t.size(2) == 1) ||
             (t.dim() == 2 && t.size(0) == e && t.size(1) == r);
    };
    if (!rows_ok(s13, E, 2 * I)) throw py::value_error("w13_weight_scale must be [E, 2I, 1], got " + shape_str(s13));
    if (!rows_ok(s2, E, H)) throw py::value_error("w2_weight_scale must be [E, H, 1], got " + shape_str(s2));
    lk::WeightSource src;
    src.type = int8 ? lk::DType::kINT8 : lk::DType::kFP8E4M3;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    src.s13 = s13.data_ptr<float>();
    src.s2 = s2.data_ptr<float>();
    return build(std::move(pool), src, E, I, H);
  }

  // wna16_int4: compressed-tensors WNA16 int4 experts as vLLM holds them after loading (K-first,
  // see lk::WeightSource): w13_weight_packed int32 [E, H/8, 2I], w2_weight_packed int32 [E, I/8, H],
  // w13_weight_scale [E, H/gs, 2I], w2_weight_scale [E, I/gs, H] (bf16/fp16), optional zero points
  // int32 [E, H/gs, ceil(2I/8)] and [E, I/gs, ceil(H/8)] (None, None: symmetric).
  static Layer wna16_int4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                          const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> z13,
                          std::optional<at::Tensor> z2, const std::string& activation) {
    require_silu(activation);
    for (auto [t, name] : {std::pair{&w13, "w13_weight_packed"}, std::pair{&w2, "w2_weight_packed"}})
      if (t->scalar_type() != at::kInt)
        throw py::type_error(std::string(name) + " must be int32 (8 int4 codes per element), got " + dtype_name(*t));
    const DType st = half_type(s13, "w13_weight_scale");
    if (half_type(s2, "w2_weight_scale") != st)
      throw py::type_error("w13_weight_scale and w2_weight_scale must have the same dtype, got " + dtype_name(s13) +
                           " and " + dtype_name(s2));
    if (z13.has_value() != z2.has_value())
      throw py::value_error(std::string("asymmetric int4 needs both zero points; ") +
                            (z13 ? "w2_weight_zero_point" : "w13_weight_zero_point") + " is missing");
    if (w13.dim() != 3 || w13.size(0) < 1 || w13.size(1) < 1 || w13.size(2) < 2 || w13.size(2) % 2)
      throw py::value_error("w13_weight_packed must be [E, H/8, 2*I] (K-first, as vLLM holds it after loading), got " +
                            shape_str(w13));
    const int64_t E = w13.size(0), H = w13.size(1) * 8, I = w13.size(2) / 2;
    if (E > (1 << 20) || H > (1 << 20) || I > (1 << 20))
      throw py::value_error("expert dimensions are implausibly large: w13_weight_packed " + shape_str(w13));
    if (I % 8)
      throw py::value_error("w13_weight_packed " + shape_str(w13) + " gives I = " + std::to_string(I) +
                            ", which int4 packing along I (w2_weight_packed [E, I/8, H]) cannot hold");
    auto dims = [](std::initializer_list<int64_t> v) {
      std::string r = "[";
      for (int64_t x : v) r += (r.size() > 1 ? ", " : "") + std::to_string(x);
      return r + "]";
    };
    require_shape(w2, "w2_weight_packed", {E, I / 8, H}, ("[E, I/8, H] = " + dims({E, I / 8, H})).c_str());
    if (s13.dim() != 3 || s13.size(0) != E || s13.size(2) != 2 * I || s13.size(1) < 1 || H % s13.size(1))
      throw py::value_error("w13_weight_scale must be [E, H/group_size, 2*I] = [" + std::to_string(E) +
                            ", H/gs, " + std::to_string(2 * I) + "] with H = " + std::to_string(H) + ", got " +
                            shape_str(s13));
    if (s2.dim() != 3 || s2.size(0) != E || s2.size(2) != H || s2.size(1) < 1 || I % s2.size(1))
      throw py::value_error("w2_weight_scale must be [E, I/group_size, H] = [" + std::to_string(E) + ", I/gs, " +
                            std::to_string(H) + "] with I = " + std::to_string(I) + ", got " + shape_str(s2));
    const int64_t G1 = s13.size(1), G2 = s2.size(1);
    if (z13) {
      const char* n13 = "w13_weight_zero_point";
      const char* n2 = "w2_weight_zero_point";
      for (auto [t, name] : {std::pair{&*z13, n13}, std::pair{&*z2, n2}})
        if (t->scalar_type() != at::kInt)
          throw py::type_error(std::string(name) + " must be int32 (8 packed int4 zero points), got " + dtype_name(*t));
      require_shape(*z13, n13, {E, G1, (2 * I + 7) / 8}, ("[E, H/gs, 2I/8] = " + dims({E, G1, (2 * I + 7) / 8})).c_str());
      require_shape(*z2, n2, {E, G2, (H + 7) / 8}, ("[E, I/gs, H/8] = " + dims({E, G2, (H + 7) / 8})).c_str());
      require_cpu_contiguous(*z13, n13);
      require_cpu_contiguous(*z2, n2);
    }
    for (auto [t, name] : {std::pair{&w13, "w13_weight_packed"}, std::pair{&w2, "w2_weight_packed"},
                           std::pair{&s13, "w13_weight_scale"}, std::pair{&s2, "w2_weight_scale"}})
      require_cpu_contiguous(*t, name);
    lk::WeightSource src;
    src.type = lk::DType::kINT4;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    src.q13s = static_cast<const uint16_t*>(s13.data_ptr());
    src.q2s = static_cast<const uint16_t*>(s2.data_ptr());
    src.z13 = z13 ? z13->data_ptr<int32_t>() : nullptr;
    src.z2 = z2 ? z2->data_ptr<int32_t>() : nullptr;
    src.gs1 = int(H / G1);
    src.gs2 = int(I / G2);
    src.fp16_scale = st == DType::kFP16;
    return build(std::move(pool), src, E, I, H);
  }

  // mxfp4: OCP MX FP4 experts as vLLM's GptOssMxfp4MoEMethod / Mxfp4MoEMethod hold them after loading
  // (see lk::WeightSource): w13_weight uint8 [E, 2I', H'/2], w13_weight_scale uint8 [E, 2I', H'/32],
  // w2_weight uint8 [E, H', I'/2], w2_weight_scale uint8 [E, H', I'/32], optional w13_bias bf16 [E, 2I']
  // and w2_bias bf16 [E, H']. H' >= H and I' >= I may be padded (vLLM rounds them up for its kernels);
  // hidden_size / intermediate_size (<= 0: H', I') give the real sizes, and only those are read.
  static Layer mxfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> b13,
                     std::optional<at::Tensor> b2, const std::string& activation, int64_t hidden_size,
                     int64_t intermediate_size, bool interleaved, double alpha, double limit) {
    lk::Activation act;
    if (activation == "silu") act = lk::Activation::kSiLU;
    else if (activation == "swigluoai") act = lk::Activation::kSwigluOAI;
    else throw py::value_error("activation '" + activation + "' is not supported for mxfp4 (supported: swigluoai, silu)");
    for (auto [t, name] : {std::pair{&w13, "w13_weight"}, std::pair{&w2, "w2_weight"}})
      if (t->scalar_type() != at::kByte)
        throw py::type_error(std::string(name) + " must be uint8 (two e2m1 codes per byte), got " + dtype_name(*t));
    for (auto [t, name] : {std::pair{&s13, "w13_weight_scale"}, std::pair{&s2, "w2_weight_scale"}})
      if (t->scalar_type() != at::kByte)
        throw py::type_error(std::string(name) + " must be uint8 (e8m0 exponents), got " + dtype_name(*t));
    if (w13.dim() != 3 || w13.size(0) < 1 || w13.size(1) < 2 || w13.size(1) % 2 || w13.size(2) < 1)
      throw py::value_error("w13_weight must be [E, 2*I, H/2] (uint8, two e2m1 codes per byte), got " + shape_str(w13));
    const int64_t E = w13.size(0), R13 = w13.size(1), C13 = w13.size(2);
    if (w2.dim() != 3 || w2.size(0) != E || w2.size(1) < 1 || w2.size(2) < 1)
      throw py::value_error("w2_weight must be [E, H, I/2] with E = " + std::to_string(E) + ", got " + shape_str(w2));
    const int64_t R2 = w2.size(1), C2 = w2.size(2);
    if (hidden_size < 0 || intermediate_size < 0)
      throw py::value_error("hidden_size / intermediate_size must be >= 1 (0: the tensors' sizes), got " +
                            std::to_string(hidden_size) + " / " + std::to_string(intermediate_size));
    // vLLM pads H and I alike in both tensors: a w2 that disagrees with w13 is named here (its scales'
    // check would otherwise take w2's dims as the truth and blame w2_weight_scale).
    if ((R2 + 1) / 2 != C13 || (R13 / 2 + 1) / 2 != C2)
      throw py::value_error("w2_weight must be [E, H, I/2] = [" + std::to_string(E) + ", " + std::to_string(2 * C13) +
                            ", " + std::to_string((R13 / 2 + 1) / 2) + "] to match w13_weight " + shape_str(w13) +
                            ", got " + shape_str(w2));
    const int64_t H = hidden_size > 0 ? hidden_size : R2;
    const int64_t I = intermediate_size > 0 ? intermediate_size : R13 / 2;
    if (E > (1 << 20) || R13 > (1 << 21) || R2 > (1 << 20) || C13 > (1 << 20) || C2 > (1 << 20))
      throw py::value_error("expert dimensions are implausibly large: w13_weight " + shape_str(w13));
    if (H > R2 || H > 2 * C13)
      throw py::value_error("hidden_size " + std::to_string(H) + " does not fit w13_weight " + shape_str(w13) +
                            " / w2_weight " + shape_str(w2) + " (need H <= 2 * w13_weight.shape[2] and H <= w2_weight.shape[1])");
    if (2 * I > R13 || I > 2 * C2)
      throw py::value_error("intermediate_size " + std::to_string(I) + " does not fit w13_weight " + shape_str(w13) +
                            " / w2_weight " + shape_str(w2) + " (need 2 * I <= w13_weight.shape[1] and I <= 2 * w2_weight.shape[2])");
    auto dims = [](std::initializer_list<int64_t> v) {
      std::string r = "[";
      for (int64_t x : v) r += (r.size() > 1 ? ", " : "") + std::to_string(x);
      return r + "]";
    };
    // One scale per 32 inputs: [.., ceil(K'/32)] (vLLM: K'/32 with K' a multiple of 32); enough for the real K.
    auto check_scale = [&](const at::Tensor& t, const char* name, int64_t rows, int64_t cols, int64_t k, const char* what) {
      const int64_t g = (2 * cols + 31) / 32;
      if (t.dim() != 3 || t.size(0) != E || t.size(1) != rows || t.size(2) > g || t.size(2) * 32 < k)
        throw py::value_error(std::string(name) + " must have shape " + what + " = " + dims({E, rows, g}) + ", got " +
                              shape_str(t));
      return t.size(2);
    };
    const int64_t G13 = check_scale(s13, "w13_weight_scale", R13, C13, H, "[E, 2I, H/32]");
    const int64_t G2 = check_scale(s2, "w2_weight_scale", R2, C2, I, "[E, H, I/32]");
    if (b13.has_value() != b2.has_value())
      throw py::value_error(std::string("mxfp4 biases come in pairs; ") + (b13 ? "w2_bias" : "w13_bias") + " is missing");
    if (b13) {
      for (auto [t, name] : {std::pair{&*b13, "w13_bias"}, std::pair{&*b2, "w2_bias"}})
        if (t->scalar_type() != at::kBFloat16) throw py::type_error(std::string(name) + " must be bfloat16, got " + dtype_name(*t));
      require_shape(*b13, "w13_bias", {E, R13}, ("[E, 2I] = " + dims({E, R13})).c_str());
      require_shape(*b2, "w2_bias", {E, R2}, ("[E, H] = " + dims({E, R2})).c_str());
      require_cpu_contiguous(*b13, "w13_bias");
      require_cpu_contiguous(*b2, "w2_bias");
    }
    for (auto [t, name] : {std::pair{&w13, "w13_weight"}, std::pair{&w2, "w2_weight"},
                           std::pair{&s13, "w13_weight_scale"}, std::pair{&s2, "w2_weight_scale"}})
      require_cpu_contiguous(*t, name);
    if (!(alpha == alpha) || !(limit > 0)) throw py::value_error("swiglu_alpha must be a number and swiglu_limit > 0");
    lk::WeightSource src;
    src.type = lk::DType::kMXFP4;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    src.e13 = s13.data_ptr<uint8_t>();
    src.e2 = s2.data_ptr<uint8_t>();
    src.b13 = b13 ? static_cast<const uint16_t*>(b13->data_ptr()) : nullptr;
    src.b2 = b2 ? static_cast<const uint16_t*>(b2->data_ptr()) : nullptr;
    src.r13 = int(R13);
    src.c13 = int(C13);
    src.cs13 = int(G13);
    src.r2 = int(R2);
    src.c2 = int(C2);
    src.cs2 = int(G2);
    src.interleaved = interleaved;
    src.alpha = float(alpha);
    src.limit = float(limit);
    return build(std::move(pool), src, E, I, H, act);
  }

  // nvfp4: ModelOpt NVFP4 experts as vLLM's ModelOptNvFp4FusedMoE holds them after loading (see
  // lk::WeightSource): w13_weight uint8 [E, 2I, H/2], w2_weight uint8 [E, H, I/2], w13_weight_scale /
  // w2_weight_scale float8_e4m3fn [E, 2I, H/16] / [E, H, I/16], w13_weight_scale_2 float32 [E, 2] (gate, up),
  // w2_weight_scale_2 float32 [E]; optional w13_input_scale float32 [E', 2] / w2_input_scale [E'] (E' >= E),
  // checked and ignored (W4A16 compute). Every problem is a ValueError naming the tensor.
  static Layer nvfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                     const at::Tensor& s13, const at::Tensor& s2, const at::Tensor& g13, const at::Tensor& g2,
                     std::optional<at::Tensor> a13, std::optional<at::Tensor> a2, const std::string& activation) {
    if (activation != "silu")
      throw py::value_error("activation '" + activation + "' is not supported for nvfp4 (supported: silu)");
    auto need_dtype = [](const at::Tensor& t, const char* name, at::ScalarType want, const char* what) {
      if (t.scalar_type() != want)
        throw py::value_error(std::string(name) + " must be " + what + ", got " + dtype_name(t));
    };
    auto dims = [](std::initializer_list<int64_t> v) {
      std::string r = "[";
      for (int64_t x : v) r += (r.size() > 1 ? ", " : "") + std::to_string(x);
      return r + "]";
    };
    need_dtype(w13, "w13_weight", at::kByte, "uint8 (two e2m1 codes per byte)");
    need_dtype(w2, "w2_weight", at::kByte, "uint8 (two e2m1 codes per byte)");
    need_dtype(s13, "w13_weight_scale", at::kFloat8_e4m3fn, "float8_e4m3fn (one scale per 16 inputs)");
    need_dtype(s2, "w2_weight_scale", at::kFloat8_e4m3fn, "float8_e4m3fn (one scale per 16 inputs)");
    need_dtype(g13, "w13_weight_scale_2", at::kFloat, "float32 (per-expert global scales)");
    need_dtype(g2, "w2_weight_scale_2", at::kFloat, "float32 (per-expert global scales)");
    if (w13.dim() != 3 || w13.size(0) < 1 || w13.size(1) < 2 || w13.size(1) % 2 || w13.size(2) < 1)
      throw py::value_error("w13_weight must be [E, 2*I, H/2] (uint8, two e2m1 codes per byte), got " + shape_str(w13));
    const int64_t E = w13.size(0), I = w13.size(1) / 2, H = w13.size(2) * 2;
    if (E > (1 << 20) || I > (1 << 20) || H > (1 << 20))
      throw py::value_error("expert dimensions are implausibly large: w13_weight " + shape_str(w13));
    if (H % 16)
      throw py::value_error("w13_weight " + shape_str(w13) + " gives H = " + std::to_string(H) +
                            ", not a multiple of the NVFP4 group size 16");
    if (I % 16)
      throw py::value_error("w13_weight " + shape_str(w13) + " gives I = " + std::to_string(I) +
                            ", not a multiple of the NVFP4 group size 16");
    require_shape(w2, "w2_weight", {E, H, I / 2}, ("[E, H, I/2] = " + dims({E, H, I / 2})).c_str());
    require_shape(s13, "w13_weight_scale", {E, 2 * I, H / 16}, ("[E, 2I, H/16] = " + dims({E, 2 * I, H / 16})).c_str());
    require_shape(s2, "w2_weight_scale", {E, H, I / 16}, ("[E, H, I/16] = " + dims({E, H, I / 16})).c_str());
    if (g13.dim() == 2 && g13.size(0) == E && g13.size(1) == 1)
      throw py::value_error("w13_weight_scale_2 is [E, 1]: non-gated experts (one w13 shard) are not supported");
    require_shape(g13, "w13_weight_scale_2",
                  {E, 2}, ("[E, 2] = " + dims({E, 2}) + " (gate, up; as loaded, before vLLM's "
                           "process_weights_after_loading keeps one)").c_str());
    require_shape(g2, "w2_weight_scale_2", {E}, ("[E] = " + dims({E})).c_str());
    if (a13.has_value() != a2.has_value())
      throw py::value_error(std::string("nvfp4 input scales come in pairs; ") +
                            (a13 ? "w2_input_scale" : "w13_input_scale") + " is missing");
    if (a13) {
      need_dtype(*a13, "w13_input_scale", at::kFloat, "float32");
      need_dtype(*a2, "w2_input_scale", at::kFloat, "float32");
      if (a13->dim() != 2 || a13->size(0) < E || a13->size(1) != 2)
        throw py::value_error("w13_input_scale must be [E', 2] with E' >= E = " + std::to_string(E) + ", got " +
                              shape_str(*a13));
      if (a2->dim() != 1 || a2->size(0) < E)
        throw py::value_error("w2_input_scale must be [E'] with E' >= E = " + std::to_string(E) + ", got " +
                              shape_str(*a2));
    }
    for (auto [t, name] : {std::pair{&w13, "w13_weight"}, std::pair{&w2, "w2_weight"},
                           std::pair{&s13, "w13_weight_scale"}, std::pair{&s2, "w2_weight_scale"},
                           std::pair{&g13, "w13_weight_scale_2"}, std::pair{&g2, "w2_weight_scale_2"}})
      require_cpu_contiguous(*t, name);
    lk::WeightSource src;
    src.type = lk::DType::kNVFP4;
    src.w13 = w13.data_ptr();
    src.w2 = w2.data_ptr();
    src.e13 = static_cast<const uint8_t*>(s13.data_ptr());
    src.e2 = static_cast<const uint8_t*>(s2.data_ptr());
    src.r13 = int(2 * I);
    src.c13 = int(H / 2);
    src.cs13 = int(H / 16);
    src.r2 = int(H);
    src.c2 = int(I / 2);
    src.cs2 = int(I / 16);
    src.interleaved = false;
    src.g13 = g13.data_ptr<float>();
    src.g2 = g2.data_ptr<float>();
    return build(std::move(pool), src, E, I, H);
  }

  // fp4 layers: the weights the engine computes with, decoded from its packed blocks to fp32
  // ([E, 2I, H] rows [gate; up], [E, H, I]): e2m1 x block scale (x global scale for nvfp4, one fp32
  // rounding of the exact product; mxfp4 biases are not included).
  py::tuple dequantized() const {
    const auto& sh = impl->shape();
    if (!sh.fp4) throw py::value_error("dequantized() is available for mxfp4 / nvfp4 layers");
    const int E = sh.experts, I = sh.intermediate, H = sh.hidden, grp = sh.nv ? 16 : 32;
    at::Tensor w13 = at::zeros({E, 2 * I, H}, at::kFloat), w2 = at::zeros({E, H, I}, at::kFloat);
    static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    auto scale_of = [&](uint8_t s) -> double {
      if (sh.nv) {  // fp8 e4m3fn
        const int mag = s & 0x7F, e = mag >> 3, m = mag & 7;
        if (mag == 0x7F) return NAN;
        const double v = e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp(double(m), -9);
        return s & 0x80 ? -v : v;
      }
      return s == 255 ? NAN : std::ldexp(1.0, int(s) - 127);
    };
    // One packed block (16 rows x kp inputs) -> rows of `out` (row n of the block -> out + n * ld).
    auto decode = [&](const uint8_t* codes, const uint8_t* sc, int kp, int k, int rows_valid, double gs, float* out,
                      int64_t ld) {
      for (int n = 0; n < rows_valid; ++n)
        for (int kk = 0; kk < k; ++kk) {
          const int q = kk / 4, j = kk % 4;  // quad q: byte 2n + (j & 1), low nibble for j < 2
          const uint8_t byte = codes[size_t(q) * 32 + 2 * n + (j & 1)];
          const int code = j < 2 ? byte & 15 : byte >> 4;
          const double v = (code & 8 ? -kMag[code & 7] : kMag[code & 7]) * scale_of(sc[(kk / grp) * 16 + n]);
          out[n * ld + kk] = float(v * gs);  // v has <= 6 significant bits: v * gs is exact in double
        }
    };
    float* p13 = w13.data_ptr<float>();
    float* p2 = w2.data_ptr<float>();
    const size_t bb1 = size_t(sh.kp1) * lk::kBlockN / 2, bb2 = size_t(sh.kp2) * lk::kBlockN / 2;
    const size_t sb1 = size_t(sh.kp1 / grp) * lk::kBlockN, sb2 = size_t(sh.kp2 / grp) * lk::kBlockN;
    for (const auto& sl : impl->slices()) {
      const int nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
      for (int e = 0; e < E; ++e) {
        for (int lb = 0; lb < nbi; ++lb)
          for (int h = 0; h < 2; ++h) {
            const size_t b = (size_t(e) * nbi + lb) * 2 + h;
            const int r0 = (sl.ib0 + lb) * lk::kBlockN;
            if (r0 >= I) continue;
            const double gs = sh.nv ? impl->global_scales13()[2 * size_t(e) + h] : 1.0;
            decode(sl.w13.as<uint8_t>() + b * bb1, sl.s13.as<uint8_t>() + b * sb1, sh.kp1, H,
                   std::min(lk::kBlockN, I - r0), gs, p13 + (size_t(e) * 2 * I + size_t(h) * I + r0) * H, H);
          }
        for (int lb = 0; lb < nbh; ++lb) {
          const size_t b = size_t(e) * nbh + lb;
          const int r0 = (sl.hb0 + lb) * lk::kBlockN;
          const double gs = sh.nv ? impl->global_scales2()[e] : 1.0;
          decode(sl.w2.as<uint8_t>() + b * bb2, sl.s2.as<uint8_t>() + b * sb2, sh.kp2, I,
                 std::min(lk::kBlockN, H - r0), gs, p2 + (size_t(e) * H + r0) * I, I);
        }
      }
    }
    return py::make_tuple(w13, w2);
  }

  Layer() = default;

  Handle submit(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights, const at::Tensor& out) {
    const auto& sh = impl->shape();
    const DType xt = half_type(x, "x");
    if (x.dim() != 2 || x.size(1) != sh.hidden)
      throw py::value_error("x must have shape [M, H] with H = " + std::to_string(sh.hidden) + ", got " + shape_str(x));
    const int64_t M = x.size(0);
    if (ids.scalar_type() != at::kInt) throw py::type_error("topk_ids must be int32, got " + dtype_name(ids));
    if (ids.dim() != 2 || ids.size(0) != M || ids.size(1) < 1 || ids.size(1) > 64)
      throw py::value_error("topk_ids must have shape [M, K] with M = " + std::to_string(M) + " and 1 <= K <= 64, got " +
                            shape_str(ids));
    const int64_t K = ids.size(1);
    if (weights.scalar_type() != at::kFloat) throw py::type_error("topk_weights must be float32, got " + dtype_name(weights));
    const std::string wshape = "[M, K] = [" + std::to_string(M) + ", " + std::to_string(K) + "]";
    require_shape(weights, "topk_weights", {M, K}, wshape.c_str());
    if (out.scalar_type() != x.scalar_type())
      throw py::type_error("out must have x's dtype " + dtype_name(x) + ", got " + dtype_name(out));
    const std::string oshape = "[M, H] = [" + std::to_string(M) + ", " + std::to_string(sh.hidden) + "]";
    require_shape(out, "out", {M, int64_t(sh.hidden)}, oshape.c_str());
    require_cpu_contiguous(x, "x");
    require_cpu_contiguous(ids, "topk_ids");
    require_cpu_contiguous(weights, "topk_weights");
    require_cpu_contiguous(out, "out");
    impl->check_ids(ids.data_ptr<int32_t>(), M * K);

    Handle h;
    h.layer = impl;
    h.x = x;
    h.ids = ids;
    h.weights = weights;
    h.out = out;
    if (M == 0) return h;
    lk::ForwardArgs a;
    a.x = x.data_ptr();
    a.x_type = xt;
    a.tokens = M;
    a.top_k = int(K);
    a.ids = ids.data_ptr<int32_t>();
    a.weights = weights.data_ptr<float>();
    a.out = out.data_ptr();
    a.out_type = xt;
    {
      py::gil_scoped_release nogil;  // may wait for this layer's previous forward
      h.seq = impl->submit(a);
    }
    h.pending = true;
    return h;
  }
};

// A HostForward plus the pinned tensors it reads and writes (kept alive with it).
struct HostCall {
  std::unique_ptr<lk::HostForward> impl;
  at::Tensor x, ids, weights, out;

  HostCall(const Layer& layer, const at::Tensor& x_h, const at::Tensor& ids_h, const at::Tensor& w_h,
           const at::Tensor& out_h, int64_t tokens, std::shared_ptr<lk::HostCallCounters> counters) {
    const auto& sh = layer.impl->shape();
    const DType xt = half_type(x_h, "x_host");
    if (out_h.scalar_type() != x_h.scalar_type()) throw py::type_error("out_host must have x_host's dtype");
    if (ids_h.scalar_type() != at::kInt) throw py::type_error("ids_host must be int32");
    if (w_h.scalar_type() != at::kFloat) throw py::type_error("weights_host must be float32");
    for (auto* t : {&x_h, &ids_h, &w_h, &out_h}) {
      if (!t->device().is_cpu() || !t->is_contiguous() || !t->is_pinned())
        throw py::value_error("host buffers must be contiguous pinned CPU tensors");
    }
    if (x_h.dim() != 2 || x_h.size(1) != sh.hidden || out_h.dim() != 2 || out_h.size(1) != sh.hidden)
      throw py::value_error("x_host/out_host must be [max_tokens, H]");
    if (ids_h.dim() != 2 || w_h.sizes() != ids_h.sizes() || ids_h.size(0) != x_h.size(0))
      throw py::value_error("ids_host/weights_host must be [max_tokens, K]");
    if (tokens < 1 || tokens > x_h.size(0)) throw py::value_error("tokens must be in 1..max_tokens");
    if (ids_h.size(1) < 1 || ids_h.size(1) > 64)
      throw py::value_error("ids_host must be [max_tokens, K] with 1 <= K <= 64, got " + shape_str(ids_h));
    lk::ForwardArgs a;
    a.x = x_h.data_ptr();
    a.x_type = xt;
    a.tokens = tokens;
    a.top_k = int(ids_h.size(1));
    a.ids = ids_h.data_ptr<int32_t>();
    a.weights = w_h.data_ptr<float>();
    a.out = out_h.data_ptr();
    a.out_type = xt;
    impl = std::make_unique<lk::HostForward>(layer.impl, a, std::move(counters));
    x = x_h;
    ids = ids_h;
    weights = w_h;
    out = out_h;
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lk_moe CPU engine";
  m.def("isa", [] { return std::string(lk::active_kernels()->name); }, "ISA tier in use");
  m.def("best_isa", &lk::best_isa);
  m.def("supported_isas", &lk::supported_isas);
  m.def("all_isas", &lk::all_isas);
  m.def("set_isa", [](const std::string& name) {
    try {
      lk::set_isa(name);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("cpu_brand", [] { return lk::cpu_features().brand; });
  m.def("alloc_count", &lk::alloc_count, "host buffers allocated so far by the engine");
  m.def("live_bytes", &lk::live_bytes, "host bytes held by the engine now");
  m.def("parse_cpu_list", &lk::parse_cpu_list);
  m.def("allowed_cpus", &lk::allowed_cpus);
  m.def(
      "read_topology",
      [](const std::string& root, std::vector<int> allowed) {
        if (allowed.empty()) allowed = lk::allowed_cpus();
        lk::Topology t = lk::read_topology(root, allowed);
        py::list nodes;
        for (const auto& n : t.nodes) {
          py::dict d;
          d["id"] = n.id;
          d["cores"] = n.cores;
          nodes.append(d);
        }
        py::dict out;
        out["nodes"] = nodes;
        out["numa_from_sysfs"] = t.numa_from_sysfs;
        out["physical_cores"] = t.physical_cores();
        out["logical_cpus"] = t.logical_cpus();
        return out;
      },
      py::arg("root") = "/sys", py::arg("allowed") = std::vector<int>{});

  py::class_<lk::ThreadPool, std::shared_ptr<lk::ThreadPool>>(m, "ThreadPool")
      .def(py::init([](int threads, const std::string& binding, int spin_us, const std::string& sysfs_root,
                       std::vector<int> allowed) {
             if (threads < 0 || threads > 4096) throw py::value_error("threads must be in 0..4096 (0 = physical cores)");
             if (spin_us < 0 || spin_us > 1000000) throw py::value_error("spin_us must be in 0..1000000");
             lk::PoolConfig c;
             c.threads = threads;
             c.binding = parse_binding(binding);
             c.spin_us = spin_us;
             c.sysfs_root = sysfs_root;
             c.allowed = std::move(allowed);
             return std::make_shared<lk::ThreadPool>(c);
           }),
           py::arg("threads") = 0, py::arg("binding") = "CPU_CORE", py::arg("spin_us") = 1000,
           py::arg("sysfs_root") = "/sys", py::arg("allowed") = std::vector<int>{})
      .def_property_readonly("num_threads", &lk::ThreadPool::num_threads)
      .def_property_readonly("num_nodes", &lk::ThreadPool::num_nodes)
      .def_property_readonly("numa_placement", &lk::ThreadPool::numa_placement)
      .def_property_readonly("spin_us", &lk::ThreadPool::spin_us)
      .def_property_readonly("jobs_run", &lk::ThreadPool::jobs_run)
      .def_property_readonly("futex_wakes", &lk::ThreadPool::futex_wakes)
      .def("wake", &lk::ThreadPool::wake, "bring parked workers back to spinning (a job is coming)")
      .def("node_id", &lk::ThreadPool::node_id)
      .def("threads_on_node", &lk::ThreadPool::threads_on_node)
      .def("cpus_of_thread", &lk::ThreadPool::cpus_of_thread)
      .def(
          "round_trip_us",
          [](lk::ThreadPool& p, int iters, int idle_us, int prewake_us) {
            if (iters < 1 || idle_us < 0) throw py::value_error("need iters >= 1 and idle_us >= 0");
            py::gil_scoped_release nogil;
            return p.round_trip_us(iters, idle_us, prewake_us);
          },
          py::arg("iters") = 50, py::arg("idle_us") = 0, py::arg("prewake_us") = -1,
          "submit-to-done time of an empty job (us); idle_us > spin_us measures wake-up from parked")
      .def(
          "measure_read_bandwidth",
          [](lk::ThreadPool& p, size_t bytes, int iters) {
            if (bytes < (size_t(1) << 20) || iters < 1) throw py::value_error("need bytes >= 1 MiB and iters >= 1");
            py::gil_scoped_release nogil;
            return lk::measure_read_bandwidth(p, bytes, iters);
          },
          py::arg("bytes"), py::arg("iters") = 5);

  m.def("cuda_runtime_available", [] {
    std::string why;
    bool ok = lk::cuda_runtime_available(&why);
    return py::make_tuple(ok, why);
  });
  // lk::DecodeWide by value, in its order
  static const std::array<std::string, 4> kDecodeWideNames = {"int8_act", "4bit", "quantized", "all"};
  m.def(
      "_set_decode_units",
      [](const std::string& wide, int units_per_thread) {
        const auto it = std::find(kDecodeWideNames.begin(), kDecodeWideNames.end(), wide);
        if (it == kDecodeWideNames.end())
          throw py::value_error("wide: int8_act, 4bit, quantized or all, not '" + wide + "'");
        lk::set_decode_units({lk::DecodeWide(it - kDecodeWideNames.begin()), units_per_thread});
      },
      py::arg("wide"), py::arg("units_per_thread"),
      "benchmark hook: which decode chunks start with wide work units, and the units per thread kept for "
      "balance (results are bit-identical under every setting)");
  m.def("_decode_units", [] {
    const lk::DecodeUnits u = lk::decode_units();
    return py::make_tuple(kDecodeWideNames[int(u.wide)], u.units_per_thread);
  });
  m.def(
      "_set_decode_schedule",
      [](const std::string& name) {
        if (name != "units" && name != "guided") throw py::value_error("schedule: units or guided, not '" + name + "'");
        lk::set_decode_schedule(name == "guided" ? lk::DecodeSchedule::kGuided : lk::DecodeSchedule::kUnits);
      },
      py::arg("name"),
      "benchmark hook: how decode chunks hand out their work, fixed units ('units') or guided "
      "self-scheduling ('guided'); results are bit-identical under both");
  m.def("_decode_schedule",
        [] { return std::string(lk::decode_schedule() == lk::DecodeSchedule::kGuided ? "guided" : "units"); });
  m.def(
      "_set_fp4_decode_acts",
      [](const std::string& name) {
        if (name != "q15" && name != "bf16") throw py::value_error("fp4 decode acts: q15 or bf16, not '" + name + "'");
        lk::set_fp4_decode_acts(name == "q15" ? lk::Fp4DecodeActs::kQ15 : lk::Fp4DecodeActs::kBf16);
      },
      py::arg("name"),
      "benchmark hook: the activations of mxfp4/nvfp4 decode chunks, 15-bit integer rows ('q15', the "
      "default) or bf16 ('bf16', the vdpbf16ps tile)");
  m.def("_fp4_decode_acts",
        [] { return std::string(lk::fp4_decode_acts() == lk::Fp4DecodeActs::kQ15 ? "q15" : "bf16"); });
  m.def(
      "_set_decode_prefetch", [](int bytes) { lk::set_decode_prefetch(bytes); }, py::arg("bytes"),
      "benchmark hook: how far ahead (bytes, 0 = off) the quantized decode tiles prefetch each weight "
      "stream into L2 (results are bit-identical under every setting)");
  m.def("_decode_prefetch", &lk::decode_prefetch);
  m.def("_set_chunk_tokens", &lk::set_chunk_tokens, py::arg("tokens"),
        "test hook: cap the tokens of an activation chunk (0, the default: from the scratch budget) so "
        "small forwards take the multi-chunk path");
  m.def("_chunk_tokens", &lk::chunk_tokens);
  m.def("_kernel_poller_pause", &lk::kernel_poller_pause, py::arg("paused"),
        "test hook: while paused, the kernel signal's poller answers nothing (the GPU side times out)");
  py::class_<lk::HostCallCounters, std::shared_ptr<lk::HostCallCounters>>(
      m, "HostCallCounters", "running totals of the host-node runs of the HostCalls given this object")
      .def(py::init<>())
      .def("read", [](const lk::HostCallCounters& c) {
        // Three relaxed loads: a run finishing in between may show in one total and not yet in another.
        return py::make_tuple(c.calls.load(std::memory_order_relaxed), c.rows.load(std::memory_order_relaxed),
                              c.ns.load(std::memory_order_relaxed));
      }, "(calls, rows with an expert id, nanoseconds)");
  py::class_<HostCall>(m, "HostCall")
      .def(py::init<const Layer&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                    std::shared_ptr<lk::HostCallCounters>>(),
           py::arg("layer"), py::arg("x_host"), py::arg("ids_host"), py::arg("weights_host"), py::arg("out_host"),
           py::arg("tokens"), py::arg("counters") = py::none())
      .def("enqueue", [](HostCall& h, uintptr_t stream) { h.impl->enqueue(stream); }, py::arg("stream"),
           "add the engine call to a CUDA stream (host-function node when capturing)")
      .def("enqueue_mailbox", [](HostCall& h, uintptr_t stream) { h.impl->enqueue_mailbox(stream); },
           py::arg("stream"), "the same through a mapped-memory mailbox (stream memory operations)")
      .def("kernel_args", [](HostCall& h) {
        const auto k = h.impl->kernel_args();
        return py::make_tuple(k.req, k.done, k.timeouts, k.call_id, k.x, k.ids, k.weights, k.out);
      }, "device addresses for the single-kernel signal (lk_cpu_call_kernel in lk_moe/_lk_cuda.so): "
         "(req, done, timeouts, call_id, x, ids, weights, out); registers the call with the kernel poller")
      .def("take_errors", [](HostCall& h) { return h.impl->take_errors(); })
      .def_property_readonly("last_host_us", [](const HostCall& h) { return h.impl->last_host_us(); });

  py::class_<Handle>(m, "Handle").def("wait", &Handle::wait).def("done", &Handle::done);

  py::class_<Layer>(m, "Layer")
      .def(py::init<std::shared_ptr<lk::ThreadPool>, const at::Tensor&, const at::Tensor&, const std::string&>(),
           py::arg("pool"), py::arg("w13"), py::arg("w2"), py::arg("activation") = "silu")
      .def_static("fp8_block", &Layer::fp8_block, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale_inv"), py::arg("w2_weight_scale_inv"), py::arg("activation") = "silu",
                  py::arg("block_n") = 0, py::arg("block_k") = 0)
      .def_static("per_channel", &Layer::per_channel, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("activation"), py::arg("format"))
      .def_static("wna16_int4", &Layer::wna16_int4, py::arg("pool"), py::arg("w13_weight_packed"),
                  py::arg("w2_weight_packed"), py::arg("w13_weight_scale"), py::arg("w2_weight_scale"),
                  py::arg("w13_weight_zero_point") = py::none(), py::arg("w2_weight_zero_point") = py::none(),
                  py::arg("activation") = "silu")
      .def_static("mxfp4", &Layer::mxfp4, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("w13_bias") = py::none(),
                  py::arg("w2_bias") = py::none(), py::arg("activation") = "swigluoai", py::arg("hidden_size") = 0,
                  py::arg("intermediate_size") = 0, py::arg("interleaved") = true, py::arg("swiglu_alpha") = 1.702,
                  py::arg("swiglu_limit") = 7.0)
      .def_static("nvfp4", &Layer::nvfp4, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("w13_weight_scale_2"),
                  py::arg("w2_weight_scale_2"), py::arg("w13_input_scale") = py::none(),
                  py::arg("w2_input_scale") = py::none(), py::arg("activation") = "silu")
      .def("dequantized", &Layer::dequantized)
      .def_property_readonly("format", [](const Layer& l) {
        const auto& sh = l.impl->shape();
        if (sh.fp4) return sh.nv ? "nvfp4" : "mxfp4";
        if (sh.int4) return "wna16_int4";
        if (!sh.byte_weights) return "bf16";
        if (sh.per_row) return sh.int8 ? "int8_channel" : "fp8_channel";
        return "fp8_block";
      })
      .def("submit", &Layer::submit, py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"), py::arg("out"))
      .def_property_readonly("nbytes", [](const Layer& l) { return l.impl->nbytes(); })
      .def_property_readonly("num_experts", [](const Layer& l) { return l.impl->shape().experts; })
      .def_property_readonly("hidden_size", [](const Layer& l) { return l.impl->shape().hidden; })
      .def_property_readonly("intermediate_size", [](const Layer& l) { return l.impl->shape().intermediate; })
      .def_property_readonly("last_compute_us", [](const Layer& l) { return l.impl->last_compute_us(); })
      .def_property_readonly("last_phase_us",
                             [](const Layer& l) {
                               const auto p = l.impl->last_phase_times();
                               py::dict d;
                               d["gate_up"] = p.gate_up_us;
                               d["down"] = p.down_us;
                               d["gate_up_spread"] = p.gate_up_spread_us;
                               d["down_spread"] = p.down_spread_us;
                               return d;
                             })
      .def_property_readonly("num_slices", [](const Layer& l) { return int(l.impl->slices().size()); })
      .def("packed_slices",
           [](const Layer& l) {
             // Views of the packed weights (bf16), for streaming them to a GPU. Each view keeps
             // the layer's memory alive. w13: [E, nbi, 2, kp1/2, 16, 2]; w2: [E, nbh, kp2/2, 16, 2].
             const auto& sh = l.impl->shape();
             if (sh.byte_weights || sh.int4 || sh.fp4)
               throw py::value_error(sh.byte_weights
                                         ? "packed_slices() gives bf16/fp16 experts; this layer has byte weights "
                                           "(fp8/int8 codes + fp32 scales): use quant_slices()"
                                         : "packed_slices() gives bf16/fp16 experts; this layer has 4-bit weights "
                                           "(wna16_int4 / mxfp4 / nvfp4): use quant4_slices()");
             py::list out;
             auto keep = l.impl;
             auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               at::Tensor w13 = torch::from_blob(sl.w13.data(), {sh.experts, nbi, 2, sh.kp1 / 2, 16, 2},
                                                 [keep](void*) {}, opts);
               at::Tensor w2 = torch::from_blob(sl.w2.data(), {sh.experts, nbh, sh.kp2 / 2, 16, 2},
                                                [keep](void*) {}, opts);
               out.append(py::make_tuple(w13, w2, sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN,
                                         sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN));
             }
             return out;
           })
      .def_property_readonly("byte_codes",
           [](const Layer& l) -> py::object {
             // Byte-weight layers: (codes, seg) for lk_moe.gpu_dequant: "fp8_e4m3" or "int8", and
             // the inputs per scale (0: one scale per row) for both projections; None otherwise.
             const auto& sh = l.impl->shape();
             if (!sh.byte_weights) return py::none();
             return py::make_tuple(sh.int8 ? "int8" : "fp8_e4m3", sh.per_row ? 0 : sh.seg);
           })
      .def("quant_slices",
           [](const Layer& l) {
             // Byte-weight layers (fp8_block / fp8_channel / int8_channel): per NUMA slice, views of
             // the packed codes and their fp32 scales, for streaming them to a GPU (each view keeps
             // the layer's memory alive). (w13 uint8 [E, nbi, 2, kp1/2, 16, 2], s13 fp32
             // [E, nbi, 2, P1], w2 uint8 [E, nbh, kp2/2, 16, 2], s2 fp32 [E, nbh, P2], i0, i1, h0, h1):
             // the codes in the bf16 block layout of packed_slices (one byte per weight), P = 16
             // (one scale per row) or kp/seg (one per segment of seg inputs, shared by the block's rows).
             const auto& sh = l.impl->shape();
             if (!sh.byte_weights)
               throw py::value_error(std::string("quant_slices() is for byte-weight layers (fp8_block, fp8_channel, "
                                                 "int8_channel); this layer is ") +
                                     (sh.int4 ? "wna16_int4 (use quant4_slices)"
                                      : sh.fp4 ? (sh.nv ? "nvfp4 (use quant4_slices)" : "mxfp4 (use quant4_slices)")
                                               : "bf16 (use packed_slices)"));
             const int64_t p1 = sh.per_row ? lk::kBlockN : sh.kp1 / sh.seg;
             const int64_t p2 = sh.per_row ? lk::kBlockN : sh.kp2 / sh.seg;
             py::list out;
             auto keep = l.impl;
             auto u8 = at::TensorOptions().dtype(at::kByte).device(at::kCPU);
             auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               auto view = [&](const lk::HostBuffer& b, at::IntArrayRef shape, const at::TensorOptions& o) {
                 return torch::from_blob(b.data(), shape, [keep](void*) {}, o);
               };
               at::Tensor w13 = view(sl.w13, {sh.experts, nbi, 2, sh.kp1 / 2, 16, 2}, u8);
               at::Tensor s13 = view(sl.s13, {sh.experts, nbi, 2, p1}, f32);
               at::Tensor w2 = view(sl.w2, {sh.experts, nbh, sh.kp2 / 2, 16, 2}, u8);
               at::Tensor s2 = view(sl.s2, {sh.experts, nbh, p2}, f32);
               out.append(py::make_tuple(w13, s13, w2, s2, sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN,
                                         sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN));
             }
             return out;
           })
      .def("quant4_slices",
           [](const Layer& l) {
             // 4-bit layers (wna16_int4, mxfp4, nvfp4): per NUMA slice, a dict of zero-copy views of the
             // packed buffers (each keeps the layer's memory alive), shaped for plain-torch
             // dequantization (lk_moe.gpu_dequant.dequant4_blocks). A block is 16 output rows x kp
             // inputs in kp/4 quads of 32 bytes; byte (q, n, j) holds element (n, 4q + j) in its low
             // nibble and (n, 4q + 2 + j) in its high one (moe_layer.cpp pack_int4 / pack_fp4).
             //   w13 uint8 [E, nbi, 2, kp1/4, 16, 2] (gate block, then up), w2 uint8 [E, nbh, kp2/4, 16, 2];
             //   s13 [E, nbi, 2, kp1/G, 16], s2 [E, nbh, kp2/G, 16]: one scale per row and G inputs;
             //     int4 bf16/fp16 (G = the engine segment), mxfp4 uint8 e8m0 (G = 32), nvfp4 float8_e4m3fn
             //     (G = 16); nvfp4 global scales: global_scales();
             //   int4 with zero points: z13 uint8 [E, nbi, 2, kp1/G, 8], z2 [E, nbh, kp2/G, 8], row n's
             //     zero point in nibble n % 2 of byte n / 2 (low first);
             //   mxfp4 with biases: b13 bf16 [E, nbi, 2, 16], b2 bf16 [E, nbh, 16];
             //   bounds: (i0, i1, h0, h1).
             const auto& sh = l.impl->shape();
             if (!sh.int4 && !sh.fp4)
               throw py::value_error(std::string("quant4_slices() is for 4-bit layers (wna16_int4, mxfp4, nvfp4); "
                                                 "this layer is ") +
                                     (sh.byte_weights ? "byte-weight (use quant_slices)" : "bf16 (use packed_slices)"));
             const int64_t g1 = sh.int4 ? sh.seg1 : sh.nv ? 16 : 32, g2 = sh.int4 ? sh.seg2 : sh.nv ? 16 : 32;
             const auto scale_type = sh.int4 ? (sh.int4_fp16 ? at::kHalf : at::kBFloat16)
                                             : sh.nv ? at::kFloat8_e4m3fn : at::kByte;
             const int64_t E = sh.experts, kp1 = sh.kp1, kp2 = sh.kp2;
             py::list out;
             auto keep = l.impl;
             auto opts = at::TensorOptions().device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               auto view = [&](const lk::HostBuffer& b, at::IntArrayRef shape, at::ScalarType t) {
                 return torch::from_blob(b.data(), shape, [keep](void*) {}, opts.dtype(t));
               };
               py::dict d;
               d["w13"] = view(sl.w13, {E, nbi, 2, kp1 / 4, 16, 2}, at::kByte);
               d["s13"] = view(sl.s13, {E, nbi, 2, kp1 / g1, 16}, scale_type);
               d["w2"] = view(sl.w2, {E, nbh, kp2 / 4, 16, 2}, at::kByte);
               d["s2"] = view(sl.s2, {E, nbh, kp2 / g2, 16}, scale_type);
               if (sh.int4_asym) {
                 d["z13"] = view(sl.z13, {E, nbi, 2, kp1 / g1, 8}, at::kByte);
                 d["z2"] = view(sl.z2, {E, nbh, kp2 / g2, 8}, at::kByte);
               }
               if (sh.bias) {
                 d["b13"] = view(sl.b13, {E, nbi, 2, 16}, at::kBFloat16);
                 d["b2"] = view(sl.b2, {E, nbh, 16}, at::kBFloat16);
               }
               d["bounds"] = py::make_tuple(sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN, sl.hb0 * lk::kBlockN,
                                            sl.hb1 * lk::kBlockN);
               out.append(d);
             }
             return out;
           })
      .def("global_scales",
           [](const Layer& l) -> py::object {
             // nvfp4: views of the per-expert fp32 global scales (w13 [E, 2]: gate, up; w2 [E]); None otherwise.
             const auto& sh = l.impl->shape();
             if (!sh.nv) return py::none();
             auto keep = l.impl;
             auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
             // from_blob wants a mutable pointer; the views are read by the GPU copy only.
             at::Tensor g13 = torch::from_blob(const_cast<float*>(l.impl->global_scales13()), {sh.experts, 2},
                                               [keep](void*) {}, f32);
             at::Tensor g2 = torch::from_blob(const_cast<float*>(l.impl->global_scales2()), {sh.experts},
                                              [keep](void*) {}, f32);
             return py::make_tuple(g13, g2);
           })
      .def_property_readonly("swiglu", [](const Layer& l) {
        // swigluoai constants (alpha, limit) of fp4 layers (the engine's defaults elsewhere).
        return py::make_tuple(l.impl->shape().alpha, l.impl->shape().limit);
      })
      .def("pin_for_gpu",
           [](Layer& l) {
             // Page-lock the packed weights once (unregistered when the layer is freed); quantized
             // layers: their scales, zero points and biases too (separate host buffers, streamed with
             // the codes). The nvfp4 global scales (12 bytes per expert) stay pageable.
             if (l.impl->pinned) return;
             std::vector<void*> done;
             try {
               for (const auto& sl : l.impl->slices()) {
                 for (const lk::HostBuffer* b : {&sl.w13, &sl.w2, &sl.s13, &sl.s2, &sl.z13, &sl.z2, &sl.b13, &sl.b2}) {
                   if (!b->size()) continue;
                   lk::register_host_memory(b->data(), b->size());
                   done.push_back(b->data());
                 }
               }
             } catch (const std::runtime_error& e) {
               for (void* p : done) lk::unregister_host_memory(p);
               throw;
             }
             l.impl->pinned = true;
             l.impl->on_destroy([done] {
               for (void* p : done) lk::unregister_host_memory(p);
             });
           })
      .def_property_readonly("padded_dims", [](const Layer& l) {
        const auto& sh = l.impl->shape();
        return py::make_tuple(sh.kp1, sh.kp2, sh.h_blocks * lk::kBlockN);
      })
      .def("slice_bounds", [](const Layer& l, int s) {
        const auto& sl = l.impl->slices().at(s);
        return py::make_tuple(sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN, sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN);
      });
}
