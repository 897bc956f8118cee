// The activation rows of the 4-bit decode with integer activations (kernel_table.h: q8 and q15 rows),
// quantized once per chunk by the engine; the AVX-512 tiers and avx2 (generic takes the exact bf16 path).
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {
// An integer row's parts (kernel_table.h int_row_layout): the codes at the row's start (q15: hi), lo (q15), d per
// 32 inputs, d x sum q per 32 (q8), sums of q per 16.
struct IntRow {
  int8_t* lo;
  float* d;
  float* ds;
  int32_t* s16;
};
inline IntRow int_row_parts(int8_t* dst, int kp, bool q15) {
  const IntRowLayout l = int_row_layout(kp, q15);
  return {q15 ? dst + l.lo : nullptr, reinterpret_cast<float*>(dst + l.d),
          q15 ? nullptr : reinterpret_cast<float*>(dst + l.ds), reinterpret_cast<int32_t*>(dst + l.s16)};
}
// A q15 group's scale (q15_row) for a finite amax > 0: d = 2^e with amax / d in (8128, 16256], and 1 / d as two
// factors, x * f1 * f2 exact (2^-e alone would overflow for groups below ~2^-113).
struct Q15Scale {
  float f1, f2, d;
};
inline Q15Scale q15_scale(float amax) {
  int k;
  std::frexp(amax, &k);  // amax = f 2^k, f in [0.5, 1)
  int e = k - 14;
  if (std::ldexp(amax, -e) > 16256.0f) ++e;  // keep |hi| <= 127
  const int p1 = -e > 126 ? 126 : -e;
  return {std::ldexp(1.0f, p1), std::ldexp(1.0f, -e - p1), std::ldexp(1.0f, e)};
}
}  // namespace
}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk

#if defined(LK_V512) || defined(__AVX2__)
namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {
// Each ISA's primitives on one group of 32 activations: load_act_group32 (as fp32, their max |x|, whether every one
// is finite), round_scaled (round(x * f1 * f2) to nearest even, as 32 int32 codes), store_codes (32 codes of
// |q| <= 127 as bytes), half_sum (sum of codes [16 h, 16 h + 16)) and q15_split (q = 128 hi + lo, hi =
// floor((q + 64) / 128), lo in [-64, 63]). The row loops below are written once over them.
#if defined(LK_V512)
struct ActGroup32 {
  __m512 x0, x1;
  float amax;
  bool finite;
};
struct Codes32 {
  __m512i q0, q1;
};
inline ActGroup32 load_act_group32(const uint16_t* src) {
  ActGroup32 g;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  g.x0 = bf16_to_f32_v(_mm256_loadu_si256((const __m256i*)src));
  g.x1 = bf16_to_f32_v(_mm256_loadu_si256((const __m256i*)(src + 16)));
  g.amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(g.x0, absmask), _mm512_and_ps(g.x1, absmask)));
  const bool nan = (_mm512_cmp_ps_mask(g.x0, g.x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(g.x1, g.x1, _CMP_UNORD_Q)) != 0;
  g.finite = !nan && g.amax <= 3.4e38f;
  return g;
}
inline Codes32 zero_codes() { return {_mm512_setzero_si512(), _mm512_setzero_si512()}; }
inline Codes32 round_scaled(const ActGroup32& x, float f1, float f2) {
  const __m512 a = _mm512_set1_ps(f1), b = _mm512_set1_ps(f2);
  return {_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x.x0, a), b)),
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x.x1, a), b))};
}
inline void store_codes(const Codes32& q, int8_t* dst) {
  _mm_storeu_si128((__m128i*)dst, _mm512_cvtsepi32_epi8(q.q0));
  _mm_storeu_si128((__m128i*)(dst + 16), _mm512_cvtsepi32_epi8(q.q1));
}
inline int32_t half_sum(const Codes32& q, int h) { return _mm512_reduce_add_epi32(h ? q.q1 : q.q0); }
inline void q15_split(const Codes32& q, Codes32& hi, Codes32& lo) {
  const __m512i c64 = _mm512_set1_epi32(64);
  hi = {_mm512_srai_epi32(_mm512_add_epi32(q.q0, c64), 7), _mm512_srai_epi32(_mm512_add_epi32(q.q1, c64), 7)};
  lo = {_mm512_sub_epi32(q.q0, _mm512_slli_epi32(hi.q0, 7)), _mm512_sub_epi32(q.q1, _mm512_slli_epi32(hi.q1, 7))};
}
#else  // AVX2
struct ActGroup32 {
  __m256 x[4];
  float amax;
  bool finite;
};
struct Codes32 {
  __m256i q[4];
};
inline ActGroup32 load_act_group32(const uint16_t* src) {
  ActGroup32 g;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  bool nan = false;
  for (int i = 0; i < 4; ++i) {
    const __m128i v = _mm_loadu_si128((const __m128i*)(src + 8 * i));
    g.x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    mx = _mm256_max_ps(mx, _mm256_and_ps(g.x[i], absmask));
    nan = nan || _mm256_movemask_ps(_mm256_cmp_ps(g.x[i], g.x[i], _CMP_UNORD_Q)) != 0;
  }
  float m8[8];
  _mm256_storeu_ps(m8, mx);
  g.amax = 0.0f;
  for (float v : m8) g.amax = v > g.amax ? v : g.amax;
  g.finite = !nan && g.amax <= 3.4e38f;
  return g;
}
inline Codes32 zero_codes() {
  return {{_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}};
}
inline Codes32 round_scaled(const ActGroup32& x, float f1, float f2) {
  const __m256 a = _mm256_set1_ps(f1), b = _mm256_set1_ps(f2);
  Codes32 q;
  for (int i = 0; i < 4; ++i) q.q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(x.x[i], a), b));
  return q;
}
inline void store_codes(const Codes32& q, int8_t* dst) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs work per 128-bit lane
  const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q.q[0], q.q[1]), _mm256_packs_epi32(q.q[2], q.q[3]));
  _mm256_storeu_si256((__m256i*)dst, _mm256_permutevar8x32_epi32(w, order));
}
inline int32_t half_sum(const Codes32& q, int h) {
  int32_t s[8];
  _mm256_storeu_si256((__m256i*)s, _mm256_add_epi32(q.q[2 * h], q.q[2 * h + 1]));
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}
inline void q15_split(const Codes32& q, Codes32& hi, Codes32& lo) {
  for (int i = 0; i < 4; ++i) {
    hi.q[i] = _mm256_srai_epi32(_mm256_add_epi32(q.q[i], _mm256_set1_epi32(64)), 7);
    lo.q[i] = _mm256_sub_epi32(q.q[i], _mm256_slli_epi32(hi.q[i], 7));
  }
}
#endif
}  // namespace

// One bf16 row -> q8 row (kernel_table.h): per 32 inputs d = max|x| / 127, q = round(x / d).
void q8_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = int_row_parts(dst, kp, false);
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    const Codes32 q = round_scaled(x, x.amax > 0.0f ? 127.0f / x.amax : 0.0f, 1.0f);
    store_codes(q, dst + b * 32);
    // inf/NaN input: d = NaN, so the outputs that read it are NaN as in the bf16 path
    const float db = x.finite ? x.amax / 127.0f : __builtin_nanf("");
    row.d[b] = db;
    row.s16[2 * b] = half_sum(q, 0);
    row.s16[2 * b + 1] = half_sum(q, 1);
    row.ds[b] = db * float(row.s16[2 * b] + row.s16[2 * b + 1]);
  }
}

// One bf16 row -> q15 row (kernel_table.h): per 32 inputs a power of two d = 2^e with max|x| / d in
// (8128, 16256], q = round(x / d) (exact for every input within 2^-6 of the group's max, the rest off
// by at most d / 2 <= 2^-14 max|x|), stored as int8 hi = floor((q + 64) / 128) and lo = q - 128 hi in
// [-64, 63], so q = 128 hi + lo.
void q15_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = int_row_parts(dst, kp, true);
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    Codes32 q = zero_codes();
    float db = 0.0f;  // all-zero group: q = 0
    if (!x.finite) {
      db = __builtin_nanf("");  // inf/NaN input: the outputs that read it are NaN, as in the bf16 path
    } else if (x.amax > 0.0f) {
      const Q15Scale sc = q15_scale(x.amax);
      q = round_scaled(x, sc.f1, sc.f2);
      db = sc.d;
    }
    Codes32 hi, lo;
    q15_split(q, hi, lo);
    store_codes(hi, dst + b * 32);
    store_codes(lo, row.lo + b * 32);
    row.d[b] = db;
    row.s16[2 * b] = half_sum(q, 0);
    row.s16[2 * b + 1] = half_sum(q, 1);
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
#endif  // LK_V512 || __AVX2__
