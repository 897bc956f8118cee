// The activation rows of the 4-bit decode with integer activations (kernel_table.h: q8 and q15 rows),
// quantized once per chunk by the engine; the AVX-512 tiers and avx2 (generic takes the exact bf16 path).
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {
// Where an integer row's parts live (kernel_table.h q8_row_bytes, q15_row_bytes): the codes at the row's start (q15:
// hi), lo (q15), d per 32 inputs, d x sum q per 32 (q8), sums of q per 16.
struct IntRow {
  int8_t* lo;
  float* d;
  float* ds;
  int32_t* s16;
};
inline IntRow q8_parts(int8_t* dst, int kp) {
  float* d = reinterpret_cast<float*>(dst + kp);
  return {nullptr, d, d + kp / kQ8Group, reinterpret_cast<int32_t*>(d + 2 * (kp / kQ8Group))};
}
inline IntRow q15_parts(int8_t* dst, int kp) {
  float* d = reinterpret_cast<float*>(dst + 2 * kp);
  return {dst + kp, d, nullptr, reinterpret_cast<int32_t*>(d + kp / kQ8Group)};
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

#if defined(LK_V512)
namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

// One group of 32 bf16 activations for the integer rows (q8_row, q15_row): as fp32, their max |x|, and
// whether every one is finite.
struct ActGroup32 {
  __m512 x0, x1;
  float amax;
  bool finite;
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

}  // namespace

// One bf16 row -> q8 row (kernel_table.h): per 32 inputs d = max|x| / 127, q = round(x / d).
void q8_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = q8_parts(dst, kp);
  float *d = row.d, *ds = row.ds;
  int32_t* s16 = row.s16;
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    const float amax = x.amax;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x.x0, _mm512_set1_ps(inv)));  // round to nearest even
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x.x1, _mm512_set1_ps(inv)));
    _mm_storeu_si128((__m128i*)(dst + b * 32), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(dst + b * 32 + 16), _mm512_cvtsepi32_epi8(q1));
    // inf/NaN input: d = NaN, so the outputs that read it are NaN as in the bf16 path
    const float db = x.finite ? amax / 127.0f : __builtin_nanf("");
    d[b] = db;
    s16[2 * b] = _mm512_reduce_add_epi32(q0);
    s16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
    ds[b] = db * float(s16[2 * b] + s16[2 * b + 1]);
  }
}

// One bf16 row -> q15 row (kernel_table.h): per 32 inputs a power of two d = 2^e with max|x| / d in
// (8128, 16256], q = round(x / d) (exact for every input within 2^-6 of the group's max, the rest off
// by at most d / 2 <= 2^-14 max|x|), stored as int8 hi = floor((q + 64) / 128) and lo = q - 128 hi in
// [-64, 63], so q = 128 hi + lo.
void q15_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = q15_parts(dst, kp);
  int8_t* lo = row.lo;
  float* d = row.d;
  int32_t* s16 = row.s16;
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
    float db = 0.0f;  // all-zero group: q = 0
    if (!x.finite) {
      db = __builtin_nanf("");  // inf/NaN input: the outputs that read it are NaN, as in the bf16 path
    } else if (x.amax > 0.0f) {
      const Q15Scale sc = q15_scale(x.amax);
      const __m512 f1 = _mm512_set1_ps(sc.f1), f2 = _mm512_set1_ps(sc.f2);
      q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x.x0, f1), f2));  // round to nearest even
      q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x.x1, f1), f2));
      db = sc.d;
    }
    const __m512i h0 = _mm512_srai_epi32(_mm512_add_epi32(q0, _mm512_set1_epi32(64)), 7);
    const __m512i h1 = _mm512_srai_epi32(_mm512_add_epi32(q1, _mm512_set1_epi32(64)), 7);
    _mm_storeu_si128((__m128i*)(dst + b * 32), _mm512_cvtsepi32_epi8(h0));
    _mm_storeu_si128((__m128i*)(dst + b * 32 + 16), _mm512_cvtsepi32_epi8(h1));
    _mm_storeu_si128((__m128i*)(lo + b * 32), _mm512_cvtsepi32_epi8(_mm512_sub_epi32(q0, _mm512_slli_epi32(h0, 7))));
    _mm_storeu_si128((__m128i*)(lo + b * 32 + 16), _mm512_cvtsepi32_epi8(_mm512_sub_epi32(q1, _mm512_slli_epi32(h1, 7))));
    d[b] = db;
    s16[2 * b] = _mm512_reduce_add_epi32(q0);
    s16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
#elif defined(__AVX2__)
namespace lk {
namespace LK_CAT(tier_, LK_TIER) {

namespace {
// 32 int32 codes (4 x 8, in order) -> 32 bytes at dst (|q| <= 127).
inline void store_codes32(const __m256i (&q)[4], int8_t* dst) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs work per 128-bit lane
  const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256((__m256i*)dst, _mm256_permutevar8x32_epi32(w, order));
}
inline int32_t hsum8(__m256i v) {
  int32_t s[8];
  _mm256_storeu_si256((__m256i*)s, v);
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}
// One group of 32 bf16 activations as fp32 (4 x 8), their max |x|, and whether every one is finite.
struct ActGroup32 {
  __m256 x[4];
  float amax;
  bool finite;
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
}  // namespace

// One bf16 row -> q8 row, as the AVX-512 tiers' q8_row computes it (the same d, codes and sums).
void q8_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = q8_parts(dst, kp);
  float *d = row.d, *ds = row.ds;
  int32_t* s16 = row.s16;
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    const __m256 inv = _mm256_set1_ps(x.amax > 0.0f ? 127.0f / x.amax : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x.x[i], inv));  // round to nearest even
    store_codes32(q, dst + b * 32);
    s16[2 * b] = hsum8(_mm256_add_epi32(q[0], q[1]));
    s16[2 * b + 1] = hsum8(_mm256_add_epi32(q[2], q[3]));
    const float db = x.finite ? x.amax / 127.0f : __builtin_nanf("");  // inf/NaN input: NaN outputs, as in the bf16 path
    d[b] = db;
    ds[b] = db * float(s16[2 * b] + s16[2 * b + 1]);
  }
}

// One bf16 row -> q15 row, as the AVX-512 tiers' q15_row computes it (the same power-of-two d, hi, lo and sums).
void q15_row(const uint16_t* src, int kp, int8_t* dst) {
  const IntRow row = q15_parts(dst, kp);
  int8_t* lo = row.lo;
  float* d = row.d;
  int32_t* s16 = row.s16;
  for (int b = 0; b < kp / kQ8Group; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    __m256i q[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    float db = 0.0f;  // all-zero group: q = 0
    if (!x.finite) {
      db = __builtin_nanf("");  // inf/NaN input: the outputs that read it are NaN, as in the bf16 path
    } else if (x.amax > 0.0f) {
      const Q15Scale sc = q15_scale(x.amax);
      const __m256 f1 = _mm256_set1_ps(sc.f1), f2 = _mm256_set1_ps(sc.f2);
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(x.x[i], f1), f2));
      db = sc.d;
    }
    __m256i h[4], l[4];
    for (int i = 0; i < 4; ++i) {
      h[i] = _mm256_srai_epi32(_mm256_add_epi32(q[i], _mm256_set1_epi32(64)), 7);
      l[i] = _mm256_sub_epi32(q[i], _mm256_slli_epi32(h[i], 7));
    }
    store_codes32(h, dst + b * 32);
    store_codes32(l, lo + b * 32);
    d[b] = db;
    s16[2 * b] = hsum8(_mm256_add_epi32(q[0], q[1]));
    s16[2 * b + 1] = hsum8(_mm256_add_epi32(q[2], q[3]));
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
#endif  // LK_V512 / __AVX2__
