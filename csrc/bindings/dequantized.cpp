// A test hook: the weights the fp4 engine computes with, decoded back from its packed blocks.
#include <cmath>

#include "bindings/common.h"

namespace lk_bind {

// fp4 layers: the weights the engine computes with, decoded from its packed blocks to fp32
// ([E, 2I, H] rows [gate; up], [E, H, I]): e2m1 x block scale (x global scale for nvfp4, one fp32
// rounding of the exact product; mxfp4 biases are not included).
py::tuple Layer::dequantized() const {
  const auto& sh = impl->shape();
  if (sh.format->family != lk::Family::kFp4) throw py::value_error("dequantized() is available for mxfp4 / nvfp4 layers");
  const int E = sh.experts, I = sh.intermediate, H = sh.hidden, grp = sh.seg1;
  at::Tensor w13 = at::zeros({E, 2 * I, H}, at::kFloat), w2 = at::zeros({E, H, I}, at::kFloat);
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  auto scale_of = [&](uint8_t s) -> double {
    if (sh.format->nv) {  // fp8 e4m3fn
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
          const double gs = sh.format->nv ? impl->global_scales13()[2 * size_t(e) + h] : 1.0;
          decode(sl.w13.as<uint8_t>() + b * bb1, sl.s13.as<uint8_t>() + b * sb1, sh.kp1, H,
                 std::min(lk::kBlockN, I - r0), gs, p13 + (size_t(e) * 2 * I + size_t(h) * I + r0) * H, H);
        }
      for (int lb = 0; lb < nbh; ++lb) {
        const size_t b = size_t(e) * nbh + lb;
        const int r0 = (sl.hb0 + lb) * lk::kBlockN;
        const double gs = sh.format->nv ? impl->global_scales2()[e] : 1.0;
        decode(sl.w2.as<uint8_t>() + b * bb2, sl.s2.as<uint8_t>() + b * sb2, sh.kp2, I,
               std::min(lk::kBlockN, H - r0), gs, p2 + (size_t(e) * H + r0) * I, I);
      }
    }
  }
  return py::make_tuple(w13, w2);
}

void def_dequantized(py::class_<Layer>& layer) { layer.def("dequantized", &Layer::dequantized); }

}  // namespace lk_bind
