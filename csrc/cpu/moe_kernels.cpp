// Expert micro-kernels, compiled once per ISA tier (see CMakeLists.txt).
//
// LK_TIER names the tier (generic, avx2, avx512, avx512_bf16, amx); the code
// below picks its instructions from the compiler's target macros, so the same
// source yields every tier. Everything sits in an anonymous namespace inside
// lk::tier_<name>: no symbol of one tier can be merged with another tier's
// (which would let an AVX-512 body run on a CPU without AVX-512). For the same
// reason nothing here calls inline functions from the standard library.
//
// Kernels (all accumulate in fp32):
// - dot_tile<MR, NB>: MR token rows x NB packed blocks (16 outputs each), the
//   workhorse of decode (memory bound: each weight byte is loaded once per
//   forward) and of prefill on tiers without AMX.
// - amx_tile_32x32 (amx tier): 32 rows x 2 blocks with tdpbf16ps, used once an
//   expert has >= kAmxMinRows tokens; amx_tile_32x32_seg with per-segment scales.
// - quantized prefill on the AVX-512 tiers: each block (pair) dequantized whole into a bf16
//   panel, then dot_tile (segment scales in registers) or the AMX tiles over all of K.
// - int4 (wna16_int4): dot_tile_q4q8 (int8 activations, vpdpbusd) or dot_tile_q4 for decode
//   (see the int4 section).
// - mxfp4 (gpt-oss) and nvfp4 (ModelOpt): dot_tile_fp4 / dot_tile_fp4_int for decode
//   (see the mxfp4 section).
#include <cmath>
#include <cstring>

#include "cpu/kernel_table.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define LK_CAT2(a, b) a##b
#define LK_CAT(a, b) LK_CAT2(a, b)

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LK_V512 1
#endif
#if defined(__AVX512BF16__)
#define LK_VBF16 1
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define LK_AMX 1
#endif

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

#define LK_STR2(x) #x
#define LK_STR(x) LK_STR2(x)
constexpr const char* kTierName = LK_STR(LK_TIER);

template <typename T>
inline T tmin(T a, T b) { return a < b ? a : b; }

// A range of cache lines to pull into L2 while a compute-bound tile runs: the next block's
// weights, so that they do not arrive at DRAM speed when the next tile needs them.
struct Prefetch {
  const char* p = nullptr;
  int lines = 0;
};

// ---------------------------------------------------------------- scalar conversions
inline float bf16_to_f32(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (incl. inf) after rounding
  if (au < 0x38800000u) {                                 // subnormal or zero in fp16
    if (au < 0x33000000u) return uint16_t(sign);
    uint32_t e = au >> 23;
    uint32_t m = (au & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (127-15) - e + 1 ... shift to the 10-bit field
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t r = au + 0xfffu + ((au >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15, round
  return uint16_t(sign | (r >> 13));
}

// fp8 e4m3fn -> bf16, exact: every e4m3 value has a bf16 twin (4 significant bits, exponents
// 2^-9 .. 2^8). Subnormals (exponent field 0) come from a table; 0x7f/0xff are NaN.
constexpr uint16_t kFp8SubnormalBf16[8] = {0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60};

inline uint16_t fp8_to_bf16_1(uint8_t b) {
  const uint16_t sign = uint16_t(b & 0x80) << 8;
  const uint16_t mag = b & 0x7F;
  if (mag == 0x7F) return sign | 0x7FC0;
  if (mag < 8) return sign | kFp8SubnormalBf16[mag];
  return sign | uint16_t((mag << 4) + 0x3C00);
}

inline float silu_f32(float g, float e_neg_g) { return g / (1.0f + e_neg_g); }

// exp() for the activation: Cody-Waite reduction + degree-6 polynomial
// (relative error ~1.2e-7, below bf16's 3.9e-3 by far). Input clamped to the
// fp32 range; a NaN input still yields NaN in silu because silu multiplies by g.
constexpr float kExpHi = 88.3762626647949f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP2 = 0.5f, kP3 = 1.0f / 6, kP4 = 1.0f / 24, kP5 = 1.0f / 120, kP6 = 1.0f / 720;

// ---------------------------------------------------------------- SIMD bodies
#if defined(LK_V512)

// Decode prefetch in each block stream: near ones into L1 (dot_tile: 1.5 KiB ahead; the 4-bit tiles
// their own distances) and, in the quantized decode tiles, a far one into L2, g_decode_far_prefetch
// bytes ahead (kernel_table.h). Bytes in flight bound a core's share of the bandwidth (Little's law:
// bytes / DRAM latency); L1's few miss buffers cap what the near prefetch keeps in flight, L2 has
// more, and the hardware streamer stops at every 4 KiB page while the blocks are 6-32 KiB. At one
// byte per weight dot_tile's near prefetch had half of bf16's bytes in flight, and the codes ran at
// half of bf16's bandwidth on one core. 2-core Zen4 VM, Qwen3-30B-A3B layer, fp8_block M=1, 1 thread,
// 8 experts: 1.93-2.13 ms with the near one at 768 B; 1.54-1.64 at 1.5 KiB; 1.26-1.30 with the far one
// at 8 KiB too (near-only at 3-6 KiB: 1.31-1.38; the far one kept inside the block: 1.64-1.70, so
// crossing into the next block is most of its gain). bf16 gained nothing from a far prefetch (5-15%
// slower), so dot_tile's bf16 path has the near one only. A/Bs: benchmarks/moe_layer.py --decode-prefetch.
constexpr int kPrefetchNearBytes = 1536;

// The far prefetch distance of this forward, read once per tile (a relaxed load of a plain int: no
// library inline function here, see the top of this file).
inline int far_prefetch_bytes() { return __atomic_load_n(&g_decode_far_prefetch, __ATOMIC_RELAXED); }

inline __m512 exp_v(__m512 x) {
  // Bounds first: min/max return their second operand when either is NaN, so a NaN x stays NaN.
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), _mm512_max_ps(_mm512_set1_ps(-kExpHi), x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP6);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m256i f32_to_bf16_v(__m512 x) {
#if defined(LK_VBF16)
  return (__m256i)_mm512_cvtneps_pbh(x);
#else
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
#endif
}

inline __m512 bf16_to_f32_v(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// act[0:16] = silu(g) * u, as bf16
inline void silu_mul_16(const float* g, const float* u, uint16_t* out) {
  __m512 gv = _mm512_loadu_ps(g);
  __m512 e = exp_v(_mm512_sub_ps(_mm512_setzero_ps(), gv));
  __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  __m512 y = _mm512_mul_ps(s, _mm512_loadu_ps(u));
  _mm256_storeu_si256((__m256i*)out, f32_to_bf16_v(y));
}

inline void axpy_16(float w, const float* c, float* o) {
  _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(c), _mm512_loadu_ps(o)));
}

// 32 fp8 e4m3fn codes -> 32 bf16 (exact; see fp8_to_bf16_1). The bytes are sign-extended, so one
// shift and one mask put the sign at bit 15 and the 7 magnitude bits at bf16's exponent/mantissa
// fields; adding 120 to the exponent rebases e4m3's bias 7 to bf16's 127 (no carry into the sign:
// 15 + 120 < 256). Exponent field 0 (zero and the subnormals m * 2^-9) takes the table, indexed by
// the low bits of the word (its exponent bits 3-4 are 0 there), and gets its sign back in the final
// OR, which normal lanes already have. 0x7f / 0xff are NaN. 10 vector ops (12 before).
inline __m512i fp8x32_to_bf16(__m256i bytes) {
  const __m512i lut = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0x0000);
  const __m512i v = _mm512_cvtepi8_epi16(bytes);
  __m512i r = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(v, 4), _mm512_set1_epi16(int16_t(0x87F0))),
                               _mm512_set1_epi16(0x3C00));
  r = _mm512_mask_permutexvar_epi16(r, _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x78)), v, lut);
  const __mmask32 nan = _mm256_cmpeq_epi8_mask(_mm256_or_si256(bytes, _mm256_set1_epi8(int8_t(0x80))), _mm256_set1_epi8(-1));
  r = _mm512_mask_mov_epi16(r, nan, _mm512_set1_epi16(0x7FC0));
  return _mm512_ternarylogic_epi32(r, v, _mm512_set1_epi16(int16_t(0x8000)), 0xF8);  // r | (v & sign)
}

// One packed pair-row (16 outputs x 2 inputs) of a block as bf16: 64 bytes of bf16 weights, or
// 32 bytes of fp8 converted in registers (FP8 decode streams 1 byte per weight this way).
// 32 int8 -> 32 bf16 (exact), order kept. With AVX512-BF16 one vcvtne2ps2bf16 packs the two fp32
// halves (exact: |v| <= 128 has at most 8 significant bits); without it, shifts and narrowing moves.
inline __m512i int8x32_to_bf16(__m256i bytes) {
#if defined(LK_VBF16)
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1)));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
#else
  const __m512i w = _mm512_cvtepi8_epi16(bytes);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w, 1)));
  const __m256i l16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
  const __m256i h16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
  return _mm512_inserti64x4(_mm512_castsi256_si512(l16), h16, 1);
#endif
}

// What a block holds: bf16 values, or one-byte codes converted in registers.
enum Codes { kCodesBf16 = 0, kCodesFp8 = 1, kCodesInt8 = 2 };

template <int CODES>
inline __m512i load_pair_row(const void* block, int p) {
  if constexpr (CODES != kCodesBf16) {
    const __m256i raw = _mm256_loadu_si256((const __m256i*)(static_cast<const uint8_t*>(block) + p * 32));
    if constexpr (CODES == kCodesInt8) return int8x32_to_bf16(raw);
    else return fp8x32_to_bf16(raw);
  } else {
    return _mm512_loadu_si512((const void*)(static_cast<const uint16_t*>(block) + p * 32));
  }
}

inline __m512i bcast_pair(const uint16_t* a) {
  int32_t v;
  memcpy(&v, a, 4);
  return _mm512_set1_epi32(v);
}

// How a tile scales the partial sums of each `seg` inputs (the quantized formats' prefill panels).
enum SegScale { kSegNone = 0, kSegScalar = 1, kSegVector = 2 };

// C[r][j*16 + n] (ld 32) = sum_k A_r[k] * B_j[n][k]
// FP8: `b` points at fp8 blocks, converted in registers; with `scale` (per block, one fp32 per
// `seg` inputs) each segment's partial sums are scaled into the result in fp32.
// SEG: bf16 blocks (a dequantized prefill panel) whose segments of `seg` inputs are scaled into the
// result in fp32, by one scale per segment and block (kSegScalar: scale[j][s]) or by one per output
// row (kSegVector: scale[j][16 s + n]).
template <int MR, int NB, int CODES = kCodesBf16, int SEG = kSegNone>
inline void dot_tile(const uint16_t* const* a, const void* const* b, int kp, float* c, Prefetch pf,
                     int seg = 0, const float* const* scale = nullptr) {
  constexpr bool FP8 = CODES != kCodesBf16;   // one-byte codes (fp8 or int8)
  constexpr int kRowBytes = FP8 ? 32 : 64;  // bytes of one pair-row of a block
  __m512 acc[MR][NB], tot[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) acc[r][j] = tot[r][j] = _mm512_setzero_ps();
  const int npairs = kp / 2;
  const bool scaled = SEG != kSegNone || (FP8 && scale);
  const int seg_pairs = scaled ? seg / 2 : npairs;
  const int far = FP8 ? far_prefetch_bytes() : 0;
  const int every = pf.lines ? (npairs / pf.lines > 0 ? npairs / pf.lines : 1) : 0;
  int countdown = every, next_line = 0;
#define LK_TRICKLE_PREFETCH()                                                       \
  if (every && --countdown == 0) {                                                  \
    countdown = every;                                                              \
    if (next_line < pf.lines) _mm_prefetch(pf.p + 64 * next_line++, _MM_HINT_T1);  \
  }
  for (int p0 = 0, sidx = 0; p0 < npairs; p0 += seg_pairs, ++sidx) {
#if defined(LK_VBF16)
  for (int p = p0; p < p0 + seg_pairs; ++p) {
    LK_TRICKLE_PREFETCH()
    __m512i w[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      // The first row tile streams the block from DRAM: prefetch ahead (past the block end is harmless).
      _mm_prefetch(static_cast<const char*>(b[j]) + p * kRowBytes + kPrefetchNearBytes, _MM_HINT_T0);
      if (far && (p & 1) == 0) _mm_prefetch(static_cast<const char*>(b[j]) + p * kRowBytes + far, _MM_HINT_T1);
      w[j] = load_pair_row<CODES>(b[j], p);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512i av = bcast_pair(a[r] + 2 * p);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)av, (__m512bh)w[j]);
    }
  }
#else
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xffff0000u));
  for (int p = p0; p < p0 + seg_pairs; ++p) {
    LK_TRICKLE_PREFETCH()
    __m512 we[NB], wo[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(static_cast<const char*>(b[j]) + p * kRowBytes + kPrefetchNearBytes, _MM_HINT_T0);
      if (far && (p & 1) == 0) _mm_prefetch(static_cast<const char*>(b[j]) + p * kRowBytes + far, _MM_HINT_T1);
      __m512i w = load_pair_row<CODES>(b[j], p);
      we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      wo[j] = _mm512_castsi512_ps(_mm512_and_si512(w, hi_mask));
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512i av = bcast_pair(a[r] + 2 * p);
      __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(av, 16));
      __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(av, hi_mask));
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        acc[r][j] = _mm512_fmadd_ps(we[j], a0, acc[r][j]);
        acc[r][j] = _mm512_fmadd_ps(wo[j], a1, acc[r][j]);
      }
    }
  }
#endif
    if constexpr (FP8 || SEG != kSegNone) {
      if (scaled) {
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          const __m512 sv = SEG == kSegVector ? _mm512_loadu_ps(scale[j] + 16 * sidx) : _mm512_set1_ps(scale[j][sidx]);
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            tot[r][j] = _mm512_fmadd_ps(acc[r][j], sv, tot[r][j]);
            acc[r][j] = _mm512_setzero_ps();
          }
        }
      }
    }
  }
#undef LK_TRICKLE_PREFETCH
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + r * 32 + j * 16, scaled ? tot[r][j] : acc[r][j]);
}
constexpr int kMaxRows = 8;

#elif defined(__AVX2__)

inline __m256 exp_v(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(87.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));  // NaN stays NaN
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP6);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256i f32_to_bf16_32bit_lanes(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, qn, _mm256_castps_si256(nan));
}

// 16 fp32 -> 16 bf16
inline void store_bf16_16(const float* src, uint16_t* dst) {
  __m256i lo = f32_to_bf16_32bit_lanes(_mm256_loadu_ps(src));
  __m256i hi = f32_to_bf16_32bit_lanes(_mm256_loadu_ps(src + 8));
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
  _mm256_storeu_si256((__m256i*)dst, packed);
}

inline void silu_mul_16(const float* g, const float* u, uint16_t* out) {
  float y[16];
  for (int h = 0; h < 2; ++h) {
    __m256 gv = _mm256_loadu_ps(g + 8 * h);
    __m256 e = exp_v(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(s, _mm256_loadu_ps(u + 8 * h)));
  }
  store_bf16_16(y, out);
}

inline void axpy_16(float w, const float* c, float* o) {
  __m256 wv = _mm256_set1_ps(w);
  _mm256_storeu_ps(o, _mm256_fmadd_ps(wv, _mm256_loadu_ps(c), _mm256_loadu_ps(o)));
  _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(wv, _mm256_loadu_ps(c + 8), _mm256_loadu_ps(o + 8)));
}

template <int MR, int NB>
inline void dot_tile(const uint16_t* const* a, const void* const* bv, int kp, float* c, Prefetch pf,
                     int = 0, const float* const* = nullptr) {
  const uint16_t* const* b = reinterpret_cast<const uint16_t* const*>(bv);
  __m256 acc[MR][NB][2];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  const __m256i hi_mask = _mm256_set1_epi32(int32_t(0xffff0000u));
  const int npairs = kp / 2;
  for (int p = 0; p < npairs; ++p) {
    __m256 a0[MR], a1[MR];
    for (int r = 0; r < MR; ++r) {
      int32_t v;
      memcpy(&v, a[r] + 2 * p, 4);
      __m256i av = _mm256_set1_epi32(v);
      a0[r] = _mm256_castsi256_ps(_mm256_slli_epi32(av, 16));
      a1[r] = _mm256_castsi256_ps(_mm256_and_si256(av, hi_mask));
    }
    for (int j = 0; j < NB; ++j) {
      for (int h = 0; h < 2; ++h) {
        __m256i w = _mm256_loadu_si256((const __m256i*)(b[j] + p * 32 + h * 16));
        __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, hi_mask));
        for (int r = 0; r < MR; ++r) {
          acc[r][j][h] = _mm256_fmadd_ps(we, a0[r], acc[r][j][h]);
          acc[r][j][h] = _mm256_fmadd_ps(wo, a1[r], acc[r][j][h]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) {
      _mm256_storeu_ps(c + r * 32 + j * 16, acc[r][j][0]);
      _mm256_storeu_ps(c + r * 32 + j * 16 + 8, acc[r][j][1]);
    }
}
constexpr int kMaxRows = 2;

#else  // generic: portable C++ (the compiler may use baseline SSE2)

inline void silu_mul_16(const float* g, const float* u, uint16_t* out) {
  for (int n = 0; n < 16; ++n) {
    float gv = g[n];
    float e = __builtin_expf(-(gv < -kExpHi ? -kExpHi : (gv > kExpHi ? kExpHi : gv)));
    out[n] = f32_to_bf16(silu_f32(gv, e) * u[n]);
  }
}

inline void axpy_16(float w, const float* c, float* o) {
  for (int n = 0; n < 16; ++n) o[n] += w * c[n];
}

template <int MR, int NB>
inline void dot_tile(const uint16_t* const* a, const void* const* bv, int kp, float* c, Prefetch pf,
                     int = 0, const float* const* = nullptr) {
  const uint16_t* const* b = reinterpret_cast<const uint16_t* const*>(bv);
  float acc[MR][NB * 16];
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NB * 16; ++n) acc[r][n] = 0.0f;
  const int npairs = kp / 2;
  for (int p = 0; p < npairs; ++p) {
    float a0[MR], a1[MR];
    for (int r = 0; r < MR; ++r) {
      a0[r] = bf16_to_f32(a[r][2 * p]);
      a1[r] = bf16_to_f32(a[r][2 * p + 1]);
    }
    for (int j = 0; j < NB; ++j) {
      const uint16_t* w = b[j] + p * 32;
      for (int n = 0; n < 16; ++n) {
        float w0 = bf16_to_f32(w[2 * n]), w1 = bf16_to_f32(w[2 * n + 1]);
        for (int r = 0; r < MR; ++r) acc[r][j * 16 + n] += a0[r] * w0 + a1[r] * w1;
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NB * 16; ++n) c[r * 32 + n] = acc[r][n];
}
constexpr int kMaxRows = 4;

#endif

// n (multiple of 32) fp8 e4m3fn values -> bf16.
inline void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int n) {
  int i = 0;
#if defined(LK_V512)
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch((const char*)(src + i + 512), _MM_HINT_T0);
    _mm512_storeu_si512((void*)(dst + i), fp8x32_to_bf16(_mm256_loadu_si256((const __m256i*)(src + i))));
  }
#elif defined(__AVX2__)
  // pshufb table: low bytes of the subnormal bf16 values in 0..7, high bytes in 8..15.
  const __m256i lut = _mm256_setr_epi8(0x00, 0x00, int8_t(0x80), int8_t(0xC0), 0x00, 0x20, 0x40, 0x60,
                                       0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C,
                                       0x00, 0x00, int8_t(0x80), int8_t(0xC0), 0x00, 0x20, 0x40, 0x60,
                                       0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C);
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch((const char*)(src + i + 512), _MM_HINT_T0);
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(src + i)));
    const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi16(0x7F));
    __m256i r = _mm256_add_epi16(_mm256_slli_epi16(mag, 4), _mm256_set1_epi16(0x3C00));
    const __m256i idx = _mm256_or_si256(_mm256_and_si256(mag, _mm256_set1_epi16(0x0F)),
                                        _mm256_slli_epi16(_mm256_add_epi16(_mm256_and_si256(mag, _mm256_set1_epi16(0x07)),
                                                                           _mm256_set1_epi16(8)), 8));
    const __m256i sub = _mm256_shuffle_epi8(lut, idx);
    r = _mm256_blendv_epi8(r, sub, _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi16(0x7FC0), _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F)));
    r = _mm256_or_si256(r, _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
    _mm256_storeu_si256((__m256i*)(dst + i), r);
  }
#endif
  for (; i < n; ++i) dst[i] = fp8_to_bf16_1(src[i]);
}

// n int8 values -> bf16 (exact: |v| <= 128 has at most 8 significant bits).
inline void int8_to_bf16(const uint8_t* src, uint16_t* dst, int n) {
  int i = 0;
#if defined(LK_V512)
  for (; i + 16 <= n; i += 16) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + i))));
    _mm256_storeu_si256((__m256i*)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_bf16(float(int8_t(src[i])));
}

inline void dequant_bf16(const Fp8Weights& q, const uint8_t* src, uint16_t* dst, int n) {
  if (q.int8) int8_to_bf16(src, dst, n);
  else fp8_to_bf16(src, dst, n);
}

// o[n] += w * c[n] * v[n] (per-row scales), and c[n] *= v[n].
inline void axpy_vec_16(float w, const float* c, const float* v, float* o) {
#if defined(LK_V512)
  const __m512 cv = _mm512_mul_ps(_mm512_set1_ps(w), _mm512_loadu_ps(c));
  _mm512_storeu_ps(o, _mm512_fmadd_ps(cv, _mm512_loadu_ps(v), _mm512_loadu_ps(o)));
#else
  for (int n = 0; n < 16; ++n) o[n] += w * c[n] * v[n];
#endif
}
inline void mul_16(float* c, const float* v) {
#if defined(LK_V512)
  _mm512_storeu_ps(c, _mm512_mul_ps(_mm512_loadu_ps(c), _mm512_loadu_ps(v)));
#else
  for (int n = 0; n < 16; ++n) c[n] *= v[n];
#endif
}

// Runtime row count -> compile-time tile.
template <int NB>
void dot_rows(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, Prefetch pf = {}) {
  switch (mr) {
    case 1: dot_tile<1, NB>(a, b, kp, c, pf); break;
#if defined(LK_V512)
    case 2: dot_tile<2, NB>(a, b, kp, c, pf); break;
    case 3: dot_tile<3, NB>(a, b, kp, c, pf); break;
    case 4: dot_tile<4, NB>(a, b, kp, c, pf); break;
    case 5: dot_tile<5, NB>(a, b, kp, c, pf); break;
    case 6: dot_tile<6, NB>(a, b, kp, c, pf); break;
    case 7: dot_tile<7, NB>(a, b, kp, c, pf); break;
    default: dot_tile<8, NB>(a, b, kp, c, pf); break;
#elif defined(__AVX2__)
    default: dot_tile<2, NB>(a, b, kp, c, pf); break;
#else
    case 2: dot_tile<2, NB>(a, b, kp, c, pf); break;
    case 3: dot_tile<3, NB>(a, b, kp, c, pf); break;
    default: dot_tile<4, NB>(a, b, kp, c, pf); break;
#endif
  }
}

// The share of `bytes` at `next` that row tile `tile` of `tiles` should prefetch.
inline Prefetch tile_share(const void* next, size_t bytes, int tile, int tiles) {
  Prefetch pf;
  if (!next || tiles < 2) return pf;  // a lone tile is streaming anyway
  const int lines = int(bytes / 64);
  const int per = (lines + tiles - 1) / tiles;
  const int first = tile * per;
  pf.p = static_cast<const char*>(next) + size_t(first) * 64;
  pf.lines = tmin(per, lines - first);
  if (pf.lines < 0) pf.lines = 0;
  return pf;
}

#if defined(LK_V512)
// FP8 blocks converted in registers, whole block with its segment scales (decode: few rows).
// The byte formats (fp8_block; fp8_channel / int8_channel with one scale per row) stream one byte
// per weight and widen it to bf16 in registers, exact, with bf16 activations (no activation
// rounding beyond the bf16 input). H200 host (16-core Xeon, AMX tier, 16 threads, 2026-12-01,
// benchmarks/moe_layer.py --shapes qwen3-30b-a3b --tokens 1,4, docs/results/2026-12-01_h200_session6.log),
// fraction of the read bandwidth measured in the same run, M=1 / M=4: fp8_block 0.76 / 0.84,
// fp8_channel 0.72 / 0.83, int8_channel 0.73 / 0.92 (bf16: 1.04 / 1.17; M=1 0.46-0.56 ms against
// bf16's 0.70 for half the bytes, so per-forward costs weigh more there than the conversion does).
constexpr int kFusedFp8Rows = 4;
template <int NB, int CODES>
void dot_rows_codes(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, int seg,
                    const float* const* scale) {
  switch (mr) {
    case 1: dot_tile<1, NB, CODES>(a, b, kp, c, {}, seg, scale); break;
    case 2: dot_tile<2, NB, CODES>(a, b, kp, c, {}, seg, scale); break;
    case 3: dot_tile<3, NB, CODES>(a, b, kp, c, {}, seg, scale); break;
    default: dot_tile<4, NB, CODES>(a, b, kp, c, {}, seg, scale); break;
  }
}
template <int NB>
void dot_rows_fp8(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, int seg,
                  const float* const* scale, bool int8_codes) {
  if (int8_codes) dot_rows_codes<NB, kCodesInt8>(mr, a, b, kp, c, seg, scale);
  else dot_rows_codes<NB, kCodesFp8>(mr, a, b, kp, c, seg, scale);
}

// Prefill of the quantized formats (rows beyond the fused decode tiles): each block (pair) is
// dequantized whole, once per task, into a bf16 panel in the bf16 format's block layout (exact: the
// codes, or code x scale where that product is exact), and every row tile then runs the bf16 tile
// over all of K, the remaining scales applied in fp32: per segment in registers (fp8_block, int4
// groups) or once per result (per-row scales). One pass per row tile and no partial sums through
// memory, where the earlier per-segment loop paid a tile start, a store and an add per segment
// (int4 group 32: one per 32 inputs). Tiles with segment scales hold two accumulator sets: 6 rows.
constexpr int kSegTileRows = 6;
template <int NB, int SEG>
void dot_rows_seg(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, int seg,
                  const float* const* scale, Prefetch pf) {
  switch (mr) {
    case 1: dot_tile<1, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
    case 2: dot_tile<2, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
    case 3: dot_tile<3, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
    case 4: dot_tile<4, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
    case 5: dot_tile<5, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
    default: dot_tile<6, NB, kCodesBf16, SEG>(a, b, kp, c, pf, seg, scale); break;
  }
}

// The two bf16 panels of a task's scratch (2 x 16 x kp each way) and the fp32 segment scales after them.
inline uint16_t* panel_of(const KernelScratch& s, int kp, int h) { return s.deq + size_t(h) * kBlockN * kp; }
inline float* panel_scales(const KernelScratch& s, int kp) {
  return reinterpret_cast<float*>(s.deq + size_t(2) * kBlockN * kp);
}

#if defined(LK_AMX)
// AMX: 4 accumulator tiles (2 row tiles x 2 column blocks), 2 A tiles, 2 B tiles.
constexpr int kAmxMinRows = 16;
constexpr int kAmxPrefetchK = 64;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline void amx_configure() {
  TileConfig cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Accumulator tiles 0-3 += A (32 rows, stride lda elements) x [B0 | B1] over inputs [k0, k1).
inline void amx_accumulate(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int k0, int k1) {
  const size_t stride = lda * 2;
  for (int k = k0; k < k1; k += 32) {
    // Weights stream from DRAM when few rows share them: fetch two k-steps (2 x 1 KiB) ahead.
    const uint16_t* p0 = b0 + size_t(k + kAmxPrefetchK) * 16;
    const uint16_t* p1 = b1 + size_t(k + kAmxPrefetchK) * 16;
    for (int l = 0; l < 16; ++l) {
      _mm_prefetch((const char*)(p0 + l * 32), _MM_HINT_T0);
      _mm_prefetch((const char*)(p1 + l * 32), _MM_HINT_T0);
    }
    _tile_loadd(4, a + k, stride);
    _tile_loadd(5, a + 16 * lda + k, stride);
    _tile_loadd(6, b0 + size_t(k) * 16, 64);
    _tile_loadd(7, b1 + size_t(k) * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

inline void amx_zero() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// The accumulator tiles to C (32 x 32 fp32, ld 32).
inline void amx_store(float* c) {
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 16 * 32, 128);
  _tile_stored(3, c + 16 * 32 + 16, 128);
}

// C (32 x 32, ld 32) = A (32 rows, stride lda elements) x [B0 | B1]
inline void amx_tile_32x32(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int kp, float* c) {
  amx_zero();
  amx_accumulate(a, lda, b0, b1, 0, kp);
  amx_store(c);
}

// amx_tile_32x32 with segment scales (SEG as dot_tile's): each `seg` inputs (a multiple of 32) the four
// accumulator tiles go to `tmp` (32 x 32 fp32) and are added into C scaled, in fp32.
template <int SEG>
inline void amx_tile_32x32_seg(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int kp,
                               int seg, const float* const* scale, float* c, float* tmp) {
  for (int r = 0; r < 32; ++r) {
    _mm512_storeu_ps(c + r * 32, _mm512_setzero_ps());
    _mm512_storeu_ps(c + r * 32 + 16, _mm512_setzero_ps());
  }
  for (int k0 = 0, sidx = 0; k0 < kp; k0 += seg, ++sidx) {
    amx_zero();
    amx_accumulate(a, lda, b0, b1, k0, k0 + seg);
    amx_store(tmp);
    for (int h = 0; h < 2; ++h) {
      const __m512 sv = SEG == kSegVector ? _mm512_loadu_ps(scale[h] + 16 * sidx) : _mm512_set1_ps(scale[h][sidx]);
      for (int r = 0; r < 32; ++r) {
        float* o = c + r * 32 + h * 16;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(tmp + r * 32 + h * 16), sv, _mm512_loadu_ps(o)));
      }
    }
  }
}

// One 32-row tile over a block pair's panels, scaled per segment as SEG says (tmp: 32 x 32 fp32).
template <int SEG>
inline void amx_panel_tile(const uint16_t* a, size_t lda, const void* const* b, int kp, int seg,
                           const float* const* scale, float* c, float* tmp) {
  const auto* b0 = static_cast<const uint16_t*>(b[0]);
  const auto* b1 = static_cast<const uint16_t*>(b[1]);
  if constexpr (SEG == kSegNone) amx_tile_32x32(a, lda, b0, b1, kp, c);
  else amx_tile_32x32_seg<SEG>(a, lda, b0, b1, kp, seg, scale, c, tmp);
}

// The unit's token rows gathered once into a tile-strided panel (rows up to the tile height zeroed).
inline void amx_gather_rows(const GateUpTask& t) {
  const int mt = (t.m + 31) / 32 * 32;
  for (int r = 0; r < mt; ++r) {
    if (r < t.m) memcpy(t.scratch->panel + size_t(r) * t.kp, t.x_rows[r], size_t(t.kp) * 2);
    else memset(t.scratch->panel + size_t(r) * t.kp, 0, size_t(t.kp) * 2);
  }
}
#endif  // LK_AMX

// Row tiles of a gate/up task over the panels of block pair j; fin(c, r) takes row r's 32 results.
// Meanwhile the tiles trickle the next block pair's codes (`next`, `next_bytes`) into L2, so that its
// dequantization does not wait on DRAM (the bf16 path does the same for its weights). On the amx tier
// the task's rows are gathered into the tile panel with its first block pair (j == 0).
template <int SEG, typename Fin>
void gate_up_panel(const GateUpTask& t, int j, int seg, const float* sg, const float* su, const void* next,
                   size_t next_bytes, Fin&& fin) {
  float* c = t.scratch->c;
  const void* b[2] = {panel_of(*t.scratch, t.kp, 0), panel_of(*t.scratch, t.kp, 1)};
  const float* sc[2] = {sg, su};
  constexpr int R = SEG == kSegNone ? kMaxRows : kSegTileRows;
#if defined(LK_AMX)
  if (t.m >= kAmxMinRows) {
    if (j == 0) amx_gather_rows(t);
    amx_configure();
    for (int r0 = 0; r0 < t.m; r0 += 32) {
      amx_panel_tile<SEG>(t.scratch->panel + size_t(r0) * t.kp, t.kp, b, t.kp, seg, sc, c, t.scratch->acc);
      for (int r = 0; r < tmin(32, t.m - r0); ++r) fin(c + r * 32, r0 + r);
    }
    _tile_release();
    return;
  }
#endif
  const int tiles = (t.m + R - 1) / R;
  for (int r0 = 0, tile = 0; r0 < t.m; r0 += R, ++tile) {
    const int mr = tmin(R, t.m - r0);
    const Prefetch pf = tile_share(next, next_bytes, tile, tiles);
    if constexpr (SEG == kSegNone) dot_rows<2>(mr, t.x_rows + r0, b, t.kp, c, pf);
    else dot_rows_seg<2, SEG>(mr, t.x_rows + r0, b, t.kp, c, seg, sc, pf);
    for (int r = 0; r < mr; ++r) fin(c + r * 32, r0 + r);
  }
}

// Row tiles of a down task over the panels of blocks j and j + nb - 1: row r's results times its
// router weight x gs (and x row_scale[h][n], per-row formats) are added to its out_acc row; the
// tiles trickle the next blocks' codes into L2 as gate_up_panel does.
template <int SEG>
void down_panel(const DownTask& t, int j, int nb, int seg, const float* const* seg_scale,
                const float* const* row_scale, float gs, const void* next, size_t next_bytes) {
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  const void* b[2] = {panel_of(*t.scratch, t.kp, 0), panel_of(*t.scratch, t.kp, nb - 1)};
  constexpr int R = SEG == kSegNone ? kMaxRows : kSegTileRows;
#if defined(LK_AMX)
  if (t.m >= kAmxMinRows) {  // act rows past m are readable slack, as in down()
    amx_configure();
    for (int r0 = 0; r0 < t.m; r0 += 32) {
      amx_panel_tile<SEG>(t.act + size_t(r0) * t.act_ld, t.act_ld, b, t.kp, seg, seg_scale, c, t.scratch->acc);
      for (int r = 0; r < tmin(32, t.m - r0); ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        const float w = t.row_weight[r0 + r] * gs;
        for (int h = 0; h < nb; ++h) {
          if (row_scale) axpy_vec_16(w, c + r * 32 + h * 16, row_scale[h], o + h * 16);
          else axpy_16(w, c + r * 32 + h * 16, o + h * 16);
        }
      }
    }
    _tile_release();
    return;
  }
#endif
  const int tiles = (t.m + R - 1) / R;
  for (int r0 = 0, tile = 0; r0 < t.m; r0 += R, ++tile) {
    const int mr = tmin(R, t.m - r0);
    for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld;
    const Prefetch pf = tile_share(next, next_bytes, tile, tiles);
    if constexpr (SEG == kSegNone) {
      if (nb == 2) dot_rows<2>(mr, rows, b, t.kp, c, pf);
      else dot_rows<1>(mr, rows, b, t.kp, c, pf);
    } else {
      if (nb == 2) dot_rows_seg<2, SEG>(mr, rows, b, t.kp, c, seg, seg_scale, pf);
      else dot_rows_seg<1, SEG>(mr, rows, b, t.kp, c, seg, seg_scale, pf);
    }
    for (int r = 0; r < mr; ++r) {
      float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
      const float w = t.row_weight[r0 + r] * gs;
      for (int h = 0; h < nb; ++h) {
        if (row_scale) axpy_vec_16(w, c + r * 32 + h * 16, row_scale[h], o + h * 16);
        else axpy_16(w, c + r * 32 + h * 16, o + h * 16);
      }
    }
  }
}
#else
constexpr int kFusedFp8Rows = 0;
template <int NB>
void dot_rows_fp8(int, const uint16_t* const*, const void* const*, int, float*, int, const float* const*, bool) {}
#endif

// Blocks outer, rows inner: the block pair (2 x kp x 32 bytes) stays in L2 while every row
// tile of the unit passes, so the weights leave DRAM once per unit and rows come from L2;
// meanwhile the row tiles trickle-prefetch the next block pair.
void gate_up_vec(const GateUpTask& t) {
  float* c = t.scratch->c;
  const size_t block = size_t(t.kp) * kBlockN;
  const int tiles = (t.m + kMaxRows - 1) / kMaxRows;
  for (int j = 0; j < t.nblk; ++j) {
    const void* b[2] = {t.w13 + size_t(j) * 2 * block, t.w13 + size_t(j) * 2 * block + block};
    const uint16_t* next = j + 1 < t.nblk ? t.w13 + size_t(j + 1) * 2 * block : nullptr;
    for (int r0 = 0, tile = 0; r0 < t.m; r0 += kMaxRows, ++tile) {
      const int mr = tmin(kMaxRows, t.m - r0);
      dot_rows<2>(mr, t.x_rows + r0, b, t.kp, c, tile_share(next, 2 * block * 2, tile, tiles));
      for (int r = 0; r < mr; ++r)
        silu_mul_16(c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
    }
  }
}

// Block pairs outer, rows inner (as gate_up_vec); the accumulator rows stay in L2.
void down_vec(const DownTask& t) {
  float* c = t.scratch->c;
  const size_t block = size_t(t.kp) * kBlockN;
  const uint16_t* rows[kMaxRows];
  const int tiles = (t.m + kMaxRows - 1) / kMaxRows;
  for (int j = 0; j < t.nblk; j += 2) {
    const int nb = tmin(2, t.nblk - j);
    const void* b[2] = {t.w2 + size_t(j) * block, t.w2 + size_t(j + nb - 1) * block};
    const uint16_t* next = j + 2 < t.nblk ? t.w2 + size_t(j + 2) * block : nullptr;
    const size_t next_bytes = size_t(tmin(2, t.nblk - j - 2)) * block * 2;
    for (int r0 = 0, tile = 0; r0 < t.m; r0 += kMaxRows, ++tile) {
      const int mr = tmin(kMaxRows, t.m - r0);
      for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld;
      const Prefetch pf = tile_share(next, next_bytes, tile, tiles);
      if (nb == 2) dot_rows<2>(mr, rows, b, t.kp, c, pf);
      else dot_rows<1>(mr, rows, b, t.kp, c, pf);
      for (int r = 0; r < mr; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        for (int q = 0; q < nb; ++q) axpy_16(t.row_weight[r0 + r], c + r * 32 + q * 16, o + q * 16);
      }
    }
  }
}

// FP8 block weights: per `seg` inputs, dequantize the segment of the block (pair) exactly into
// L1, run the bf16 dot tile on it, and add scale x partial into fp32 sums. Same arithmetic as
// the bf16 path (the scales are applied in fp32), at ~3% extra per segment.
void gate_up_fp8(const GateUpTask& t) {
  const Fp8Weights& q = t.fp8;
  const int seg = q.seg, nseg = t.kp / seg;
  const int per = q.per_row ? kBlockN : nseg;  // scales per block
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  uint16_t* dg = t.scratch->deq;
  uint16_t* du = dg + seg * kBlockN;
  float* tot = t.scratch->acc;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* bu = bg + block_bytes;
    const float* sg = q.scale + size_t(j) * 2 * per;
    const float* su = sg + per;
    if (t.m <= kFusedFp8Rows) {  // few rows: codes converted in registers, block scales in the tile
      const void* b[2] = {bg, bu};
      const float* sc[2] = {sg, su};
      dot_rows_fp8<2>(t.m, t.x_rows, b, t.kp, c, seg, q.per_row ? nullptr : sc, q.int8);
      for (int r = 0; r < t.m; ++r) {
        if (q.per_row) {
          mul_16(c + r * 32, sg);
          mul_16(c + r * 32 + 16, su);
        }
        silu_mul_16(c + r * 32, c + r * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      }
      continue;
    }
#if defined(LK_V512)
    dequant_bf16(q, bg, panel_of(*t.scratch, t.kp, 0), t.kp * kBlockN);
    dequant_bf16(q, bu, panel_of(*t.scratch, t.kp, 1), t.kp * kBlockN);
    uint16_t* act = t.act + j * kBlockN;
    const void* next = j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr;
    if (q.per_row)
      gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, next, 2 * block_bytes, [&](float* g, int r) {
        mul_16(g, sg);
        mul_16(g + 16, su);
        silu_mul_16(g, g + 16, act + size_t(r) * t.act_ld);
      });
    else
      gate_up_panel<kSegScalar>(t, j, seg, sg, su, next, 2 * block_bytes,
                                [&](float* g, int r) { silu_mul_16(g, g + 16, act + size_t(r) * t.act_ld); });
    continue;
#endif
    memset(tot, 0, size_t(t.m) * 32 * 4);
    for (int s = 0; s < nseg; ++s) {  // many rows: dequantize each segment once, reuse it per row tile
      const size_t off = size_t(s) * seg * kBlockN;
      const void* b[2] = {dg, du};
      dequant_bf16(q, bg + off, dg, seg * kBlockN);
      dequant_bf16(q, bu + off, du, seg * kBlockN);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.x_rows[r0 + r] + size_t(s) * seg;
        dot_rows<2>(mr, rows, b, seg, c);
        for (int r = 0; r < mr; ++r) {
          float* o = tot + size_t(r0 + r) * 32;
          if (q.per_row) {
            axpy_vec_16(1.0f, c + r * 32, sg, o);
            axpy_vec_16(1.0f, c + r * 32 + 16, su, o + 16);
          } else {
            axpy_16(sg[s], c + r * 32, o);
            axpy_16(su[s], c + r * 32 + 16, o + 16);
          }
        }
      }
    }
    for (int r = 0; r < t.m; ++r)
      silu_mul_16(tot + size_t(r) * 32, tot + size_t(r) * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
  }
}

void down_fp8(const DownTask& t) {
  const Fp8Weights& q = t.fp8;
  const int seg = q.seg, nseg = t.kp / seg;
  const int per = q.per_row ? kBlockN : nseg;
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  uint16_t* d = t.scratch->deq;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
#if defined(LK_V512)
  if (t.m > kFusedFp8Rows) {
    for (int j = 0; j < t.nblk; j += 2) {
      const int nb = tmin(2, t.nblk - j);
      const float* sc[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
      for (int h = 0; h < nb; ++h)
        dequant_bf16(q, q.w + size_t(j + h) * block_bytes, panel_of(*t.scratch, t.kp, h), t.kp * kBlockN);
      const void* next = j + 2 < t.nblk ? q.w + size_t(j + 2) * block_bytes : nullptr;
      const size_t next_bytes = size_t(tmin(2, t.nblk - j - 2)) * block_bytes;
      if (q.per_row) down_panel<kSegNone>(t, j, nb, 0, nullptr, sc, 1.0f, next, next_bytes);
      else down_panel<kSegScalar>(t, j, nb, seg, sc, nullptr, 1.0f, next, next_bytes);
    }
    return;
  }
#endif
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* src = q.w + size_t(j) * block_bytes;
    const float* sc = q.scale + size_t(j) * per;
    if (t.m <= kFusedFp8Rows) {
      const void* b[2] = {src, src};
      const float* scs[2] = {sc, sc};
      for (int r = 0; r < t.m; ++r) rows[r] = t.act + size_t(r) * t.act_ld;
      dot_rows_fp8<1>(t.m, rows, b, t.kp, c, seg, q.per_row ? nullptr : scs, q.int8);
      for (int r = 0; r < t.m; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
        if (q.per_row) axpy_vec_16(t.row_weight[r], c + r * 32, sc, o);
        else axpy_16(t.row_weight[r], c + r * 32, o);
      }
      continue;
    }
    for (int s = 0; s < nseg; ++s) {
      const void* b[2] = {d, d};
      dequant_bf16(q, src + size_t(s) * seg * kBlockN, d, seg * kBlockN);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld + size_t(s) * seg;
        dot_rows<1>(mr, rows, b, seg, c);
        for (int r = 0; r < mr; ++r) {
          float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
          if (q.per_row) axpy_vec_16(t.row_weight[r0 + r], c + r * 32, sc, o);
          else axpy_16(t.row_weight[r0 + r] * sc[s], c + r * 32, o);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- int4 (wna16_int4)
// Strategy. Layout (kernel_table.h Int4Weights): octets of 64 bytes, byte 4n + j = inputs 8o + j (low
// nibble) and 8o + 4 + j (high nibble) of row n, so one cache line is 128 codes and one and (low) or
// shift + and (high) yields 16 dwords of 4 consecutive u8 codes per output row: the u8 operand of
// vpdpbusd, without widening anything to 16 bits.
// Decode, default (chunks of <= kQ8MaxTokens tokens on the AVX-512 tiers; LK_INT8_ACT=0, first named
// LK_WNA16_INT8_ACT, turns it off): the engine quantizes each activation row once per chunk (x before
// phase 1, act before phase 2) per 32 inputs to symmetric int8 (q8_row: d = max|x| / 127, llama.cpp's
// Q8_0 scheme); dot_tile_q4q8 accumulates u * q in int32 with vpdpbusd (vpmaddubsw + vpmaddwd on the avx512 tier,
// same integers: no saturation at |2 * 15 * 127|), converts every 32 inputs and multiplies by d in
// fp32, and per weight group subtracts z * sum(d * sum q) and applies the 16 row scales. About 5
// vector ops per 128 weights and row (against ~16 for the bf16 widening below); up to 4 rows share
// each weight load. Error: rel RMS of the layer output ~0.012 against the fp32 reference on the
// dequantized weights (exact path ~0.0035); budget and reasoning in tests/cpu/conftest.py.
// Decode, exact (LK_INT8_ACT=0, m <= kFusedQ4Rows, dot_tile_q4): each octet becomes 4 bf16
// pair-rows in registers (zero-extend, nibbles, vpermt2w into the block order, OR 0x4300 = bf16(128 +
// u) exactly); vdpbf16ps (or the even/odd fp32 split without AVX512-BF16) accumulates sum A (128 + u)
// in fp32 per group, then (128 + z) * sum A (row sums computed once per task) is subtracted and the
// group's 16 per-row scales applied in fp32.
// Prefill (more rows): u - z of the block (pair) dequantized to bf16 (exact: |u - z| <= 15; a 32-entry
// vpermw table on AVX-512), on the AVX-512 tiers whole into a panel with the group scales applied per
// segment by the tile (vector dot_tile, or AMX tiles on the amx tier; see "Prefill of the quantized
// formats"), on the generic/avx2 tiers one group at a time into L1, adding scale x partial into fp32 sums.
// Measured on the 2-core Zen4 dev VM (avx512_bf16, 2 threads, benchmarks/moe_layer.py --format
// wna16_int4 --shapes qwen3-30b-a3b, gs=128 sym; docs/results/2026-11-30_epyc2c_wna16_vnni_moe_layer.log):
// medians of 3 runs, before (bf16 widening) -> after: M=1 0.565 -> 0.535 ms (0.75 -> 0.78 of read
// bandwidth), M=4 2.14 -> 2.07 ms (0.75 -> 0.74), M=16 5.97 -> 5.74 ms (0.69 -> 0.74), with the VM's
// read bandwidth at 41-49 GB/s (it measured 81 GB/s on the day the old kernel reached 0.30).
// Hot weights (one expert, L3-resident, 1 thread): M=1 68 GB/s of quantized bytes per core (bf16
// widening: 49), M=4 2.3x and M=16 2.3x the bf16 path: decode is now bound by the weight stream
// (DRAM latency of short streams, hence decode units of 8 blocks), not by the unpacking.

constexpr int kQ8TileRows = 4;  // activation rows per int8-activation tile (int4 and fp4)

// bf16 bits of a small integer (exact for |v| < 256).
constexpr uint16_t bf16_of_int(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const int a = v < 0 ? -v : v;
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return uint16_t(sign | ((127 + e) << 7) | ((a << (7 - e)) & 0x7F));
}
// Index u - z taken mod 32 (what vpermw reads) -> bf16(u - z): entry i holds i (i < 16) or i - 32.
struct Q4Lut {
  uint16_t v[32];
};
constexpr Q4Lut make_q4_lut() {
  Q4Lut t{};
  for (int i = 0; i < 32; ++i) t.v[i] = bf16_of_int(i < 16 ? i : i - 32);
  return t;
}
constexpr Q4Lut kQ4Lut = make_q4_lut();

inline float scale_to_f32(uint16_t s, bool fp16) { return fp16 ? f16_to_f32(s) : bf16_to_f32(s); }

// 16 scales (bf16 or fp16 bits) -> fp32.
inline void scales_16(const uint16_t* s, bool fp16, float* out) {
#if defined(LK_V512)
  const __m256i v = _mm256_loadu_si256((const __m256i*)s);
  _mm512_storeu_ps(out, fp16 ? _mm512_cvtph_ps(v) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
#elif defined(__AVX2__)
  for (int h = 0; h < 2; ++h) {
    const __m128i v = _mm_loadu_si128((const __m128i*)(s + 8 * h));
    _mm256_storeu_ps(out + 8 * h, fp16 ? _mm256_cvtph_ps(v)
                                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
  }
#else
  for (int n = 0; n < 16; ++n) out[n] = scale_to_f32(s[n], fp16);
#endif
}

#if defined(LK_V512)
// 8 bytes of 16 zero points (nibble n%2 of byte n/2) -> 32 words: z_n at 2n and 2n + 1 (the zero
// point of output n for both inputs of a pair).
inline __m512i q4_zero_dwords(const uint8_t* z) {  // lane n: z_n
  int64_t v;
  memcpy(&v, z, 8);
  const __m128i idx = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i b32 = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi64_si128(v), idx));  // lane n: byte n/2
  const __m512i sh = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);     // lane n: 4 * (n % 2)
  return _mm512_and_si512(_mm512_srlv_epi32(b32, sh), _mm512_set1_epi32(15));
}
inline __m512i q4_zero_words(const uint8_t* z) {
  const __m512i z32 = q4_zero_dwords(z);
  return _mm512_or_si512(z32, _mm512_slli_epi32(z32, 16));
}
#endif

#if defined(LK_V512)
// Word indices that gather, from the nibbles of an octet zero-extended to words (A: bytes 0..31 =
// rows 0..7, B: bytes 32..63 = rows 8..15, word 4n + j), the pair-row of inputs (j0, j0 + 1) in the
// bf16 block order (word 2n + t), for vpermt2w over (A, B).
struct Q4Perm {
  uint16_t v[32];
};
constexpr Q4Perm make_q4_perm() {
  Q4Perm t{};
  for (int p = 0; p < 32; ++p) t.v[p] = uint16_t(p / 2 < 8 ? 4 * (p / 2) + p % 2 : 32 + 4 * (p / 2 - 8) + p % 2);
  return t;
}
constexpr Q4Perm kQ4Perm = make_q4_perm();

// One octet (8 inputs x 16 rows, 64 bytes) -> its 4 pair-rows (inputs 0-1, 2-3, 4-5, 6-7) as words
// holding the codes u in the bf16 block order (word 2n + t: row n, input 2p + t).
inline __attribute__((always_inline)) void q4_octet_words(const uint8_t* src, __m512i idx0, __m512i idx2,
                                                           __m512i (&pr)[4]) {
  const __m512i mask = _mm512_set1_epi16(0x0F);
  const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)src));
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(src + 32)));
  const __m512i la = _mm512_and_si512(a, mask), lb = _mm512_and_si512(b, mask);
  const __m512i ha = _mm512_srli_epi16(a, 4), hb = _mm512_srli_epi16(b, 4);
  pr[0] = _mm512_permutex2var_epi16(la, idx0, lb);
  pr[1] = _mm512_permutex2var_epi16(la, idx2, lb);
  pr[2] = _mm512_permutex2var_epi16(ha, idx0, hb);
  pr[3] = _mm512_permutex2var_epi16(ha, idx2, hb);
}
#endif

// One segment (seg inputs = seg/8 octets) of an int4 block -> bf16 block layout (seg/2 pair-rows of
// 32), values u - z exactly. zero: 8 bytes of 16 zero points, or null for the symmetric 8.
inline void q4_dequant_seg(const uint8_t* src, const uint8_t* zero, uint16_t* dst, int seg) {
  const int octets = seg / 8;
#if defined(LK_V512)
  const __m512i lut = _mm512_loadu_si512((const void*)kQ4Lut.v);
  const __m512i zv = zero ? q4_zero_words(zero) : _mm512_set1_epi16(8);
  const __m512i idx0 = _mm512_loadu_si512((const void*)kQ4Perm.v);
  const __m512i idx2 = _mm512_add_epi16(idx0, _mm512_set1_epi16(2));
  for (int o = 0; o < octets; ++o) {
    __m512i pr[4];
    q4_octet_words(src + o * 64, idx0, idx2, pr);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      _mm512_storeu_si512((void*)(dst + o * 128 + i * 32), _mm512_permutexvar_epi16(_mm512_sub_epi16(pr[i], zv), lut));
  }
#else
  uint8_t zn[16];
  for (int n = 0; n < 16; ++n) zn[n] = zero ? (zero[n / 2] >> (4 * (n % 2))) & 15 : 8;
  for (int o = 0; o < octets; ++o) {
    const uint8_t* s = src + o * 64;
    uint16_t* d = dst + o * 128;
    for (int n = 0; n < 16; ++n)
      for (int j = 0; j < 4; ++j) {
        const uint8_t v = s[4 * n + j];
        const int k0 = j, k1 = 4 + j;  // inputs of the low and high nibble within the octet
        d[(k0 / 2) * 32 + 2 * n + (k0 & 1)] = kQ4Lut.v[((v & 15) - zn[n]) & 31];
        d[(k1 / 2) * 32 + 2 * n + (k1 & 1)] = kQ4Lut.v[((v >> 4) - zn[n]) & 31];
      }
  }
#endif
}

#if defined(LK_V512)
constexpr int kFusedQ4Rows = 4;
constexpr int kQ4PrefetchOctets = 96;  // prefetch distance in each block stream (64 B per octet)

// Per row r and group g of `seg` inputs: xsum[r * (kp/seg) + g] = sum of the row's inputs (fp32).
inline void q4_row_sums(const uint16_t* const* a, int m, int kp, int seg, float* xsum) {
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xffff0000u));
  for (int r = 0; r < m; ++r)
    for (int g = 0; g < kp / seg; ++g) {
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      for (int k = g * seg; k < (g + 1) * seg; k += 32) {
        const __m512i v = _mm512_loadu_si512((const void*)(a[r] + k));
        s0 = _mm512_add_ps(s0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        s1 = _mm512_add_ps(s1, _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask)));
      }
      xsum[r * (kp / seg) + g] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

// One quad of inputs (two bf16 pairs) for MR activation rows against NB weight blocks:
// acc[il] += pair 0 x wl, acc[ih] += pair 1 x wh (vdpbf16ps, or an exact fp32 split without
// AVX512-BF16). Shared by the 4-bit decode tiles (int4 and fp4), which differ only in how they
// turn codes into the bf16 weights wl/wh.
template <int MR, int NB, int S>
inline __attribute__((always_inline)) void fma_quad(__m512 (&acc)[S][MR][NB], const uint16_t* const* a, int quad,
                                                    const __m512i* wl, const __m512i* wh, int il, int ih) {
#if !defined(LK_VBF16)
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xffff0000u));
#endif
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    const uint16_t* ar = a[r] + 4 * quad;
    const __m512i a01 = bcast_pair(ar), a23 = bcast_pair(ar + 2);
#if defined(LK_VBF16)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      acc[il][r][j] = _mm512_dpbf16_ps(acc[il][r][j], (__m512bh)a01, (__m512bh)wl[j]);
      acc[ih][r][j] = _mm512_dpbf16_ps(acc[ih][r][j], (__m512bh)a23, (__m512bh)wh[j]);
    }
#else
    const __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(a01, 16));
    const __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(a01, hi_mask));
    const __m512 a2 = _mm512_castsi512_ps(_mm512_slli_epi32(a23, 16));
    const __m512 a3 = _mm512_castsi512_ps(_mm512_and_si512(a23, hi_mask));
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      acc[il][r][j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wl[j], 16)), a0, acc[il][r][j]);
      acc[ih][r][j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wh[j], 16)), a2, acc[ih][r][j]);
      acc[il][r][j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wl[j], hi_mask)), a1, acc[il][r][j]);
      acc[ih][r][j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wh[j], hi_mask)), a3, acc[ih][r][j]);
    }
#endif
  }
}

// The S accumulator chains per (row, block) of the 4-bit decode tiles and their fp32 totals:
// all start at zero; after each scale group, take_chains sums a (row, block)'s chains and restarts
// them; store_totals writes the tile (ld 32).
template <int MR, int NB, int S>
inline __attribute__((always_inline)) void zero_chains(__m512 (&acc)[S][MR][NB], __m512 (&tot)[MR][NB]) {
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      tot[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < S; ++i) acc[i][r][j] = _mm512_setzero_ps();
    }
}

template <int MR, int NB, int S>
inline __attribute__((always_inline)) __m512 take_chains(__m512 (&acc)[S][MR][NB], int r, int j) {
  __m512 sum = acc[0][r][j];
  acc[0][r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int i = 1; i < S; ++i) {
    sum = _mm512_add_ps(sum, acc[i][r][j]);
    acc[i][r][j] = _mm512_setzero_ps();
  }
  return sum;
}

template <int MR, int NB>
inline __attribute__((always_inline)) void store_totals(const __m512 (&tot)[MR][NB], float* c) {
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + r * 32 + j * 16, tot[r][j]);
}

// C[r][j*16 + n] (ld 32) = sum_groups scale_j[g][n] * sum_{k in g} A_r[k] * (u_j[n][k] - z_j[g][n])
// The code u becomes the bf16 128 + u with one OR (exact: bf16 steps by 1 in [128, 256)); the bf16
// dot then gives sum A (128 + u), and each group subtracts (128 + z) * sum A in fp32 before its
// scale. Decode is latency bound on the accumulator chains: with few rows, S independent
// accumulators per (row, block) take the four pair-rows of each cache line in turn.
template <int MR, int NB, bool ASYM>
inline void dot_tile_q4(const uint16_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                        const uint16_t* const* scale, const uint8_t* const* zero, bool fp16, const float* xsum) {
  const int far = far_prefetch_bytes();
  constexpr int S = MR == 1 ? 4 : (MR <= 3 ? 2 : 1);
  __m512 acc[S][MR][NB], tot[MR][NB];
  zero_chains<MR, NB, S>(acc, tot);
  const __m512i magic = _mm512_set1_epi16(0x4300);  // bf16 128.0
  const __m512i idx0 = _mm512_loadu_si512((const void*)kQ4Perm.v);
  const __m512i idx2 = _mm512_add_epi16(idx0, _mm512_set1_epi16(2));
  const int ngroups = kp / group, go = group / 8;
  for (int s = 0; s < ngroups; ++s) {
    for (int o = s * go; o < (s + 1) * go; ++o) {
      __m512i pr[NB][4];
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        _mm_prefetch((const char*)(b[j] + (o + kQ4PrefetchOctets) * 64), _MM_HINT_T0);
        if (far) _mm_prefetch((const char*)(b[j] + o * 64 + far), _MM_HINT_T1);
        q4_octet_words(b[j] + o * 64, idx0, idx2, pr[j]);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // quad 2o + h: pair-rows 2h and 2h + 1 of the octet
        __m512i wl[NB], wh[NB];
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          wl[j] = _mm512_or_si512(pr[j][2 * h], magic);
          wh[j] = _mm512_or_si512(pr[j][2 * h + 1], magic);
        }
        const int il = (2 * h) % S, ih = (2 * h + 1) % S;  // accumulators of this quad's two pair-rows
        fma_quad<MR, NB, S>(acc, a, 2 * o + h, wl, wh, il, ih);
      }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const __m256i sv16 = _mm256_loadu_si256((const __m256i*)(scale[j] + s * 16));
      const __m512 sv = fp16 ? _mm512_cvtph_ps(sv16) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sv16), 16));
      const __m512 off = ASYM ? _mm512_add_ps(_mm512_cvtepi32_ps(q4_zero_dwords(zero[j] + s * 8)), _mm512_set1_ps(128.0f))
                              : _mm512_set1_ps(136.0f);  // 128 + z
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 sum = _mm512_fnmadd_ps(off, _mm512_set1_ps(xsum[r * ngroups + s]), take_chains<MR, NB, S>(acc, r, j));
        tot[r][j] = _mm512_fmadd_ps(sum, sv, tot[r][j]);
      }
    }
  }
  store_totals<MR, NB>(tot, c);
}

template <int NB, bool ASYM>
void dot_rows_q4_t(int mr, const uint16_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                   const uint16_t* const* scale, const uint8_t* const* zero, bool fp16, const float* xsum) {
  switch (mr) {
    case 1: dot_tile_q4<1, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16, xsum); break;
    case 2: dot_tile_q4<2, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16, xsum); break;
    case 3: dot_tile_q4<3, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16, xsum); break;
    default: dot_tile_q4<4, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16, xsum); break;
  }
}
template <int NB>
void dot_rows_q4(int mr, const uint16_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                 const uint16_t* const* scale, const uint8_t* const* zero, bool fp16, const float* xsum) {
  if (zero[0]) dot_rows_q4_t<NB, true>(mr, a, b, kp, c, group, scale, zero, fp16, xsum);
  else dot_rows_q4_t<NB, false>(mr, a, b, kp, c, group, scale, zero, fp16, xsum);
}

// ---- int8 activations (decode): u8 x s8 dot products
// acc (16 x int32) += sum over the 4 bytes of each dword of u[byte] * s[byte] (u unsigned, s signed).
inline __m512i dot4_u8s8(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else  // vpmaddubsw cannot saturate here: |2 * 15 * 128| < 2^15
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

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

// One bf16 row -> q8 row (kernel_table.h): per 32 inputs d = max|x| / 127, q = round(x / d).
void q8_row(const uint16_t* src, int kp, int8_t* dst) {
  const int nb = kp / kQ8Group;
  float* d = reinterpret_cast<float*>(dst + kp);
  float* ds = d + nb;
  int32_t* s16 = reinterpret_cast<int32_t*>(ds + nb);
  for (int b = 0; b < nb; ++b) {
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
  const int nb = kp / kQ8Group;
  int8_t* lo = dst + kp;
  float* d = reinterpret_cast<float*>(dst + 2 * kp);
  int32_t* s16 = reinterpret_cast<int32_t*>(d + nb);
  for (int b = 0; b < nb; ++b) {
    const ActGroup32 x = load_act_group32(src + b * 32);
    const float amax = x.amax;
    const __m512 x0 = x.x0, x1 = x.x1;
    __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
    float db = 0.0f;  // all-zero group: q = 0
    if (!x.finite) {
      db = __builtin_nanf("");  // inf/NaN input: the outputs that read it are NaN, as in the bf16 path
    } else if (amax > 0.0f) {
      int k;
      std::frexp(amax, &k);  // amax = f 2^k, f in [0.5, 1)
      int e = k - 14;
      if (std::ldexp(amax, -e) > 16256.0f) ++e;  // keep |hi| <= 127
      // x * 2^-e is exact; two factors where 2^-e alone would overflow (groups below ~2^-113)
      const int p1 = -e > 126 ? 126 : -e;
      const __m512 f1 = _mm512_set1_ps(std::ldexp(1.0f, p1)), f2 = _mm512_set1_ps(std::ldexp(1.0f, -e - p1));
      q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x0, f1), f2));  // round to nearest even
      q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(x1, f1), f2));
      db = std::ldexp(1.0f, e);
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

constexpr int kQ8PrefetchOctets = 96;  // prefetch distance in each block stream (64 B per octet)

// C[r][j*16 + n] (ld 32) = sum_g scale_j[g][n] * sum_{k in g} x_r[k] * (u_j[n][k] - z_j[g][n]) with
// x_r ~ d_r[b] * q_r[k] (q8 rows, b = k / 32): per 32 inputs the integer sum of u * q (vpdpbusd: one
// and/shift per 128 codes, no widening), times d in fp32; per group minus z * sum_b d * sum q, times
// the scales. With few rows the accumulator chains bound the speed: S independent integer
// accumulators per (row, block) take the low/high nibbles of each octet in turn.
template <int MR, int NB, bool ASYM>
inline void dot_tile_q4q8(const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                          const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  const int far = far_prefetch_bytes();
  constexpr int S = MR == 1 ? 4 : 2;
  __m512i acc[S][MR][NB];
  __m512 gacc[MR][NB], tot[MR][NB];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      tot[r][j] = gacc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < S; ++i) acc[i][r][j] = _mm512_setzero_si512();
    }
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const int nb = kp / kQ8Group, ngroups = kp / group, bpg = group / kQ8Group;
  const float* d[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) d[r] = reinterpret_cast<const float*>(a[r] + kp);
  for (int g = 0; g < ngroups; ++g) {
    for (int bb = g * bpg; bb < (g + 1) * bpg; ++bb) {
#pragma GCC unroll 4
      for (int oo = 0; oo < 4; ++oo) {
        const int o = bb * 4 + oo;
        __m512i lo[NB], hi[NB];
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          _mm_prefetch((const char*)(b[j] + (o + kQ8PrefetchOctets) * 64), _MM_HINT_T0);
          if (far) _mm_prefetch((const char*)(b[j] + o * 64 + far), _MM_HINT_T1);
          const __m512i v = _mm512_loadu_si512((const void*)(b[j] + o * 64));
          lo[j] = _mm512_and_si512(v, mask);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        }
        const int il = (2 * oo) % S, ih = (2 * oo + 1) % S;
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          int32_t x0, x1;
          memcpy(&x0, a[r] + 8 * o, 4);
          memcpy(&x1, a[r] + 8 * o + 4, 4);
          const __m512i a0 = _mm512_set1_epi32(x0), a1 = _mm512_set1_epi32(x1);
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) {
            acc[il][r][j] = dot4_u8s8(acc[il][r][j], lo[j], a0);
            acc[ih][r][j] = dot4_u8s8(acc[ih][r][j], hi[j], a1);
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 dv = _mm512_set1_ps(d[r][bb]);
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          __m512i sum = acc[0][r][j];
          acc[0][r][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int i = 1; i < S; ++i) {
            sum = _mm512_add_epi32(sum, acc[i][r][j]);
            acc[i][r][j] = _mm512_setzero_si512();
          }
          gacc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), dv, gacc[r][j]);
        }
      }
    }
    float zs[MR];  // sum over the group of d * sum q, per row
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      zs[r] = 0.0f;
      for (int bb = g * bpg; bb < (g + 1) * bpg; ++bb) zs[r] += d[r][nb + bb];
    }
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const __m256i sv16 = _mm256_loadu_si256((const __m256i*)(scale[j] + g * 16));
      const __m512 sv = fp16 ? _mm512_cvtph_ps(sv16) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sv16), 16));
      const __m512 zf = ASYM ? _mm512_cvtepi32_ps(q4_zero_dwords(zero[j] + g * 8)) : _mm512_set1_ps(8.0f);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 v = _mm512_fnmadd_ps(zf, _mm512_set1_ps(zs[r]), gacc[r][j]);
        tot[r][j] = _mm512_fmadd_ps(v, sv, tot[r][j]);
        gacc[r][j] = _mm512_setzero_ps();
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + r * 32 + j * 16, tot[r][j]);
}

template <int NB, bool ASYM>
void dot_rows_q4q8_t(int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                     const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  switch (mr) {
    case 1: dot_tile_q4q8<1, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16); break;
    case 2: dot_tile_q4q8<2, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16); break;
    case 3: dot_tile_q4q8<3, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16); break;
    default: dot_tile_q4q8<4, NB, ASYM>(a, b, kp, c, group, scale, zero, fp16); break;
  }
}
template <int NB>
void dot_rows_q4q8(int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                   const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  if (zero[0]) dot_rows_q4q8_t<NB, true>(mr, a, b, kp, c, group, scale, zero, fp16);
  else dot_rows_q4q8_t<NB, false>(mr, a, b, kp, c, group, scale, zero, fp16);
}

void gate_up_q4q8(const GateUpTask& t) {
  const Int4Weights& q = t.q4;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / q.group) * kBlockN;
  float* c = t.scratch->c;
  for (int j = 0; j < t.nblk; ++j) {  // the block pair stays in L1/L2 across the row tiles
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* b[2] = {bg, bg + block_bytes};
    const uint16_t* scg = q.scale + size_t(j) * 2 * per;
    const uint16_t* sc[2] = {scg, scg + per};
    const uint8_t* zg = q.zero ? q.zero + size_t(j) * per : nullptr;
    const uint8_t* zz[2] = {zg, zg ? zg + per / 2 : nullptr};
    for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
      const int mr = tmin(kQ8TileRows, t.m - r0);
      dot_rows_q4q8<2>(mr, t.q8_rows + r0, b, t.kp, c, q.group, sc, zz, q.fp16_scale);
      for (int r = 0; r < mr; ++r)
        silu_mul_16(c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
    }
  }
}

void down_q4q8(const DownTask& t) {
  const Int4Weights& q = t.q4;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / q.group) * kBlockN;
  float* c = t.scratch->c;
  const int8_t* rows[kQ8TileRows];
  for (int j = 0; j < t.nblk; j += 2) {  // two blocks per tile share the activation broadcasts
    const int nb = tmin(2, t.nblk - j);
    const uint8_t* b[2] = {q.w + size_t(j) * block_bytes, q.w + size_t(j + nb - 1) * block_bytes};
    const uint16_t* s[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
    const uint8_t* z[2] = {q.zero ? q.zero + size_t(j) * per / 2 : nullptr,
                           q.zero ? q.zero + size_t(j + nb - 1) * per / 2 : nullptr};
    for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
      const int mr = tmin(kQ8TileRows, t.m - r0);
      for (int r = 0; r < mr; ++r) rows[r] = t.q8_act + size_t(r0 + r) * t.q8_ld;
      if (nb == 2) dot_rows_q4q8<2>(mr, rows, b, t.kp, c, q.group, s, z, q.fp16_scale);
      else dot_rows_q4q8<1>(mr, rows, b, t.kp, c, q.group, s, z, q.fp16_scale);
      for (int r = 0; r < mr; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r0 + r], c + r * 32 + h * 16, o + h * 16);
      }
    }
  }
}
constexpr bool kHaveQ8 = true;
#else
constexpr bool kHaveQ8 = false;
inline void gate_up_q4q8(const GateUpTask&) {}
inline void down_q4q8(const DownTask&) {}
constexpr int kFusedQ4Rows = 0;
template <int NB>
void dot_rows_q4(int, const uint16_t* const*, const uint8_t* const*, int, float*, int, const uint16_t* const*,
                 const uint8_t* const*, bool, const float*) {}
inline void q4_row_sums(const uint16_t* const*, int, int, int, float*) {}
#endif
#if defined(LK_V512)
// One int4 block whole into a prefill panel: u - z as bf16 (dst, the bf16 block layout) and its group
// scales as fp32 (fs: kp / group x 16). zero: the block's packed zero points, or null (symmetric).
inline void q4_panel_block(const Int4Weights& q, const uint8_t* src, const uint16_t* scale, const uint8_t* zero,
                           int kp, uint16_t* dst, float* fs) {
  const int seg = q.group;
  for (int s = 0; s < kp / seg; ++s) {
    q4_dequant_seg(src + size_t(s) * seg * kBlockN / 2, zero ? zero + s * 8 : nullptr, dst + size_t(s) * seg * kBlockN,
                   seg);
    scales_16(scale + s * kBlockN, q.fp16_scale, fs + s * 16);
  }
}
#endif

// The fused tile needs m x kp/group row sums in the scratch accumulator.
inline bool q4_fused(int m, int kp, int group) {
  return m <= kFusedQ4Rows && size_t(m) * (kp / group) <= size_t(kMaxRowsPerTask) * 32;
}

void gate_up_q4(const GateUpTask& t) {
  if (kHaveQ8 && t.q8_rows) return gate_up_q4q8(t);  // decode with int8 activations
  const Int4Weights& q = t.q4;
  const int seg = q.group, nseg = t.kp / seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(nseg) * kBlockN;  // scales (and zeros) per block
  uint16_t* dg = t.scratch->deq;
  uint16_t* du = dg + seg * kBlockN;
  float* tot = t.scratch->acc;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  float sg[16], su[16];
  const bool fused = q4_fused(t.m, t.kp, seg);
  if (fused) q4_row_sums(t.x_rows, t.m, t.kp, seg, tot);
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* bu = bg + block_bytes;
    const uint16_t* scg = q.scale + size_t(j) * 2 * per;
    const uint16_t* scu = scg + per;
    const uint8_t* zg = q.zero ? q.zero + size_t(j) * per : nullptr;  // zeros: per / 2 bytes per block
    const uint8_t* zu = zg ? zg + per / 2 : nullptr;
    if (fused) {  // decode: codes converted in registers, group scales in the tile
      const uint8_t* b[2] = {bg, bu};
      const uint16_t* sc[2] = {scg, scu};
      const uint8_t* zz[2] = {zg, zu};
      dot_rows_q4<2>(t.m, t.x_rows, b, t.kp, c, seg, sc, zz, q.fp16_scale, tot);
      for (int r = 0; r < t.m; ++r)
        silu_mul_16(c + r * 32, c + r * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      continue;
    }
#if defined(LK_V512)
    {
      float* fs = panel_scales(*t.scratch, t.kp);  // [gate groups x 16 | up groups x 16]
      q4_panel_block(q, bg, scg, zg, t.kp, panel_of(*t.scratch, t.kp, 0), fs);
      q4_panel_block(q, bu, scu, zu, t.kp, panel_of(*t.scratch, t.kp, 1), fs + nseg * 16);
      uint16_t* act = t.act + j * kBlockN;
      const void* next = j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr;
      gate_up_panel<kSegVector>(t, j, seg, fs, fs + nseg * 16, next, 2 * block_bytes,
                                [&](float* g, int r) { silu_mul_16(g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
    memset(tot, 0, size_t(t.m) * 32 * 4);
    for (int s = 0; s < nseg; ++s) {  // dequantize each group once, reuse it for every row tile
      const size_t off = size_t(s) * seg * kBlockN / 2;
      const void* b[2] = {dg, du};
      q4_dequant_seg(bg + off, zg ? zg + s * 8 : nullptr, dg, seg);
      q4_dequant_seg(bu + off, zu ? zu + s * 8 : nullptr, du, seg);
      scales_16(scg + s * kBlockN, q.fp16_scale, sg);
      scales_16(scu + s * kBlockN, q.fp16_scale, su);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.x_rows[r0 + r] + size_t(s) * seg;
        dot_rows<2>(mr, rows, b, seg, c);
        for (int r = 0; r < mr; ++r) {
          float* o = tot + size_t(r0 + r) * 32;
          axpy_vec_16(1.0f, c + r * 32, sg, o);
          axpy_vec_16(1.0f, c + r * 32 + 16, su, o + 16);
        }
      }
    }
    for (int r = 0; r < t.m; ++r)
      silu_mul_16(tot + size_t(r) * 32, tot + size_t(r) * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
  }
}

void down_q4(const DownTask& t) {
  if (kHaveQ8 && t.q8_act) return down_q4q8(t);
  const Int4Weights& q = t.q4;
  const int seg = q.group, nseg = t.kp / seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(nseg) * kBlockN;
  uint16_t* d = t.scratch->deq;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  float sc[16];
  if (q4_fused(t.m, t.kp, seg)) {  // decode: two blocks per tile share the activation broadcasts
    for (int r = 0; r < t.m; ++r) rows[r] = t.act + size_t(r) * t.act_ld;
    float* xsum = t.scratch->acc;
    q4_row_sums(rows, t.m, t.kp, seg, xsum);
    for (int j = 0; j < t.nblk; j += 2) {
      const int nb = tmin(2, t.nblk - j);
      const uint8_t* b[2] = {q.w + size_t(j) * block_bytes, q.w + size_t(j + nb - 1) * block_bytes};
      const uint16_t* s[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
      const uint8_t* z[2] = {q.zero ? q.zero + size_t(j) * per / 2 : nullptr,
                             q.zero ? q.zero + size_t(j + nb - 1) * per / 2 : nullptr};
      if (nb == 2) dot_rows_q4<2>(t.m, rows, b, t.kp, c, seg, s, z, q.fp16_scale, xsum);
      else dot_rows_q4<1>(t.m, rows, b, t.kp, c, seg, s, z, q.fp16_scale, xsum);
      for (int r = 0; r < t.m; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
        for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r], c + r * 32 + h * 16, o + h * 16);
      }
    }
    return;
  }
#if defined(LK_V512)
  float* fs = panel_scales(*t.scratch, t.kp);
  for (int j = 0; j < t.nblk; j += 2) {
    const int nb = tmin(2, t.nblk - j);
    for (int h = 0; h < nb; ++h)
      q4_panel_block(q, q.w + size_t(j + h) * block_bytes, q.scale + size_t(j + h) * per,
                     q.zero ? q.zero + size_t(j + h) * per / 2 : nullptr, t.kp, panel_of(*t.scratch, t.kp, h),
                     fs + size_t(h) * nseg * 16);
    const float* ss[2] = {fs, fs + size_t(nb - 1) * nseg * 16};
    const void* next = j + 2 < t.nblk ? q.w + size_t(j + 2) * block_bytes : nullptr;
    down_panel<kSegVector>(t, j, nb, seg, ss, nullptr, 1.0f, next, size_t(tmin(2, t.nblk - j - 2)) * block_bytes);
  }
  return;
#endif
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* src = q.w + size_t(j) * block_bytes;
    const uint16_t* scj = q.scale + size_t(j) * per;
    const uint8_t* zj = q.zero ? q.zero + size_t(j) * per / 2 : nullptr;
    for (int s = 0; s < nseg; ++s) {
      const void* b[2] = {d, d};
      q4_dequant_seg(src + size_t(s) * seg * kBlockN / 2, zj ? zj + s * 8 : nullptr, d, seg);
      scales_16(scj + s * kBlockN, q.fp16_scale, sc);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld + size_t(s) * seg;
        dot_rows<1>(mr, rows, b, seg, c);
        for (int r = 0; r < mr; ++r)
          axpy_vec_16(t.row_weight[r0 + r], c + r * 32, sc, t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN);
      }
    }
  }
}

// ---------------------------------------------------------------- mxfp4 (gpt-oss) and nvfp4 (ModelOpt)
// Strategy. Decode, default (chunks of <= kQ8MaxTokens tokens on the AVX-512 tiers; LK_INT8_ACT not set
// for fp4): 15-bit activations, dot_tile_fp4_int with Q15. x and the bf16 act rows become q15 rows once per chunk
// (q15_row: per 32 inputs a power of two d with max|x| / d in (8128, 16256], q = round(x / d) split
// as 128 hi + lo into two int8 rows); each quad of codes becomes the unsigned bytes 12 + 2 e2m1 of the
// int8 path below (fp4_quad_u8: vpmovzxwd, vpternlogd, vpshufb) and feeds two vpdpbusd, one per
// activation half; per scale group 128 sum(u hi) + sum(u lo) - 12 sum q is sum 2 e2m1 q exactly, one
// conversion and one fmadd with scale x d. Error: only the inputs below 2^-6 of their group's max
// move, by at most 2^-14 of it (the rest is exact; int8 activations: up to 2^-8 of it); the layer
// output's relative RMS error against the fp32 reference is the bf16 tile's (gpt-oss shape, M = 1-16,
// Zen4: 0.0023-0.0024 both), and tests/cpu/test_fp4_q15.py checks it against a reference that emulates
// the rounding, within the output's own bf16 rounding. Why: on the 16-core AMX host (Xeon, 2026-12-01, eleventh session,
// tools/decode_ops_micro.cpp on L1-resident codes, three runs) the vdpbf16ps tile below takes
// ~11 GB/s of codes per core, its vpermw conversion (~23 GB/s alone) and vdpbf16ps (~20 GB/s alone)
// adding up on the same ports, against ~32 GB/s for int8 activations and ~20 for int16 ones with
// vpdpwssd: a 16-thread decode streaming ~6 GB/s per core spent half its time in the tile, and the
// hot single-thread layer ran at 8.3 GB/s (mxfp4) against 17.3 for wna16_int4 on int8 activations
// (docs/results/2026-12-01_h200_session11.log). Measured there, Qwen3-30B-A3B layer, M=1, two passes
// x 6 rounds at 16 and at 14 threads, q15 / bf16 tile taking turns on the same cases: mxfp4 0.230-0.249
// ms vs 0.252-0.281 ms, median 0.86 vs 0.77 of the read bandwidth measured around each round; nvfp4
// 0.242-0.268 vs 0.261-0.285 ms, 0.84 vs 0.78. On the 2-core Zen4 VM the bf16 tile is 7-15% faster on
// hot weights (M=1, 1 thread: mxfp4 0.419 vs 0.451 ms, nvfp4 0.454 vs 0.519), which its memory-bound
// decode does not see (2 threads, rotated copies: within the noise); q15 stays the one default.
// `benchmarks/moe_layer.py --fp4-acts q15,bf16` A/Bs them (lk_moe._C._set_fp4_decode_acts, a hook).
// Decode with int8 activations (chunks of <= kQ8MaxTokens tokens on the AVX-512 tiers, only
// with LK_INT8_ACT=1: on the 16-core AMX host, 2026-12-01, M=1 it gained 5-6% (mxfp4 0.327 -> 0.308 ms,
// nvfp4 0.329 -> 0.312) while its error moved gpt-oss's greedy logprobs past the e2e bound, so the exact
// path below is the default): the int4 section's int8 activations (q8 rows, quantized once per chunk per 32
// inputs) times exact int8 weights: 2 x e2m1 is an integer in +-{0, 1, 2, 3, 4, 6, 8, 12}, so each
// quad (32 bytes, the block layout as it is) becomes 16 dwords of 4 unsigned codes 12 + 2 e2m1
// (vpmovzxwd, one vpternlogd, one vpshufb table) and vpdpbusd (vpmaddubsw + vpmaddwd on the avx512
// tier) sums them with the activation bytes in int32; one chain per group starts at -12 x sum q (the
// offset, exact), and per scale group (mxfp4: 32 inputs, e8m0; nvfp4: 16 inputs, fp8 e4m3) the sum
// is converted once and multiplied by scale x d in fp32; the 1/2 and the nvfp4 global scales are
// applied to the totals. About 4 vector ops per 64 weights and row against ~9 for the bf16 widening
// below. Error: only the activations' int8 rounding (rel RMS of the layer output ~0.011-0.012
// against the fp32 reference, exact path ~0.0023; budget in tests/cpu/conftest.py).
// Measured on the 2-core Zen4 dev VM (avx512_bf16 with VNNI, benchmarks/moe_layer.py --shapes
// qwen3-30b-a3b, LK_INT8_ACT=0 -> 1, medians of 3 runs; docs/results/2026-12-01_epyc2c_fp4_int8act_moe_layer.log,
// taken while other jobs loaded the VM, so M=4 with 2 threads swung 2-23 ms and is not quoted):
// 2 threads, M=1: mxfp4 0.689 -> 0.498 ms (29 -> 40 GB/s of quantized bytes), nvfp4 0.622 -> 0.584 ms
// (34 -> 36 GB/s). Hot weights (8 experts in L3, 1 thread): mxfp4 M=1 0.89 -> 0.57 ms, M=4 1.08 ->
// 0.65 ms; nvfp4 M=1 0.81 -> 0.54 ms, M=4 1.26 -> 1.02 ms (its per-16 epilogue, the fp8 scale
// conversion above all, is the larger share: a cheaper fp8x16_to_f32 is the next step there).
// Decode on bf16 activations (the benchmark setting 'bf16', m <= kFusedFp4Rows rows on the AVX-512
// tiers, dot_tile_fp4; the default before q15 and the numbers below are from that time): the 4-bit codes
// stream from memory and become bf16 in registers: bytes zero-extended to words, low/high nibble = two
// pair-rows, a 16-entry vpermw table gives the exact bf16 e2m1 value; vdpbf16ps (or the even/odd fp32
// split without AVX512-BF16) accumulates each 32-input group in fp32, then the group's 16 e8m0 scales
// (2^(s-127) built as fp32 bits s << 23) multiply it into the total: one fmadd per 16 pair-rows.
// Decode speed (2026-12-01, docs/results/2026-12-01_epyc2c_mxfp4_exact_speed.log): with M = 1 the
// S = 4 accumulator chains were indexed by (2q) % S with q counting from the group's start, which the
// compiler did not fold once unrolled, so the chains lived on the stack; indexed by the in-group quad
// they stay in registers (same chains, same fp32 results for mxfp4; nvfp4 M = 1 went from 2 chains
// to 4). The fp4 table holds the 16 codes twice so the zero-extended byte is its own index (no
// nibble mask); fp8x16_to_f32 shifts sign-extended bytes (one shift, one mask instead of five ops).
// Hot weights (8 experts in L3, 1 thread, medians of 5, Zen4 VM): mxfp4 M=1 0.747 -> 0.433 ms,
// M=4 0.979 -> 0.969; nvfp4 M=1 0.586 -> 0.586 (min 0.558 -> 0.480), M=4 1.050 -> 0.904.
// 2 threads, rotated copies (medians of 3; the VM's read bandwidth swung 0.25-0.84 of the probe): mxfp4
// M=1 1.021 -> 0.800 ms, M=4 3.540 -> 2.851; nvfp4 M=1 0.812 -> 0.622, M=4 2.936 -> 2.324. The 16-core AMX host
// (0.327 ms mxfp4 M=1 before), re-measured 2026-12-01 (docs/results/2026-12-01_h200_session6.log, 16 threads,
// qwen3-30b-a3b): mxfp4 M=1 0.298 / 0.294 ms = 0.72 / 0.70 of the read bandwidth in two runs, M=4 0.82;
// nvfp4 M=1 0.315 / 0.293 ms = 0.68 / 0.71, M=4 0.84. Decode work units (moe_layer.cpp, DecodeUnits):
// 4-bit decode chunks now start with units of several blocks of one expert (longer weight streams);
// same host, seventh session (docs/results/2026-12-01_h200_session7.log), two runs, one-block units ->
// wide: mxfp4 M=1 0.76 -> 0.78 and 0.78 -> 0.82 (0.235 / 0.239 ms), M=4 0.81 -> 0.88; nvfp4 M=1
// 0.74 -> 0.78 and 0.80 -> 0.83 (0.244 / 0.242 ms), M=4 0.84 -> 0.88.
// Tried and not kept: e8m0 specials tested on the 16 bytes (no gain). Not tried for lack of time:
// folding e8m0 scales into the table (the table is per code, the scale per row: an extra add and a
// zero fix-up per quad would cost more than the once-per-8-quads epilogue), prefetch of the next
// expert. M=4 stays bound by the vdpbf16ps count (16 per quad and block pair), not the unpack.
// Prefill (more rows): code x scale of the block (pair) dequantized into bf16 (exact: e2m1 has 2
// significant bits, an mxfp4 scale is a power of two, an nvfp4 one has 4), on the AVX-512 tiers whole
// into a panel run by the bf16 tile or AMX tiles over all of K, on the generic/avx2 tiers per segment
// of up to 256 inputs into L1, summing segments in fp32. Biases: w13_bias is added to the fp32
// pre-activations here, before the activation; the w2 bias by the engine (moe_layer.cpp).
// Measured on the 2-core Zen4 dev VM (avx512_bf16, 2 threads, benchmarks/moe_layer.py --format mxfp4
// --shapes gpt-oss-120b: E=128, K=4, H=I=2880, biases, swigluoai; 3 packed copies rotated): M=1 1.55 ms =
// 34 GB/s of quantized bytes; M=4 5.9 ms (35 GB/s); M=16 20 ms (33 GB/s). The VM's read-bandwidth
// probe swings between runs (43-79 GB/s), so the ratio was 0.38-0.77 (0.77 against the 44 GB/s of the
// same run as the numbers above). Prefill M=256: 208 ms (0.25 TFLOP/s). Decode prefetch distance:
// 96 quads measured best of 48/96/192/384 (noisy). nbytes / checkpoint bytes: 1.0027.
// nvfp4 (ModelOpt) runs the same code with NV = true: 16-input groups (4 quads), fp8 e4m3fn scales
// (fp8x16_to_f32 / fp8_to_f32), and the per-expert global scales applied by gate_up_fp4 / down_fp4 to
// the fp32 results. Conventions and measurements: moe_layer.h (kNVFP4).

// e2m1 code -> bf16 bits (sign bit 3, magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}); 32 entries for vpermw,
// the 16 codes twice: vpermw reads the low 5 bits of each index word, so a word whose low nibble is
// the code needs no masking whatever its bit 4 (dot_tile_fp4 looks up the zero-extended byte as is).
struct Fp4Lut {
  uint16_t v[32];
};
constexpr Fp4Lut make_fp4_lut() {
  Fp4Lut t{};
  const uint16_t mag[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
  for (int i = 0; i < 32; ++i) t.v[i] = uint16_t(mag[i & 7] | (i & 8 ? 0x8000 : 0));
  return t;
}
constexpr Fp4Lut kFp4Lut = make_fp4_lut();

// e8m0 byte -> 2^(s - 127) as fp32 (s = 0: the subnormal 2^-127; s = 255: NaN).
inline float e8m0_to_f32(uint8_t s) {
  const uint32_t u = s == 0 ? 0x00400000u : s == 255 ? 0x7FC00000u : uint32_t(s) << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// fp8 e4m3fn scale byte -> fp32 (exact; 0x7F / 0xFF: NaN). NVFP4's per-16-inputs block scale.
inline float fp8_to_f32(uint8_t s) { return bf16_to_f32(fp8_to_bf16_1(s)); }

// One fp4 scale byte -> fp32: e8m0 (mxfp4) or fp8 e4m3fn (nvfp4).
template <bool NV>
inline float fp4_scale_f32(uint8_t s) {
  if constexpr (NV) return fp8_to_f32(s);
  else return e8m0_to_f32(s);
}

inline float sigmoid_scalar(float z) {
  const float e = __builtin_expf(-(z < -kExpHi ? -kExpHi : (z > kExpHi ? kExpHi : z)));
  return 1.0f / (1.0f + e);
}

// act[0:16] = activation(g + bias_g, u + bias_u) as bf16; g and u are overwritten.
inline void act_16(const GateUpTask& t, int j, float* g, float* u, uint16_t* out) {
  if (t.bias) {
    const uint16_t* bg = t.bias + size_t(j) * 2 * kBlockN;
    for (int n = 0; n < 16; ++n) {
      g[n] += bf16_to_f32(bg[n]);
      u[n] += bf16_to_f32(bg[kBlockN + n]);
    }
  }
  if (t.act_fn != Activation::kSwigluOAI) return silu_mul_16(g, u, out);
  const float lim = t.limit, al = t.alpha;
#if defined(LK_V512)
  // The clamps take the bound as the first operand: min/max return the second when either is NaN,
  // so a NaN gate or up stays NaN (vLLM's torch.clamp propagates it too).
  const __m512 gv = _mm512_min_ps(_mm512_set1_ps(lim), _mm512_loadu_ps(g));
  const __m512 uv = _mm512_max_ps(_mm512_set1_ps(-lim), _mm512_min_ps(_mm512_set1_ps(lim), _mm512_loadu_ps(u)));
  const __m512 e = exp_v(_mm512_mul_ps(gv, _mm512_set1_ps(-al)));
  const __m512 glu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  _mm256_storeu_si256((__m256i*)out, f32_to_bf16_v(_mm512_mul_ps(_mm512_add_ps(uv, _mm512_set1_ps(1.0f)), glu)));
#elif defined(__AVX2__)
  float y[16];
  for (int h = 0; h < 2; ++h) {
    const __m256 gv = _mm256_min_ps(_mm256_set1_ps(lim), _mm256_loadu_ps(g + 8 * h));
    const __m256 uv = _mm256_max_ps(_mm256_set1_ps(-lim), _mm256_min_ps(_mm256_set1_ps(lim), _mm256_loadu_ps(u + 8 * h)));
    const __m256 e = exp_v(_mm256_mul_ps(gv, _mm256_set1_ps(-al)));
    const __m256 glu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_add_ps(uv, _mm256_set1_ps(1.0f)), glu));
  }
  store_bf16_16(y, out);
#else
  for (int n = 0; n < 16; ++n) {
    const float gv = g[n] > lim ? lim : g[n];  // comparisons false for NaN: it passes through
    const float uv = u[n] < -lim ? -lim : (u[n] > lim ? lim : u[n]);
    out[n] = f32_to_bf16((uv + 1.0f) * gv * sigmoid_scalar(al * gv));
  }
#endif
}

#if defined(LK_V512)
inline __m512 e8m0x16_to_f32(const uint8_t* s) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)s));
  __m512i u = _mm512_slli_epi32(b, 23);
  u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
  u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(u);
}

// 16 fp8 e4m3fn bytes -> fp32 (exact). The 7 magnitude bits shifted to fp32's exponent/mantissa
// fields (<< 20) are the value times 2^-120, subnormals included (an fp8 subnormal lands on an fp32
// subnormal): one multiply by 2^120 rebiases; 0x7F/0xFF are NaN. The bytes are sign-extended, so
// one shift puts the magnitude at bits 20..26 and copies of the sign at 27..31, and one mask keeps
// bit 31 of those.
inline __m512 fp8x16_to_f32(const uint8_t* s) {
  const __m128i x = _mm_loadu_si128((const __m128i*)s);
  const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(x), 20),
                                        _mm512_set1_epi32(int32_t(0x87F00000u)));
  const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(1.329227995784916e36f));  // 2^120
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(x, _mm_set1_epi8(int8_t(0x80))), _mm_set1_epi8(-1));
  return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}
#endif

// len inputs (a multiple of 32) of an fp4 block -> bf16 block layout (len/2 pair-rows of 32),
// values code x scale, exact: mxfp4 scales are powers of two; an nvfp4 scale (fp8 e4m3: 4 significant
// bits, 2^-9 .. 448) times an e2m1 value (2 significant bits) has at most 6 significant bits and stays
// inside bf16's range, so the fp32 product is a bf16 value and its high half is taken as is.
// src: the segment's first quad; sc: its groups' [len/G][16] scales (G = 32 inputs, NV: 16).
template <bool NV>
inline void fp4_dequant_seg_t(const uint8_t* src, const uint8_t* sc, uint16_t* dst, int len) {
  constexpr int G = NV ? 16 : 32;  // inputs per scale
  constexpr int GQ = G / 4;        // quads per scale group
  const int groups = len / G;
#if defined(LK_V512)
  const __m512i lut = _mm512_loadu_si512((const void*)kFp4Lut.v);
  const __m512i mask = _mm512_set1_epi16(0x0F);
  const __m512i idx_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i idx_hi = _mm512_add_epi32(idx_lo, _mm512_set1_epi32(8));
#if defined(LK_VBF16)
  const __m512 lut32 = bf16_to_f32_v(_mm512_castsi512_si256(lut));  // the 16 e2m1 values as fp32
#endif
  // mxfp4 scales are powers of two: where every e8m0 byte of a group keeps every e2m1 product a normal
  // bf16 (2 <= e <= 252: e2m1 exponents are -1 .. 2), code x scale is the code's bf16 with e - 127
  // added to its exponent field (zeros stay zero), one masked add per 32 weights instead of two
  // widenings, two multiplies and two narrowings; other groups (and nvfp4) take the multiply.
  const __m512i row_of_word = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6,
                                               6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int g = 0; g < groups; ++g) {
    if constexpr (!NV) {
      const __m128i eb = _mm_loadu_si128((const __m128i*)(sc + g * 16));
      const __mmask16 ok = _mm_cmpge_epu8_mask(eb, _mm_set1_epi8(2)) & _mm_cmple_epu8_mask(eb, _mm_set1_epi8(int8_t(252)));
      if (ok == 0xFFFF) {
        const __m512i ew = _mm512_permutexvar_epi16(row_of_word, _mm512_castsi256_si512(_mm256_cvtepu8_epi16(eb)));
        const __m512i add = _mm512_slli_epi16(_mm512_sub_epi16(ew, _mm512_set1_epi16(127)), 7);
        for (int q = 0; q < GQ; ++q) {
          const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(src + (g * GQ + q) * 32)));
          const __m512i w2[2] = {_mm512_permutexvar_epi16(_mm512_and_si512(v, mask), lut),
                                 _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut)};
          for (int h = 0; h < 2; ++h) {
            const __mmask32 nz = _mm512_test_epi16_mask(w2[h], _mm512_set1_epi16(0x7FFF));
            _mm512_storeu_si512((void*)(dst + (g * GQ + q) * 64 + h * 32), _mm512_mask_add_epi16(w2[h], nz, w2[h], add));
          }
        }
        continue;
      }
    }
    const __m512 sv = NV ? fp8x16_to_f32(sc + g * 16) : e8m0x16_to_f32(sc + g * 16);
    const __m512 s_lo = _mm512_permutexvar_ps(idx_lo, sv);  // words 0..15 of a pair-row: rows 0..7, twice each
    const __m512 s_hi = _mm512_permutexvar_ps(idx_hi, sv);  // words 16..31: rows 8..15
#if defined(LK_VBF16)
    // fp32 values straight from the codes (vpermps reads an index's low 4 bits) and one vcvtne2ps2bf16
    // per pair-row (exact: the products are bf16 values)
    for (int q = 0; q < GQ; ++q) {
      const uint8_t* qs = src + (g * GQ + q) * 32;
      const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)qs));
      const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(qs + 16)));
      for (int h = 0; h < 2; ++h) {
        const __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(h ? _mm512_srli_epi32(b0, 4) : b0, lut32), s_lo);
        const __m512 hi = _mm512_mul_ps(_mm512_permutexvar_ps(h ? _mm512_srli_epi32(b1, 4) : b1, lut32), s_hi);
        _mm512_storeu_si512((void*)(dst + (g * GQ + q) * 64 + h * 32), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      }
    }
    continue;
#endif
    for (int q = 0; q < GQ; ++q) {
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(src + (g * GQ + q) * 32)));
      const __m512i w2[2] = {_mm512_permutexvar_epi16(_mm512_and_si512(v, mask), lut),
                             _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut)};
      for (int h = 0; h < 2; ++h) {
        const __m512 lo = bf16_to_f32_v(_mm512_castsi512_si256(w2[h]));
        const __m512 hi = bf16_to_f32_v(_mm512_extracti64x4_epi64(w2[h], 1));
        // products are exact in bf16: take the high halves
        const __m256i l16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(_mm512_mul_ps(lo, s_lo)), 16));
        const __m256i h16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(_mm512_mul_ps(hi, s_hi)), 16));
        _mm512_storeu_si512((void*)(dst + (g * GQ + q) * 64 + h * 32),
                            _mm512_inserti64x4(_mm512_castsi256_si512(l16), h16, 1));
      }
    }
  }
#else
  for (int g = 0; g < groups; ++g) {
    float sf[16];
    for (int n = 0; n < 16; ++n) sf[n] = fp4_scale_f32<NV>(sc[g * 16 + n]);
    for (int q = 0; q < GQ; ++q) {
      const uint8_t* s = src + (g * GQ + q) * 32;
      uint16_t* d = dst + (g * GQ + q) * 64;
      for (int b = 0; b < 32; ++b) {
        const float f = sf[b / 2];
        d[b] = f32_to_bf16(bf16_to_f32(kFp4Lut.v[s[b] & 15]) * f);
        d[32 + b] = f32_to_bf16(bf16_to_f32(kFp4Lut.v[s[b] >> 4]) * f);
      }
    }
  }
#endif
}

inline void fp4_dequant_seg(const Fp4Weights& q, const uint8_t* src, const uint8_t* sc, uint16_t* dst, int len) {
  if (q.nv) fp4_dequant_seg_t<true>(src, sc, dst, len);
  else fp4_dequant_seg_t<false>(src, sc, dst, len);
}

#if defined(LK_V512)
constexpr int kFusedFp4Rows = 4;
constexpr int kFp4PrefetchQuads = 96;  // prefetch distance in each block stream (32 B per quad)

// C[r][j*16 + n] (ld 32) = sum_groups s_j[g][n] * sum_{k in g} A_r[k] * e2m1(code_j[n][k]), groups of 32
// inputs with e8m0 scales 2^(s - 127) (mxfp4) or, NV, of 16 inputs with fp8 e4m3fn scales (nvfp4; the
// global scale is applied by the caller). With few rows the accumulator chains bound the speed: S
// independent accumulators per (row, block) take the pair-rows in turn.
template <int MR, int NB, bool NV>
inline void dot_tile_fp4(const uint16_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                         float* c) {
  const int far = far_prefetch_bytes();
  constexpr int GQ = NV ? 4 : 8;  // quads per scale group
  constexpr int S = MR == 1 ? 4 : (MR <= 2 ? 2 : 1);
  __m512 acc[S][MR][NB], tot[MR][NB];
  zero_chains<MR, NB, S>(acc, tot);
  const __m512i lut = _mm512_loadu_si512((const void*)kFp4Lut.v);
  const int ngroups = kp / (4 * GQ);
  for (int g = 0; g < ngroups; ++g) {
#pragma GCC unroll 8
    for (int qq = 0; qq < GQ; ++qq) {
      const int q = g * GQ + qq;
      if ((qq & 1) == 0) {
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          _mm_prefetch((const char*)(b[j] + (q + kFp4PrefetchQuads) * 32), _MM_HINT_T0);
          if (far) _mm_prefetch((const char*)(b[j] + q * 32 + far), _MM_HINT_T1);
        }
      }
      __m512i wl[NB], wh[NB];
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(b[j] + q * 32)));
        wl[j] = _mm512_permutexvar_epi16(v, lut);  // low nibble + bit 4: the doubled table
        wh[j] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
      }
      // chain indices from the in-group quad: compile-time constants once unrolled (from q they were
      // not for S = 4, and the accumulators went to the stack)
      const int il = (2 * qq) % S, ih = (2 * qq + 1) % S;
      fma_quad<MR, NB, S>(acc, a, q, wl, wh, il, ih);
    }
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const __m512 sv = NV ? fp8x16_to_f32(sc[j] + g * 16) : e8m0x16_to_f32(sc[j] + g * 16);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) tot[r][j] = _mm512_fmadd_ps(take_chains<MR, NB, S>(acc, r, j), sv, tot[r][j]);
    }
  }
  store_totals<MR, NB>(tot, c);
}

// ---- int8 activations (decode): exact int8 weights from the e2m1 codes
// 2 x e2m1 is an integer in +-{0, 1, 2, 3, 4, 6, 8, 12}; stored as kFp4Offset + 2 e2m1 in [0, 24] it is
// the unsigned operand of vpdpbusd (the q8 activation codes are the signed one; vpmaddubsw cannot
// saturate: 2 * 24 * 127 < 2^15), and the offset is taken back exactly in integers as kFp4Offset x the
// sum of q over the scale group (per 16 inputs in the q8 row). The 2 is divided out of the fp32 total.
constexpr int kFp4Offset = 12;
struct Fp4U8Lut {
  uint8_t v[64];  // the 16-entry table in each 128-bit lane (vpshufb looks up within a lane)
};
constexpr Fp4U8Lut make_fp4_u8_lut() {
  Fp4U8Lut t{};
  const int mag2[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  for (int i = 0; i < 64; ++i) t.v[i] = uint8_t(kFp4Offset + (i & 8 ? -mag2[i & 7] : mag2[i & 7]));
  return t;
}
constexpr Fp4U8Lut kFp4U8Lut = make_fp4_u8_lut();

// One quad of a block (32 bytes; row n's inputs 4q + j in the low nibble of byte 2n + j, 4q + 2 + j in
// the high one) -> 16 dwords, dword n = row n's 4 inputs in order as kFp4Offset + 2 e2m1: zero-extend
// the byte pairs to dwords, (v | v << 12) & 0x0F0F0F0F puts the nibbles lo0, lo1, hi0, hi1 in bytes
// 0..3 (one vpternlogd), vpshufb maps them. Works on the quad layout as it is, so the exact bf16 paths
// (decode and prefill) keep their layout and code.
inline __attribute__((always_inline)) __m512i fp4_quad_u8(const uint8_t* quad, __m512i lut) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)quad));
  const __m512i nib = _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi8(0x0F), 0xA8);
  return _mm512_shuffle_epi8(lut, nib);
}

// Quad q of each of the NB blocks as fp4_quad_u8 bytes, prefetching the streams ahead (every other quad:
// 64 bytes per block).
template <int NB>
inline __attribute__((always_inline)) void fp4_quads_u8(const uint8_t* const* b, int q, int far, __m512i lut,
                                                        __m512i (&w)[NB]) {
#pragma GCC unroll 2
  for (int j = 0; j < NB; ++j) {
    if ((q & 1) == 0) {
      _mm_prefetch((const char*)(b[j] + (q + kFp4PrefetchQuads) * 32), _MM_HINT_T0);
      if (far) _mm_prefetch((const char*)(b[j] + q * 32 + far), _MM_HINT_T1);
    }
    w[j] = fp4_quad_u8(b[j] + q * 32, lut);
  }
}

// C[r][j*16 + n] (ld 32) as dot_tile_fp4, from integer activation rows. Per scale group (32 inputs,
// NV: 16) the integer sum of u = kFp4Offset + 2 e2m1 times the activation codes (vpdpbusd), one chain
// seeded with -kFp4Offset * sum q, converted once and multiplied by the group's scale and d in fp32;
// the tile's totals are halved at the end. MR = 1 runs two integer chains per (row, block).
// Q15 = false: q8 rows, x_r ~ d_r[b] * q_r[k] (b = k / 32).
// Q15 = true: q15 rows, x_r ~ d_r[b] * (128 hi_r[k] + lo_r[k]): the same weights feed a second
// vpdpbusd on hi, and 128 sum(u hi) + sum(u lo) - kFp4Offset sum q is sum 2 e2m1 q exactly
// (|.| <= 32 x 12 x 16256 < 2^24, so its fp32 conversion is exact too).
template <int MR, int NB, bool NV, bool Q15>
inline void dot_tile_fp4_int(const int8_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                             float* c) {
  const int far = far_prefetch_bytes();
  constexpr int G = NV ? 16 : 32;  // inputs per weight scale
  constexpr int GQ = G / 4;        // quads per scale group
  constexpr int S = MR == 1 ? 2 : 1;
  __m512i acc[S][MR][NB];            // q8: q; q15: lo
  __m512i hi[Q15 ? S : 1][MR][NB];   // q15: hi
  __m512 tot[MR][NB];
  const __m512i lut = _mm512_loadu_si512((const void*)kFp4U8Lut.v);
  const int nb = kp / kQ8Group;
  const size_t lo_off = Q15 ? size_t(kp) : 0;  // where the seeded chain's codes start in a row
  const float* d[MR];
  const int32_t* s16[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {  // row layouts: kernel_table.h (q8_row_bytes, q15_row_bytes)
    d[r] = reinterpret_cast<const float*>(a[r] + (Q15 ? 2 : 1) * size_t(kp));
    s16[r] = reinterpret_cast<const int32_t*>(d[r] + (Q15 ? 1 : 2) * nb);
  }
  // chain 0 of (r, j) starts each group at -kFp4Offset * sum q of the group, the others at zero
  auto seed = [&](int g) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const int32_t sq = NV ? s16[r][g] : s16[r][2 * g] + s16[r][2 * g + 1];
      const __m512i o = _mm512_set1_epi32(-kFp4Offset * sq);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        acc[0][r][j] = o;
#pragma GCC unroll 2
        for (int i = 1; i < S; ++i) acc[i][r][j] = _mm512_setzero_si512();
        if constexpr (Q15) {
#pragma GCC unroll 2
          for (int i = 0; i < S; ++i) hi[i][r][j] = _mm512_setzero_si512();
        }
      }
    }
  };
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) tot[r][j] = _mm512_setzero_ps();
  const int ngroups = kp / G;
  for (int g = 0; g < ngroups; ++g) {
    seed(g);
#pragma GCC unroll 8
    for (int qq = 0; qq < GQ; ++qq) {
      const int q = g * GQ + qq;
      __m512i w[NB];
      fp4_quads_u8<NB>(b, q, far, lut, w);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        int32_t x;
        memcpy(&x, a[r] + lo_off + 4 * q, 4);
        const __m512i av = _mm512_set1_epi32(x);
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) acc[qq % S][r][j] = dot4_u8s8(acc[qq % S][r][j], w[j], av);
        if constexpr (Q15) {
          memcpy(&x, a[r] + 4 * q, 4);
          const __m512i hv = _mm512_set1_epi32(x);
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) hi[qq % S][r][j] = dot4_u8s8(hi[qq % S][r][j], w[j], hv);
        }
      }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const __m512 sv = NV ? fp8x16_to_f32(sc[j] + g * 16) : e8m0x16_to_f32(sc[j] + g * 16);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        __m512i sum = acc[0][r][j];
#pragma GCC unroll 2
        for (int i = 1; i < S; ++i) sum = _mm512_add_epi32(sum, acc[i][r][j]);
        if constexpr (Q15) {
          __m512i h = hi[0][r][j];
#pragma GCC unroll 2
          for (int i = 1; i < S; ++i) h = _mm512_add_epi32(h, hi[i][r][j]);
          sum = _mm512_add_epi32(sum, _mm512_slli_epi32(h, 7));
        }
        const __m512 sd = _mm512_mul_ps(sv, _mm512_set1_ps(d[r][NV ? g / 2 : g]));
        tot[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sd, tot[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + r * 32 + j * 16, _mm512_mul_ps(tot[r][j], _mm512_set1_ps(0.5f)));
}

template <int NB, bool NV, bool Q15>
void dot_rows_fp4_int_t(int mr, const int8_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                        float* c) {
  switch (mr) {
    case 1: dot_tile_fp4_int<1, NB, NV, Q15>(a, b, sc, kp, c); break;
    case 2: dot_tile_fp4_int<2, NB, NV, Q15>(a, b, sc, kp, c); break;
    case 3: dot_tile_fp4_int<3, NB, NV, Q15>(a, b, sc, kp, c); break;
    default: dot_tile_fp4_int<4, NB, NV, Q15>(a, b, sc, kp, c); break;
  }
}
// The rows are q15 rows if q15, else q8 rows (dot_tile_fp4_int).
template <int NB>
void dot_rows_fp4_int(bool nv, bool q15, int mr, const int8_t* const* a, const uint8_t* const* b,
                      const uint8_t* const* sc, int kp, float* c) {
  if (q15) {
    if (nv) dot_rows_fp4_int_t<NB, true, true>(mr, a, b, sc, kp, c);
    else dot_rows_fp4_int_t<NB, false, true>(mr, a, b, sc, kp, c);
  } else {
    if (nv) dot_rows_fp4_int_t<NB, true, false>(mr, a, b, sc, kp, c);
    else dot_rows_fp4_int_t<NB, false, false>(mr, a, b, sc, kp, c);
  }
}

template <int NB, bool NV>
void dot_rows_fp4_t(int mr, const uint16_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                    float* c) {
  switch (mr) {
    case 1: dot_tile_fp4<1, NB, NV>(a, b, sc, kp, c); break;
    case 2: dot_tile_fp4<2, NB, NV>(a, b, sc, kp, c); break;
    case 3: dot_tile_fp4<3, NB, NV>(a, b, sc, kp, c); break;
    default: dot_tile_fp4<4, NB, NV>(a, b, sc, kp, c); break;
  }
}
template <int NB>
void dot_rows_fp4(bool nv, int mr, const uint16_t* const* a, const uint8_t* const* b, const uint8_t* const* sc,
                  int kp, float* c) {
  if (nv) dot_rows_fp4_t<NB, true>(mr, a, b, sc, kp, c);
  else dot_rows_fp4_t<NB, false>(mr, a, b, sc, kp, c);
}
#else
constexpr int kFusedFp4Rows = 0;
template <int NB>
void dot_rows_fp4(bool, int, const uint16_t* const*, const uint8_t* const*, const uint8_t* const*, int, float*) {}
template <int NB>
void dot_rows_fp4_int(bool, bool, int, const int8_t* const*, const uint8_t* const*, const uint8_t* const*, int, float*) {}
#endif

// c[0:16] *= s (an nvfp4 global scale; 1 for mxfp4 is skipped by the callers).
inline void scale_16(float* c, float s) {
  for (int n = 0; n < 16; ++n) c[n] *= s;
}

constexpr int kFp4Seg = kMaxSeg;  // inputs dequantized at a time on the prefill path

// One fp4 block whole into a prefill panel (dst: code x scale as bf16, the bf16 block layout).
inline void fp4_panel_block(const Fp4Weights& q, const uint8_t* src, const uint8_t* sc, int kp, uint16_t* dst) {
  const int grp = q.nv ? 16 : 32;
  for (int k0 = 0; k0 < kp; k0 += kFp4Seg)
    fp4_dequant_seg(q, src + size_t(k0) * kBlockN / 2, sc + (k0 / grp) * kBlockN, dst + size_t(k0) * kBlockN,
                    tmin(kFp4Seg, kp - k0));
}

void gate_up_fp4(const GateUpTask& t) {
  const Fp4Weights& q = t.f4;
  const int grp = q.nv ? 16 : 32;  // inputs per scale
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / grp) * kBlockN;  // scale bytes per block
  const bool global = q.nv && (q.gs[0] != 1.0f || q.gs[1] != 1.0f);
  uint16_t* dg = t.scratch->deq;
  uint16_t* du = dg + kFp4Seg * kBlockN;
  float* tot = t.scratch->acc;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* bu = bg + block_bytes;
    const uint8_t* sg = q.scale + size_t(j) * 2 * per;
    const uint8_t* su = sg + per;
    // gate|up pre-activations of one row (fp32, 32) -> that row's act values of block j
    auto finish = [&](float* g, int r) {
      if (global) {
        scale_16(g, q.gs[0]);
        scale_16(g + 16, q.gs[1]);
      }
      act_16(t, j, g, g + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
    };
    if (kHaveQ8 && t.q8_rows) {  // decode with int8 activations, the block pair in L1/L2 across row tiles
      const uint8_t* b[2] = {bg, bu};
      const uint8_t* sc[2] = {sg, su};
      for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
        const int mr = tmin(kQ8TileRows, t.m - r0);
        dot_rows_fp4_int<2>(q.nv, t.q15, mr, t.q8_rows + r0, b, sc, t.kp, c);
        for (int r = 0; r < mr; ++r) finish(c + r * 32, r0 + r);
      }
      continue;
    }
    if (t.m <= kFusedFp4Rows) {  // decode: codes converted in registers, group scales in the tile
      const uint8_t* b[2] = {bg, bu};
      const uint8_t* sc[2] = {sg, su};
      dot_rows_fp4<2>(q.nv, t.m, t.x_rows, b, sc, t.kp, c);
      for (int r = 0; r < t.m; ++r) finish(c + r * 32, r);
      continue;
    }
#if defined(LK_V512)
    fp4_panel_block(q, bg, sg, t.kp, panel_of(*t.scratch, t.kp, 0));
    fp4_panel_block(q, bu, su, t.kp, panel_of(*t.scratch, t.kp, 1));
    gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr,
                            2 * block_bytes, finish);
    continue;
#endif
    memset(tot, 0, size_t(t.m) * 32 * 4);
    for (int k0 = 0; k0 < t.kp; k0 += kFp4Seg) {  // dequantize each segment once, reuse it for every row tile
      const int len = tmin(kFp4Seg, t.kp - k0);
      const void* b[2] = {dg, du};
      fp4_dequant_seg(q, bg + size_t(k0) * kBlockN / 2, sg + (k0 / grp) * kBlockN, dg, len);
      fp4_dequant_seg(q, bu + size_t(k0) * kBlockN / 2, su + (k0 / grp) * kBlockN, du, len);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.x_rows[r0 + r] + k0;
        dot_rows<2>(mr, rows, b, len, c);
        for (int r = 0; r < mr; ++r) {
          float* o = tot + size_t(r0 + r) * 32;
          axpy_16(1.0f, c + r * 32, o);
          axpy_16(1.0f, c + r * 32 + 16, o + 16);
        }
      }
    }
    for (int r = 0; r < t.m; ++r) finish(tot + size_t(r) * 32, r);
  }
}

void down_fp4(const DownTask& t) {
  const Fp4Weights& q = t.f4;
  const int grp = q.nv ? 16 : 32;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / grp) * kBlockN;
  const float gs = q.nv ? q.gs[0] : 1.0f;  // the global scale rides on the router weight (both scalars)
  uint16_t* d0 = t.scratch->deq;
  uint16_t* d1 = d0 + kFp4Seg * kBlockN;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  const bool fused = t.m <= kFusedFp4Rows;
  if (fused)
    for (int r = 0; r < t.m; ++r) rows[r] = t.act + size_t(r) * t.act_ld;
  for (int j = 0; j < t.nblk; j += 2) {  // two blocks per tile share the activation broadcasts
    const int nb = tmin(2, t.nblk - j);
    const uint8_t* b[2] = {q.w + size_t(j) * block_bytes, q.w + size_t(j + nb - 1) * block_bytes};
    const uint8_t* s[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
    if (kHaveQ8 && t.q8_act) {  // decode with int8 activations
      const int8_t* rows8[kQ8TileRows];
      for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
        const int mr = tmin(kQ8TileRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows8[r] = t.q8_act + size_t(r0 + r) * t.q8_ld;
        if (nb == 2) dot_rows_fp4_int<2>(q.nv, t.q15, mr, rows8, b, s, t.kp, c);
        else dot_rows_fp4_int<1>(q.nv, t.q15, mr, rows8, b, s, t.kp, c);
        for (int r = 0; r < mr; ++r) {
          float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
          for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r0 + r] * gs, c + r * 32 + h * 16, o + h * 16);
        }
      }
      continue;
    }
    if (fused) {
      if (nb == 2) dot_rows_fp4<2>(q.nv, t.m, rows, b, s, t.kp, c);
      else dot_rows_fp4<1>(q.nv, t.m, rows, b, s, t.kp, c);
      for (int r = 0; r < t.m; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
        for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r] * gs, c + r * 32 + h * 16, o + h * 16);
      }
      continue;
    }
#if defined(LK_V512)
    for (int h = 0; h < nb; ++h) fp4_panel_block(q, b[h], s[h], t.kp, panel_of(*t.scratch, t.kp, h));
    down_panel<kSegNone>(t, j, nb, 0, nullptr, nullptr, gs, j + 2 < t.nblk ? b[0] + 2 * block_bytes : nullptr,
                         size_t(tmin(2, t.nblk - j - 2)) * block_bytes);
    continue;
#endif
    for (int k0 = 0; k0 < t.kp; k0 += kFp4Seg) {
      const int len = tmin(kFp4Seg, t.kp - k0);
      const void* bd[2] = {d0, d1};
      for (int h = 0; h < nb; ++h)
        fp4_dequant_seg(q, b[h] + size_t(k0) * kBlockN / 2, s[h] + (k0 / grp) * kBlockN, h ? d1 : d0, len);
      for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
        const int mr = tmin(kMaxRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld + k0;
        if (nb == 2) dot_rows<2>(mr, rows, bd, len, c);
        else dot_rows<1>(mr, rows, bd, len, c);
        for (int r = 0; r < mr; ++r) {
          float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
          for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r0 + r] * gs, c + r * 32 + h * 16, o + h * 16);
        }
      }
    }
  }
}

#if defined(LK_AMX)
void gate_up(const GateUpTask& t) {
  // Quantized formats: decode on the vector tiles; prefill on dequantized panels through AMX (segment
  // scales, fp8_block and int4 groups, applied to the tiles' partial sums per segment).
  if (t.f4.w) return gate_up_fp4(t);
  if (t.q4.w) return gate_up_q4(t);
  if (t.fp8.w) return gate_up_fp8(t);
  if (t.m < kAmxMinRows) return gate_up_vec(t);
  amx_configure();
  float* c = t.scratch->c;
  uint16_t* panel = t.scratch->panel;
  const size_t block = size_t(t.kp) * kBlockN;
  const int mt = (t.m + 31) / 32 * 32;
  amx_gather_rows(t);
  for (int j = 0; j < t.nblk; ++j) {  // block pair stays in L2 across the row tiles
    const uint16_t* bg = t.w13 + size_t(j) * 2 * block;
    for (int r0 = 0; r0 < mt; r0 += 32) {
      amx_tile_32x32(panel + size_t(r0) * t.kp, t.kp, bg, bg + block, t.kp, c);
      const int mr = tmin(32, t.m - r0);
      for (int r = 0; r < mr; ++r)
        silu_mul_16(c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
    }
  }
  _tile_release();
}

void down(const DownTask& t) {
  if (t.f4.w) return down_fp4(t);
  if (t.q4.w) return down_q4(t);
  if (t.fp8.w) return down_fp8(t);
  if (t.m < kAmxMinRows) return down_vec(t);
  amx_configure();
  float* c = t.scratch->c;
  const size_t block = size_t(t.kp) * kBlockN;
  for (int r0 = 0; r0 < t.m; r0 += 32) {
    const int mr = tmin(32, t.m - r0);  // rows past m are readable slack; their results are dropped
    const uint16_t* a = t.act + size_t(r0) * t.act_ld;
    for (int j = 0; j < t.nblk; j += 2) {
      const int nb = tmin(2, t.nblk - j);
      const uint16_t* b0 = t.w2 + size_t(j) * block;
      amx_tile_32x32(a, t.act_ld, b0, b0 + (nb - 1) * block, t.kp, c);
      for (int r = 0; r < mr; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        for (int q = 0; q < nb; ++q) axpy_16(t.row_weight[r0 + r], c + r * 32 + q * 16, o + q * 16);
      }
    }
  }
  _tile_release();
}
#else
void gate_up(const GateUpTask& t) {
  t.f4.w ? gate_up_fp4(t) : t.q4.w ? gate_up_q4(t) : t.fp8.w ? gate_up_fp8(t) : gate_up_vec(t);
}
void down(const DownTask& t) { t.f4.w ? down_fp4(t) : t.q4.w ? down_q4(t) : t.fp8.w ? down_fp8(t) : down_vec(t); }
#endif

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

#if defined(LK_V512)
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, &q8_row, &q15_row};
#else
const KernelTable kTable = {kTierName, &gate_up, &down, &to_bf16, &store_row, &read_sum, nullptr, nullptr};
#endif

}  // namespace

const KernelTable* kernel_table() { return &kTable; }

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
