// Shared pieces of the expert kernels: the scalar conversions, the SIMD bodies of each tier (the bf16
// dot tile, the activation, axpy) and the row-tile helpers. Every file of csrc/cpu/kernels/ is
// compiled once per ISA tier (CMakeLists.txt globs the folder; the tiers are isa_tiers.h's rows).
//
// LK_TIER names the tier; the code picks its instructions from the compiler's target macros, so the
// same source yields every tier. Everything here sits in an anonymous namespace inside
// lk::tier_<name>, and each kernel file's entry points (kernels.h) in lk::tier_<name> itself: no
// symbol of one tier can be merged with another tier's (which would let an AVX-512 body run on a CPU
// without AVX-512). For the same reason nothing here calls inline functions from the standard library.
//
// Kernels (all accumulate in fp32), one file per format family:
// - bf16.cpp: dot_tile<MR, NB> (below): MR token rows x NB packed blocks (16 outputs each), the
//   workhorse of decode (memory bound: each weight byte is loaded once per forward) and of prefill on
//   tiers without AMX; amx_tile_32x32 (panels.h, amx tier): 32 rows x 2 blocks with tdpbf16ps, used
//   once an expert has >= kAmxMinRows tokens; amx_tile_32x32_seg with per-segment scales.
// - quantized prefill on the AVX-512 tiers (panels.h): each block (pair) dequantized whole into a
//   bf16 panel, then dot_tile (segment scales in registers) or the AMX tiles over all of K.
// - fp8.cpp: one-byte codes (fp8_block, fp8_channel, int8_channel) widened in registers.
// - int4.cpp (wna16_int4): dot_tile_q4q8 (int8 activations, vpdpbusd) or dot_tile_q4 for decode.
// - fp4.cpp, mxfp4 (gpt-oss) and nvfp4 (ModelOpt): dot_tile_fp4 / dot_tile_fp4_int for decode.
// - act_quant.cpp: the int8 / 15-bit activation rows of the 4-bit decode (q8_row, q15_row).
// - table.cpp: the tier's KernelTable (the dispatch on the task's weights, the row conversions).
#pragma once

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
#if defined(LK_VBF16) && defined(__AVX512VBMI__)  // the avx512_bf16 and amx tiers (isa_tiers.h)
#define LK_FP8_TABLE 1
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define LK_AMX 1
#endif

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

template <typename T>
inline T tmin(T a, T b) { return a < b ? a : b; }
template <typename T>
inline T tmax(T a, T b) { return a < b ? b : a; }

// A range of cache lines to pull into L2 while a compute-bound tile runs: the next block's
// weights, so that they do not arrive at DRAM speed when the next tile needs them.
struct Prefetch {
  const char* p = nullptr;
  int lines = 0;
};

#if defined(__AVX2__)
// A Prefetch spread over a tile's `steps` loop steps: step() issues one line every steps / lines steps.
struct Trickle {
  Prefetch pf;
  int every, countdown, next = 0;
  Trickle(Prefetch p, int steps)
      : pf(p), every(p.lines ? (steps / p.lines > 0 ? steps / p.lines : 1) : 0), countdown(every) {}
  inline void step() {
    if (every && --countdown == 0) {
      countdown = every;
      if (next < pf.lines) _mm_prefetch(pf.p + 64 * next++, _MM_HINT_T1);
    }
  }
};
#endif

// ---------------------------------------------------------------- scalar conversions
inline float bf16_to_f32(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// e8m0 byte -> 2^(s - 127) as fp32 (s = 0: the subnormal 2^-127; s = 255: NaN): the MX formats' scales.
inline float e8m0_to_f32(uint8_t s) {
  const uint32_t u = s == 0 ? 0x00400000u : s == 255 ? 0x7FC00000u : uint32_t(s) << 23;
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

constexpr uint16_t fp8_to_bf16_1(uint8_t b) {
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

// b * tanh(x / b) as 1 - 2 / (exp(2x / b) + 1), times b: exp_v's bounds give +-b at the ends, a NaN stays NaN.
inline __m512 soft_clip_v(__m512 x, float b) {
  const __m512 one = _mm512_set1_ps(1.0f), bv = _mm512_set1_ps(b);
  const __m512 e = exp_v(_mm512_mul_ps(x, _mm512_set1_ps(2.0f / b)));
  return _mm512_mul_ps(bv, _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one))));
}

// Activation::kSitu: beta * tanh(g / beta) * sigmoid(g) * u', u' = linear_beta * tanh(u / linear_beta) (u if 0).
inline void situ_mul_16(const float* g, const float* u, float beta, float linear_beta, uint16_t* out) {
  const __m512 gv = _mm512_loadu_ps(g), one = _mm512_set1_ps(1.0f);
  const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp_v(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
  __m512 uv = _mm512_loadu_ps(u);
  if (linear_beta > 0) uv = soft_clip_v(uv, linear_beta);
  _mm256_storeu_si256((__m256i*)out, f32_to_bf16_v(_mm512_mul_ps(_mm512_mul_ps(soft_clip_v(gv, beta), sig), uv)));
}

// Activation::kSwigluOAI: (clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit). The clamps
// take the bound as the first operand: min/max return the second when either is NaN, so a NaN stays NaN.
inline void swigluoai_mul_16(const float* g, const float* u, float alpha, float limit, uint16_t* out) {
  const __m512 gv = _mm512_min_ps(_mm512_set1_ps(limit), _mm512_loadu_ps(g));
  const __m512 uv = _mm512_max_ps(_mm512_set1_ps(-limit), _mm512_min_ps(_mm512_set1_ps(limit), _mm512_loadu_ps(u)));
  const __m512 e = exp_v(_mm512_mul_ps(gv, _mm512_set1_ps(-alpha)));
  const __m512 glu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  _mm256_storeu_si256((__m256i*)out, f32_to_bf16_v(_mm512_mul_ps(_mm512_add_ps(uv, _mm512_set1_ps(1.0f)), glu)));
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

#if defined(LK_FP8_TABLE)
// 64 fp8 e4m3fn codes -> 64 bf16 by table, exact (every code, subnormals and NaN included: the table is
// fp8_to_bf16_1's). The 7 magnitude bits index two 128-byte tables (vpermt2b: the bf16's low and high
// bytes), the sign goes into the high byte, and vpunpck{l,h}bw pair the bytes into words. vpunpck works per
// 128-bit lane, so the codes are first put in the order that makes its words come out as pair-rows p and
// p + 1 (bytes 0-31 and 32-63). 7 shuffle uops for 64 codes against fp8x32_to_bf16's 20 (2 x 10). One core
// of a Xeon with AMX, a Qwen3-Next layer held in L3 (benchmarks/moe_layer.py --format fp8_block --threads 1
// --max-experts 12 --rotate-bytes 1e6): 20.0 GB/s of codes at M = 1 against 14.6, which was about what
// each engine thread of a 16-core host must read (docs/results/2026-12-06_amx2c_fp8_decode_table.log).
struct Fp8ByteTables {
  uint8_t lo[128], hi[128], order[64];
};
constexpr Fp8ByteTables make_fp8_byte_tables() {
  Fp8ByteTables t{};
  for (int m = 0; m < 128; ++m) {
    t.lo[m] = uint8_t(fp8_to_bf16_1(uint8_t(m)) & 0xFF);
    t.hi[m] = uint8_t(fp8_to_bf16_1(uint8_t(m)) >> 8);
  }
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < 8; ++i) {
      t.order[16 * lane + i] = uint8_t(8 * lane + i);           // vpunpcklbw: pair-row p
      t.order[16 * lane + 8 + i] = uint8_t(32 + 8 * lane + i);  // vpunpckhbw: pair-row p + 1
    }
  return t;
}
alignas(64) inline constexpr Fp8ByteTables kFp8ByteTables = make_fp8_byte_tables();

struct Fp8Lut {
  __m512i lo0, lo1, hi0, hi1, order;
};
inline Fp8Lut fp8_lut() {
  const Fp8ByteTables& t = kFp8ByteTables;
  return {_mm512_loadu_si512(t.lo), _mm512_loadu_si512(t.lo + 64), _mm512_loadu_si512(t.hi),
          _mm512_loadu_si512(t.hi + 64), _mm512_loadu_si512(t.order)};
}
inline __attribute__((always_inline)) void fp8x64_to_bf16(__m512i codes, const Fp8Lut& t, __m512i& w0, __m512i& w1) {
  codes = _mm512_permutexvar_epi8(t.order, codes);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, codes, t.lo1);  // index bits 0-6: the sign is ignored
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, codes, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8(int8_t(0x80)), 0x78);  // hi ^ (codes & 0x80)
  w0 = _mm512_unpacklo_epi8(lo, hi);
  w1 = _mm512_unpackhi_epi8(lo, hi);
}

// The whole 64-code groups of n codes through a table into dst; returns how many codes it converted.
inline int fp8_table_run(const uint8_t* src, uint16_t* dst, int n, const Fp8Lut& lut) {
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    _mm_prefetch((const char*)(src + i + 512), _MM_HINT_T0);
    __m512i w0, w1;
    fp8x64_to_bf16(_mm512_loadu_si512(src + i), lut, w0, w1);
    _mm512_storeu_si512((void*)(dst + i), w0);
    _mm512_storeu_si512((void*)(dst + i + 32), w1);
  }
  return i;
}

// The tables of bf16(value x s) for one scale s (rounded to nearest even once): a block's segment scale folded
// into the conversion, ~40 vector ops per table against the 2048 codes of a 16-row block's 128-input segment.
// The sign goes in by xor, so a negative scale flips it right; NaN stays NaN.
inline Fp8Lut fp8_scaled_lut(float s) {
  static const auto values = [] {  // every e4m3 magnitude's value (127: NaN)
    struct { alignas(64) float v[128]; } t;
    for (int m = 0; m < 128; ++m) t.v[m] = bf16_to_f32(fp8_to_bf16_1(uint8_t(m)));
    return t;
  }();
  const __m512 sv = _mm512_set1_ps(s);
  __m512i words[4];  // bf16 of magnitudes 32i .. 32i + 31
  for (int i = 0; i < 4; ++i)
    words[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_load_ps(values.v + 32 * i + 16), sv),
                                            _mm512_mul_ps(_mm512_load_ps(values.v + 32 * i), sv));
  auto bytes = [](__m512i a, __m512i b, int shift) {  // the low (0) or high (8) bytes of 64 words
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, shift))),
                              _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, shift)), 1);
  };
  return {bytes(words[0], words[1], 0), bytes(words[2], words[3], 0), bytes(words[0], words[1], 8),
          bytes(words[2], words[3], 8), _mm512_loadu_si512(kFp8ByteTables.order)};
}
#endif

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
  Trickle trickle(pf, npairs);
#if defined(LK_FP8_TABLE)
  // fp8 codes by table, two pair-rows a step; few accumulators: a second set for the odd pair-rows, so
  // no chain of dependent dot products sets the pace (down's single block at M = 1 had one chain)
  constexpr bool kTable = CODES == kCodesFp8;
  constexpr bool kSplit = kTable && MR * NB <= 4;
  __m512 acc2[kSplit ? MR : 1][kSplit ? NB : 1];
  if constexpr (kSplit)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) acc2[r][j] = _mm512_setzero_ps();
  Fp8Lut lut;
  if constexpr (kTable) lut = fp8_lut();
#endif
  for (int p0 = 0, sidx = 0; p0 < npairs; p0 += seg_pairs, ++sidx) {
#if defined(LK_FP8_TABLE)
  if constexpr (kTable) {
  for (int p = p0; p < p0 + seg_pairs; p += 2) {  // (seg and kp: multiples of 32 inputs)
    trickle.step();
    trickle.step();
    __m512i w0[NB], w1[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const char* at = static_cast<const char*>(b[j]) + p * kRowBytes;
      _mm_prefetch(at + kPrefetchNearBytes, _MM_HINT_T0);
      if (far) _mm_prefetch(at + far, _MM_HINT_T1);
      fp8x64_to_bf16(_mm512_loadu_si512(at), lut, w0[j], w1[j]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512i a0 = bcast_pair(a[r] + 2 * p), a1 = bcast_pair(a[r] + 2 * p + 2);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)a0, (__m512bh)w0[j]);
        if constexpr (kSplit) acc2[r][j] = _mm512_dpbf16_ps(acc2[r][j], (__m512bh)a1, (__m512bh)w1[j]);
        else acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)a1, (__m512bh)w1[j]);
      }
    }
  }
  if constexpr (kSplit)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        acc[r][j] = _mm512_add_ps(acc[r][j], acc2[r][j]);
        acc2[r][j] = _mm512_setzero_ps();
      }
  } else
#endif
#if defined(LK_VBF16)
  for (int p = p0; p < p0 + seg_pairs; ++p) {
    trickle.step();
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
    trickle.step();
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

// b * tanh(x / b) as 1 - 2 / (exp(2x / b) + 1), times b: exp_v's bounds give +-b at the ends, a NaN stays NaN.
inline __m256 soft_clip_v(__m256 x, float b) {
  const __m256 one = _mm256_set1_ps(1.0f), bv = _mm256_set1_ps(b);
  const __m256 e = exp_v(_mm256_mul_ps(x, _mm256_set1_ps(2.0f / b)));
  return _mm256_mul_ps(bv, _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one))));
}

// Activation::kSitu: beta * tanh(g / beta) * sigmoid(g) * u', u' = linear_beta * tanh(u / linear_beta) (u if 0).
inline void situ_mul_16(const float* g, const float* u, float beta, float linear_beta, uint16_t* out) {
  float y[16];
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int h = 0; h < 2; ++h) {
    const __m256 gv = _mm256_loadu_ps(g + 8 * h);
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp_v(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    __m256 uv = _mm256_loadu_ps(u + 8 * h);
    if (linear_beta > 0) uv = soft_clip_v(uv, linear_beta);
    _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_mul_ps(soft_clip_v(gv, beta), sig), uv));
  }
  store_bf16_16(y, out);
}

// Activation::kSwigluOAI: (clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit); NaN stays NaN.
inline void swigluoai_mul_16(const float* g, const float* u, float alpha, float limit, uint16_t* out) {
  float y[16];
  for (int h = 0; h < 2; ++h) {
    const __m256 gv = _mm256_min_ps(_mm256_set1_ps(limit), _mm256_loadu_ps(g + 8 * h));
    const __m256 uv = _mm256_max_ps(_mm256_set1_ps(-limit), _mm256_min_ps(_mm256_set1_ps(limit), _mm256_loadu_ps(u + 8 * h)));
    const __m256 e = exp_v(_mm256_mul_ps(gv, _mm256_set1_ps(-alpha)));
    const __m256 glu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(_mm256_add_ps(uv, _mm256_set1_ps(1.0f)), glu));
  }
  store_bf16_16(y, out);
}

inline void axpy_16(float w, const float* c, float* o) {
  __m256 wv = _mm256_set1_ps(w);
  _mm256_storeu_ps(o, _mm256_fmadd_ps(wv, _mm256_loadu_ps(c), _mm256_loadu_ps(o)));
  _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(wv, _mm256_loadu_ps(c + 8), _mm256_loadu_ps(o + 8)));
}

// 16 fp8 e4m3fn bytes -> 16 fp16 bits of 2^-8 times their values, exact, subnormals included: the sign
// to bit 15, the other 7 bits << 7 (e4m3's exponent read with fp16's bias, 15 - 7 = 8 higher); 0x7F /
// 0xFF become fp16 NaN. vcvtph2ps then gives the fp32 values / 256.
inline __m256i fp8x16_to_f16_div256(__m128i bytes) {
  const __m256i m7f = _mm256_set1_epi16(0x7F);
  const __m256i v = _mm256_cvtepu8_epi16(bytes);
  const __m256i mag = _mm256_and_si256(v, m7f);
  const __m256i f16 = _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
  return _mm256_blendv_epi8(f16, _mm256_or_si256(f16, _mm256_set1_epi16(0x7E00)), _mm256_cmpeq_epi16(mag, m7f));
}

// bf16 blocks, each pair-row split into its even and odd inputs with a shift and a mask (the next codes' prefetch
// is not taken: the quantized formats' panels go through f32_panel_tile below).
template <int MR, int NB>
inline void dot_tile(const uint16_t* const* a, const void* const* bv, int kp, float* c, Prefetch,
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
        const __m256i w = _mm256_loadu_si256((const __m256i*)(b[j] + p * 32 + h * 16));
        const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, hi_mask));
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

// The fp32 panels' row tile (LK_F32_PANELS): MR rows (1-4) x one block of 16 outputs, row r's sums to
// c + r * 32. Four rows over one block rather than dot_tile's two over a pair: each pair-row read from the
// panel (L2-resident: 16 x kp fp32 per block) serves twice the rows, so the tile reads 16 bytes a cycle
// at the FMA peak where two rows over two blocks needed 32, all the L2 of a Zen 3 core gives.
template <int MR>
inline void f32_panel_tile(const uint16_t* const* a, const float* b, int kp, float* c, Prefetch pf) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i hi_mask = _mm256_set1_epi32(int32_t(0xffff0000u));
  const int npairs = kp / 2;
  Trickle trickle(pf, npairs);
  for (int p = 0; p < npairs; ++p) {
    trickle.step();
    const float* w = b + p * 32;
    const __m256 w0e = _mm256_loadu_ps(w), w0o = _mm256_loadu_ps(w + 8);
    const __m256 w1e = _mm256_loadu_ps(w + 16), w1o = _mm256_loadu_ps(w + 24);
    for (int r = 0; r < MR; ++r) {
      int32_t v;
      memcpy(&v, a[r] + 2 * p, 4);
      const __m256i av = _mm256_set1_epi32(v);
      const __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(av, 16));
      const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(av, hi_mask));
      acc[r][0] = _mm256_fmadd_ps(w0o, a1, _mm256_fmadd_ps(w0e, a0, acc[r][0]));
      acc[r][1] = _mm256_fmadd_ps(w1o, a1, _mm256_fmadd_ps(w1e, a0, acc[r][1]));
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * 32, acc[r][0]);
    _mm256_storeu_ps(c + r * 32 + 8, acc[r][1]);
  }
}
constexpr int kF32TileRows = 4;

#else  // generic: portable C++ (the compiler may use baseline SSE2)

inline void silu_mul_16(const float* g, const float* u, uint16_t* out) {
  for (int n = 0; n < 16; ++n) {
    float gv = g[n];
    float e = __builtin_expf(-(gv < -kExpHi ? -kExpHi : (gv > kExpHi ? kExpHi : gv)));
    out[n] = f32_to_bf16(silu_f32(gv, e) * u[n]);
  }
}

inline float exp_bounded(float x) { return __builtin_expf(x < -kExpHi ? -kExpHi : (x > kExpHi ? kExpHi : x)); }

// b * tanh(x / b) as the vector tiers compute it: b * (1 - 2 / (exp(2x / b) + 1)).
inline float soft_clip(float x, float b) { return b * (1.0f - 2.0f / (exp_bounded(x * (2.0f / b)) + 1.0f)); }

// Activation::kSitu: beta * tanh(g / beta) * sigmoid(g) * u', u' = linear_beta * tanh(u / linear_beta) (u if 0).
inline void situ_mul_16(const float* g, const float* u, float beta, float linear_beta, uint16_t* out) {
  for (int n = 0; n < 16; ++n) {
    const float sig = 1.0f / (1.0f + exp_bounded(-g[n]));
    const float uv = linear_beta > 0 ? soft_clip(u[n], linear_beta) : u[n];
    out[n] = f32_to_bf16(soft_clip(g[n], beta) * sig * uv);
  }
}

// Activation::kSwigluOAI: (clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit); the
// comparisons are false for NaN, so it passes through.
inline void swigluoai_mul_16(const float* g, const float* u, float alpha, float limit, uint16_t* out) {
  for (int n = 0; n < 16; ++n) {
    const float gv = g[n] > limit ? limit : g[n];
    const float uv = u[n] < -limit ? -limit : (u[n] > limit ? limit : u[n]);
    out[n] = f32_to_bf16((uv + 1.0f) * gv * (1.0f / (1.0f + exp_bounded(-alpha * gv))));
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

// act[0:16] of a gate/up task from its pre-activations g and u (16 each), as bf16: silu(g) * u, or for
// Activation::kSiLUClamp silu(min(g, limit)) * clamp(u, -limit, limit), for kSitu situ_mul_16 with
// (beta, linear_beta) = (alpha, limit), for kSwigluOAI swigluoai_mul_16 (gpt-oss, MiniMax-M3). The clamps keep
// a NaN a NaN, as vLLM's torch.clamp does. Every format's gate/up kernel ends in it (the fp4 formats' act_16
// adds their biases first).
inline void gate_act_16(const GateUpTask& t, const float* g, const float* u, uint16_t* out) {
  if (t.act_fn == Activation::kSitu) return situ_mul_16(g, u, t.alpha, t.limit, out);
  if (t.act_fn == Activation::kSwigluOAI) return swigluoai_mul_16(g, u, t.alpha, t.limit, out);
  if (t.act_fn != Activation::kSiLUClamp) return silu_mul_16(g, u, out);
  const float lim = t.limit;
  float gc[16], uc[16];
  for (int n = 0; n < 16; ++n) {
    gc[n] = g[n] > lim ? lim : g[n];
    uc[n] = u[n] > lim ? lim : (u[n] < -lim ? -lim : u[n]);
  }
  silu_mul_16(gc, uc, out);
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
}  // namespace

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
