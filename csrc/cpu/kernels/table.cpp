// The tier's KernelTable: the dispatch on the task's weights (one kernel file per format family) and
// the row conversions.
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

#define LK_STR2(x) #x
#define LK_STR(x) LK_STR2(x)
constexpr const char* kTierName = LK_STR(LK_TIER);

// Quantized formats: decode on the vector tiles; prefill on dequantized panels (through AMX on the amx
// tier, with segment scales: fp8_block and int4 groups, applied to the tiles' partial sums per segment).
void gate_up(const GateUpTask& t) {
  if (std::holds_alternative<Fp8Weights>(t.quant)) return gate_up_fp8(t);
  if (std::holds_alternative<Int4Weights>(t.quant)) return gate_up_q4(t);
  if (std::holds_alternative<Fp4Weights>(t.quant)) return gate_up_fp4(t);
  gate_up_bf16(t);
}
void down(const DownTask& t) {
  if (std::holds_alternative<Fp8Weights>(t.quant)) return down_fp8(t);
  if (std::holds_alternative<Int4Weights>(t.quant)) return down_q4(t);
  if (std::holds_alternative<Fp4Weights>(t.quant)) return down_fp4(t);
  down_bf16(t);
}

// ---------------------------------------------------------------- row conversions
void to_bf16(const void* src, DType src_type, uint16_t* dst, int n, int n_padded) {
  if (src_type == DType::kBF16) {
    memcpy(dst, src, size_t(n) * 2);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    int i = 0;
#if defined(LK_V512)
    for (; i + 16 <= n; i += 16) {
      __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + i)));
      _mm256_storeu_si256((__m256i*)(dst + i), f32_to_bf16_v(f));
    }
#endif
    for (; i < n; ++i) dst[i] = f32_to_bf16(f16_to_f32(s[i]));
  }
  for (int i = n; i < n_padded; ++i) dst[i] = 0;
}

void store_row(const float* src, void* dst, DType dst_type, int n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  int i = 0;
  if (dst_type == DType::kBF16) {
#if defined(LK_V512)
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i*)(d + i), f32_to_bf16_v(_mm512_loadu_ps(src + i)));
#elif defined(__AVX2__)
    for (; i + 16 <= n; i += 16) store_bf16_16(src + i, d + i);
#endif
    for (; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else if (dst_type == DType::kFP16) {
#if defined(LK_V512)
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256((__m256i*)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128((__m128i*)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else {
    memcpy(dst, src, size_t(n) * 4);
  }
}

uint64_t read_sum(const void* src, size_t n) {
#if defined(LK_V512)
  const char* p = static_cast<const char*>(src);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    s0 = _mm512_add_epi64(s0, _mm512_loadu_si512((const void*)(p + i)));
    s1 = _mm512_add_epi64(s1, _mm512_loadu_si512((const void*)(p + i + 64)));
    s2 = _mm512_add_epi64(s2, _mm512_loadu_si512((const void*)(p + i + 128)));
    s3 = _mm512_add_epi64(s3, _mm512_loadu_si512((const void*)(p + i + 192)));
  }
  for (; i + 64 <= n; i += 64) s0 = _mm512_add_epi64(s0, _mm512_loadu_si512((const void*)(p + i)));
  s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
  return uint64_t(_mm512_reduce_add_epi64(s0));
#elif defined(__AVX2__)
  const char* p = static_cast<const char*>(src);
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i*)(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i*)(p + i + 32)));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i*)(p + i + 64)));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i*)(p + i + 96)));
  }
  s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  uint64_t out[4];
  _mm256_storeu_si256((__m256i*)out, s0);
  return out[0] + out[1] + out[2] + out[3];
#else
  const uint64_t* p = static_cast<const uint64_t*>(src);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  return s0 + s1 + s2 + s3;
#endif
}

#if defined(LK_AMX)
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, &q8_row, &q15_row, false};
#elif defined(LK_V512)
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, &q8_row, &q15_row, true};
#elif defined(__AVX2__)
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, &q8_row, &q15_row, true};
#else
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, nullptr, nullptr, false};
#endif

}  // namespace

const KernelTable* kernel_table() { return &kTable; }

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
