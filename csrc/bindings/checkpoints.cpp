// The quantized formats' checkpoint adapters: each takes the tensors as vLLM holds them after weight
// loading (names in errors are vLLM's), checks them and hands the engine a WeightSource.
#include "bindings/common.h"

namespace lk_bind {
namespace {

// How every 4-bit adapter ends: each of its tensors CPU-contiguous (named as vLLM names them), then a
// source of `type` with the codes w13 / w2.
lk::WeightSource contiguous_source(lk::DType type, const at::Tensor& w13, const at::Tensor& w2,
                                   std::initializer_list<std::pair<const at::Tensor*, const char*>> tensors) {
  for (auto [t, name] : tensors) require_cpu_contiguous(*t, name);
  lk::WeightSource src;
  src.type = type;
  src.w13 = w13.data_ptr();
  src.w2 = w2.data_ptr();
  return src;
}

// Each of `tensors` (named as vLLM names them) of dtype `want`, else a TypeError: "<name> must be <what>, got ...".
void require_dtype(std::initializer_list<std::pair<const at::Tensor*, const char*>> tensors, at::ScalarType want,
                   const std::string& what) {
  for (auto [t, name] : tensors)
    if (t->scalar_type() != want) throw py::type_error(std::string(name) + " must be " + what + ", got " + dtype_name(*t));
}

}  // namespace

// Checks shared by the byte-quantized formats: weights of `code` dtype shaped [E, 2I, H] and
// [E, H, I], scales of `scale` dtype (fp32; mxfp8's uint8), everything CPU-contiguous. Returns {E, I, H}. Names in errors are vLLM's.
std::array<int64_t, 3> Layer::check_byte_weights(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& s13,
                                                 const at::Tensor& s2, at::ScalarType code,
                                                 const std::string& code_what, const char* s13_name,
                                                 const char* s2_name, at::ScalarType scale,
                                                 const std::string& scale_what) {
  require_dtype({{&w13, "w13_weight"}, {&w2, "w2_weight"}}, code, code_what);
  require_dtype({{&s13, s13_name}, {&s2, s2_name}}, scale, scale_what);
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

// fp8_block: vLLM Fp8MoEMethod after loading (block quant): w13_weight / w2_weight float8_e4m3fn,
// w13_weight_scale_inv / w2_weight_scale_inv fp32 per (bn x bk) block.
Layer Layer::fp8_block(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                       const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                       int64_t block_n, int64_t block_k, double swiglu_limit, double situ_beta,
                       double situ_linear_beta, double swiglu_alpha) {
  const ActivationArg act =
      parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, "fp8_block", swiglu_alpha);
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
  src.rest = lk::ByteScales{s13.data_ptr<float>(), s2.data_ptr<float>(), int(bn), int(bk)};
  return build(std::move(pool), src, E, I, H, act);
}

// fp8_channel / int8_channel: compressed-tensors channel quantization (vLLM CT W8A8 int8, CT FP8
// channel): w13_weight / w2_weight fp8 or int8, w13_weight_scale [E, 2I, 1], w2_weight_scale [E, H, 1].
Layer Layer::per_channel(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                         const at::Tensor& s13, const at::Tensor& s2, const std::string& activation,
                         const std::string& format, double swiglu_limit, double situ_beta,
                         double situ_linear_beta, double swiglu_alpha) {
  const ActivationArg act = parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, format, swiglu_alpha);
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
  src.rest = lk::ByteScales{s13.data_ptr<float>(), s2.data_ptr<float>()};  // 0 x 0 blocks: one scale per row
  return build(std::move(pool), src, E, I, H, act);
}

// mxfp8: OCP MX FP8 experts as vLLM's ModelOptMxFp8FusedMoE creates them (before its kernel-format conversion):
// w13_weight / w2_weight float8_e4m3fn [E, 2I, H] / [E, H, I] (gate rows, then up), w13_weight_scale /
// w2_weight_scale uint8 e8m0 [E, 2I, ceil(H/32)] / [E, H, ceil(I/32)]: weight = code x 2^(scale - 127).
Layer Layer::mxfp8(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                   const at::Tensor& s13, const at::Tensor& s2, const std::string& activation, double swiglu_limit,
                   double situ_beta, double situ_linear_beta, double swiglu_alpha) {
  const ActivationArg act =
      parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, "mxfp8", swiglu_alpha);
  const auto [E, I, H] = check_byte_weights(w13, w2, s13, s2, at::kFloat8_e4m3fn, "float8_e4m3fn for mxfp8",
                                            "w13_weight_scale", "w2_weight_scale", at::kByte, "uint8 (e8m0 exponents)");
  require_shape(s13, "w13_weight_scale", {E, 2 * I, (H + 31) / 32}, ("[E, 2I, H/32] = " + dims({E, 2 * I, (H + 31) / 32})).c_str());
  require_shape(s2, "w2_weight_scale", {E, H, (I + 31) / 32}, ("[E, H, I/32] = " + dims({E, H, (I + 31) / 32})).c_str());
  lk::WeightSource src = contiguous_source(lk::DType::kMXFP8, w13, w2,
                                          {{&w13, "w13_weight"}, {&w2, "w2_weight"}, {&s13, "w13_weight_scale"},
                                           {&s2, "w2_weight_scale"}});
  src.rest = lk::E8m0Scales{s13.data_ptr<uint8_t>(), s2.data_ptr<uint8_t>()};
  return build(std::move(pool), src, E, I, H, act);
}

// wna16_int4: compressed-tensors WNA16 int4 experts as vLLM holds them after loading (K-first,
// see lk::Int4Groups): w13_weight_packed int32 [E, H/8, 2I], w2_weight_packed int32 [E, I/8, H],
// w13_weight_scale [E, H/gs, 2I], w2_weight_scale [E, I/gs, H] (bf16/fp16), optional zero points
// int32 [E, H/gs, ceil(2I/8)] and [E, I/gs, ceil(H/8)] (None, None: symmetric).
Layer Layer::wna16_int4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                        const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> z13,
                        std::optional<at::Tensor> z2, const std::string& activation, double swiglu_limit,
                        double situ_beta, double situ_linear_beta, double swiglu_alpha) {
  const ActivationArg act =
      parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, "wna16_int4", swiglu_alpha);
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
  lk::WeightSource src = contiguous_source(lk::DType::kINT4, w13, w2,
                                          {{&w13, "w13_weight_packed"}, {&w2, "w2_weight_packed"},
                                           {&s13, "w13_weight_scale"}, {&s2, "w2_weight_scale"}});
  lk::Int4Groups& g = src.rest.emplace<lk::Int4Groups>();
  g.s13 = static_cast<const uint16_t*>(s13.data_ptr());
  g.s2 = static_cast<const uint16_t*>(s2.data_ptr());
  g.z13 = z13 ? z13->data_ptr<int32_t>() : nullptr;
  g.z2 = z2 ? z2->data_ptr<int32_t>() : nullptr;
  g.gs1 = int(H / G1);
  g.gs2 = int(I / G2);
  g.fp16_scale = st == DType::kFP16;
  return build(std::move(pool), src, E, I, H, act);
}

// mxfp4: OCP MX FP4 experts as vLLM's GptOssMxfp4MoEMethod / Mxfp4MoEMethod hold them after loading
// (see lk::Fp4Blocks): w13_weight uint8 [E, 2I', H'/2], w13_weight_scale uint8 [E, 2I', H'/32],
// w2_weight uint8 [E, H', I'/2], w2_weight_scale uint8 [E, H', I'/32], optional w13_bias bf16 [E, 2I']
// and w2_bias bf16 [E, H']. H' >= H and I' >= I may be padded (vLLM rounds them up for its kernels);
// hidden_size / intermediate_size (<= 0: H', I') give the real sizes, and only those are read.
Layer Layer::mxfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                   const at::Tensor& s13, const at::Tensor& s2, std::optional<at::Tensor> b13,
                   std::optional<at::Tensor> b2, const std::string& activation, int64_t hidden_size,
                   int64_t intermediate_size, bool interleaved, double alpha, double limit, double situ_beta,
                   double situ_linear_beta) {
  const ActivationArg act =
      parse_activation(activation, limit, situ_beta, situ_linear_beta, "mxfp4", alpha);
  require_dtype({{&w13, "w13_weight"}, {&w2, "w2_weight"}}, at::kByte, "uint8 (two e2m1 codes per byte)");
  require_dtype({{&s13, "w13_weight_scale"}, {&s2, "w2_weight_scale"}}, at::kByte, "uint8 (e8m0 exponents)");
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
  lk::WeightSource src = contiguous_source(lk::DType::kMXFP4, w13, w2,
                                          {{&w13, "w13_weight"}, {&w2, "w2_weight"}, {&s13, "w13_weight_scale"},
                                           {&s2, "w2_weight_scale"}});
  if (!(alpha == alpha) || !(limit > 0)) throw py::value_error("swiglu_alpha must be a number and swiglu_limit > 0");
  lk::Fp4Blocks& f = src.rest.emplace<lk::Fp4Blocks>();
  f.s13 = s13.data_ptr<uint8_t>();
  f.s2 = s2.data_ptr<uint8_t>();
  f.b13 = b13 ? static_cast<const uint16_t*>(b13->data_ptr()) : nullptr;
  f.b2 = b2 ? static_cast<const uint16_t*>(b2->data_ptr()) : nullptr;
  f.r13 = int(R13);
  f.c13 = int(C13);
  f.cs13 = int(G13);
  f.r2 = int(R2);
  f.c2 = int(C2);
  f.cs2 = int(G2);
  f.interleaved = interleaved;
  return build(std::move(pool), src, E, I, H, act);
}

// nvfp4: ModelOpt NVFP4 experts as vLLM's ModelOptNvFp4FusedMoE holds them after loading (see
// lk::Fp4Blocks): w13_weight uint8 [E, 2I, H/2], w2_weight uint8 [E, H, I/2], w13_weight_scale /
// w2_weight_scale float8_e4m3fn [E, 2I, H/16] / [E, H, I/16], w13_weight_scale_2 float32 [E, 2] (gate, up),
// w2_weight_scale_2 float32 [E]; optional w13_input_scale float32 [E', 2] / w2_input_scale [E'] (E' >= E),
// checked and ignored (W4A16 compute). Every problem is a ValueError naming the tensor.
Layer Layer::nvfp4(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
                   const at::Tensor& s13, const at::Tensor& s2, const at::Tensor& g13, const at::Tensor& g2,
                   std::optional<at::Tensor> a13, std::optional<at::Tensor> a2, const std::string& activation,
                   double swiglu_limit, double situ_beta, double situ_linear_beta, double swiglu_alpha) {
  const ActivationArg act = parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, "nvfp4", swiglu_alpha);
  auto need_dtype = [](const at::Tensor& t, const char* name, at::ScalarType want, const char* what) {
    if (t.scalar_type() != want)
      throw py::value_error(std::string(name) + " must be " + what + ", got " + dtype_name(t));
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
  lk::WeightSource src = contiguous_source(lk::DType::kNVFP4, w13, w2,
                                          {{&w13, "w13_weight"}, {&w2, "w2_weight"}, {&s13, "w13_weight_scale"},
                                           {&s2, "w2_weight_scale"}, {&g13, "w13_weight_scale_2"},
                                           {&g2, "w2_weight_scale_2"}});
  lk::Fp4Blocks& f = src.rest.emplace<lk::Fp4Blocks>();
  f.s13 = static_cast<const uint8_t*>(s13.data_ptr());
  f.s2 = static_cast<const uint8_t*>(s2.data_ptr());
  f.r13 = int(2 * I);
  f.c13 = int(H / 2);
  f.cs13 = int(H / 16);
  f.r2 = int(H);
  f.c2 = int(I / 2);
  f.cs2 = int(I / 16);
  f.interleaved = false;
  f.g13 = g13.data_ptr<float>();
  f.g2 = g2.data_ptr<float>();
  return build(std::move(pool), src, E, I, H, act);
}

void def_checkpoints(py::class_<Layer>& layer) {
  layer.def_static("fp8_block", &Layer::fp8_block, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale_inv"), py::arg("w2_weight_scale_inv"), py::arg("activation") = "silu",
                  py::arg("block_n") = 0, py::arg("block_k") = 0, py::arg("swiglu_limit") = 0.0,
                  py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0, py::arg("swiglu_alpha") = 1.702)
      .def_static("per_channel", &Layer::per_channel, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("activation"), py::arg("format"),
                  py::arg("swiglu_limit") = 0.0, py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0,
                  py::arg("swiglu_alpha") = 1.702)
      .def_static("mxfp8", &Layer::mxfp8, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("activation") = "silu",
                  py::arg("swiglu_limit") = 0.0, py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0,
                  py::arg("swiglu_alpha") = 1.702)
      .def_static("wna16_int4", &Layer::wna16_int4, py::arg("pool"), py::arg("w13_weight_packed"),
                  py::arg("w2_weight_packed"), py::arg("w13_weight_scale"), py::arg("w2_weight_scale"),
                  py::arg("w13_weight_zero_point") = py::none(), py::arg("w2_weight_zero_point") = py::none(),
                  py::arg("activation") = "silu", py::arg("swiglu_limit") = 0.0, py::arg("situ_beta") = 0.0,
                  py::arg("situ_linear_beta") = 0.0, py::arg("swiglu_alpha") = 1.702)
      .def_static("mxfp4", &Layer::mxfp4, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("w13_bias") = py::none(),
                  py::arg("w2_bias") = py::none(), py::arg("activation") = "silu", py::arg("hidden_size") = 0,
                  py::arg("intermediate_size") = 0, py::arg("interleaved") = false, py::arg("swiglu_alpha") = 1.702,
                  py::arg("swiglu_limit") = 7.0, py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0)
      .def_static("nvfp4", &Layer::nvfp4, py::arg("pool"), py::arg("w13_weight"), py::arg("w2_weight"),
                  py::arg("w13_weight_scale"), py::arg("w2_weight_scale"), py::arg("w13_weight_scale_2"),
                  py::arg("w2_weight_scale_2"), py::arg("w13_input_scale") = py::none(),
                  py::arg("w2_input_scale") = py::none(), py::arg("activation") = "silu",
                  py::arg("swiglu_limit") = 0.0, py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0,
                  py::arg("swiglu_alpha") = 1.702);
}

}  // namespace lk_bind
