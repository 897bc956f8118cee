// 4-bit float experts: mxfp4 (OCP microscaling, gpt-oss) and nvfp4 (ModelOpt). Layout: kernel_table.h
// Fp4Weights.
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/panels.h"
#include "cpu/kernels/quad.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

// ---------------------------------------------------------------- mxfp4 (gpt-oss) and nvfp4 (ModelOpt)
// Strategy. Decode, default (chunks of <= kQ8MaxTokens tokens on the AVX-512 tiers, and on avx2 through quad.h's
// integer tile over fp4_int_panel panels; LK_INT8_ACT not set
// for fp4): 15-bit activations, dot_tile_fp4_int with Q15. x and the bf16 act rows become q15 rows once per chunk
// (q15_row: per 32 inputs a power of two d with max|x| / d in (8128, 16256], q = round(x / d) split
// as 128 hi + lo into two int8 rows); each quad of codes becomes the unsigned bytes 12 + 2 e2m1 of the
// int8 path below (fp4_quad_u8: vpmovzxwd, vpternlogd, vpshufb) and feeds two vpdpbusd, one per
// activation half; per scale group 128 sum(u hi) + sum(u lo) - 12 sum q is sum 2 e2m1 q exactly, one
// conversion and one fmadd with scale x d. Error: only the inputs below 2^-6 of their group's max
// move, by at most 2^-14 of it (the rest is exact; int8 activations: up to 2^-8 of it); the layer
// output's relative RMS error against the fp32 reference is the bf16 tile's (gpt-oss shape, M = 1-16,
// Zen4: 0.0023-0.0024 both), and tests/engine/test_fp4_q15.py checks it against a reference that emulates
// the rounding, within the output's own bf16 rounding. Why: on the 16-core AMX host (Xeon, 2026-12-01, eleventh session,
// dev/decode_ops_micro.cpp on L1-resident codes, three runs) the vdpbf16ps tile below takes
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
// path below is the default): int4.cpp's int8 activations (act_quant.cpp) (q8 rows, quantized once per chunk per 32
// inputs) times exact int8 weights: 2 x e2m1 is an integer in +-{0, 1, 2, 3, 4, 6, 8, 12}, so each
// quad (32 bytes, the block layout as it is) becomes 16 dwords of 4 unsigned codes 12 + 2 e2m1
// (vpmovzxwd, one vpternlogd, one vpshufb table) and vpdpbusd (vpmaddubsw + vpmaddwd on the avx512
// tier) sums them with the activation bytes in int32; one chain per group starts at -12 x sum q (the
// offset, exact), and per scale group (mxfp4: 32 inputs, e8m0; nvfp4: 16 inputs, fp8 e4m3) the sum
// is converted once and multiplied by scale x d in fp32; the 1/2 and the nvfp4 global scales are
// applied to the totals. About 4 vector ops per 64 weights and row against ~9 for the bf16 widening
// below. Error: only the activations' int8 rounding (rel RMS of the layer output ~0.011-0.012
// against the fp32 reference, exact path ~0.0023; budget in tests/engine/conftest.py).
// Measured on the 2-core Zen4 dev VM (avx512_bf16 with VNNI, benchmarks/moe_layer.py --shapes
// qwen3-30b-a3b, LK_INT8_ACT=0 -> 1, medians of 3 runs; docs/results/2026-12-01_epyc2c_fp4_int8act_moe_layer.log,
// taken while other jobs loaded the VM, so M=4 with 2 threads swung 2-23 ms and is not quoted):
// 2 threads, M=1: mxfp4 0.689 -> 0.498 ms (29 -> 40 GB/s of quantized bytes), nvfp4 0.622 -> 0.584 ms
// (34 -> 36 GB/s). Hot weights (8 experts in L3, 1 thread): mxfp4 M=1 0.89 -> 0.57 ms, M=4 1.08 ->
// 0.65 ms; nvfp4 M=1 0.81 -> 0.54 ms, M=4 1.26 -> 1.02 ms (its per-16 epilogue, the fp8 scale
// conversion above all, is the larger share: a cheaper fp8x16_to_f32 is the next step there).
// Integer tasks of several row tiles (prefill with LK_INT8_ACT=1 on avx512 / avx512_bf16, decode chunks of more
// than 4 tokens) convert the block pair once into u8 panels (fp4_u8_panel_block) instead of once per row tile:
// nvfp4's int8 prefill went from 1.02-1.08x to 0.81-0.91x of bf16 on avx512_bf16 (2 Zen4 cores). The avx2 tier
// with LK_INT8_ACT=1 runs quad.h's avx2 integer tile over fp4_int_panel panels, decode and prefill.
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
// The same values split into low and high bytes, the 16 codes in each 128-bit lane (pshufb, avx2).
struct Fp4LutBytes {
  alignas(32) uint8_t lo[32];
  alignas(32) uint8_t hi[32];
};
constexpr Fp4LutBytes make_fp4_lut_bytes() {
  Fp4LutBytes t{};
  for (int i = 0; i < 32; ++i) {
    t.lo[i] = uint8_t(kFp4Lut.v[i] & 0xFF);
    t.hi[i] = uint8_t(kFp4Lut.v[i] >> 8);
  }
  return t;
}

// fp8 e4m3fn scale byte -> fp32 (exact; 0x7F / 0xFF: NaN). NVFP4's per-16-inputs block scale.
inline float fp8_to_f32(uint8_t s) { return bf16_to_f32(fp8_to_bf16_1(s)); }

// One fp4 scale byte -> fp32: e8m0 (mxfp4) or fp8 e4m3fn (nvfp4).
template <bool NV>
inline float fp4_scale_f32(uint8_t s) {
  if constexpr (NV) return fp8_to_f32(s);
  else return e8m0_to_f32(s);
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
  gate_act_16(t, g, u, out);
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
#elif defined(__AVX2__)
  // The e2m1 values' bf16 bytes, looked up per nibble (pshufb), times the row's scale in fp32; the
  // products are exact in bf16, so their high halves are the values (as the scalar path rounds them).
  static constexpr Fp4LutBytes kBytes = make_fp4_lut_bytes();
  const __m256i lut_lo = _mm256_load_si256((const __m256i*)kBytes.lo);
  const __m256i lut_hi = _mm256_load_si256((const __m256i*)kBytes.hi);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  // 8 floats (bf16 bits in the high halves) x scale -> their bf16 bits in the low halves of 8 dwords
  auto times = [](__m128i w8, __m256 s) {
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w8), 16));
    return _mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(f, s)), 16);
  };
  for (int g = 0; g < groups; ++g) {
    float sf[16];
    for (int n = 0; n < 16; ++n) sf[n] = fp4_scale_f32<NV>(sc[g * 16 + n]);
    __m256 sv[4];  // byte b of a quad is row b / 2: the scales of bytes 8k .. 8k + 7
    for (int k = 0; k < 4; ++k)
      sv[k] = _mm256_setr_ps(sf[4 * k], sf[4 * k], sf[4 * k + 1], sf[4 * k + 1], sf[4 * k + 2], sf[4 * k + 2],
                             sf[4 * k + 3], sf[4 * k + 3]);
    for (int q = 0; q < GQ; ++q) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(src + (g * GQ + q) * 32));
      const __m256i codes[2] = {_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib)};
      uint16_t* d = dst + (g * GQ + q) * 64;
      for (int h = 0; h < 2; ++h) {
        const __m256i lo8 = _mm256_shuffle_epi8(lut_lo, codes[h]), hi8 = _mm256_shuffle_epi8(lut_hi, codes[h]);
        const __m256i a = _mm256_unpacklo_epi8(lo8, hi8), b = _mm256_unpackhi_epi8(lo8, hi8);  // per lane
        const __m256i w[2] = {_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)};
        for (int x = 0; x < 2; ++x) {  // bytes 16x .. 16x + 15
          const __m256i r0 = times(_mm256_castsi256_si128(w[x]), sv[2 * x]);
          const __m256i r1 = times(_mm256_extracti128_si256(w[x], 1), sv[2 * x + 1]);
          _mm256_storeu_si256((__m256i*)(d + h * 32 + x * 16),
                              _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xD8));
        }
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

// ---- integer activations: exact int8 weights from the e2m1 codes
// 2 x e2m1 is an integer in +-{0, 1, 2, 3, 4, 6, 8, 12}; stored as kFp4Offset + 2 e2m1 in [0, 24] it is
// the unsigned operand of vpdpbusd / vpmaddubsw (the q8 activation codes are the signed one; vpmaddubsw cannot
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

// One block's codes -> its panel of fp4_quad_u8 dwords (16 x kp bytes), for tasks of several row tiles.
inline void fp4_u8_panel_block(const uint8_t* src, int kp, uint8_t* dst) {
  const __m512i lut = _mm512_loadu_si512((const void*)kFp4U8Lut.v);
  for (int q = 0; q < kp / 4; ++q) _mm512_storeu_si512((void*)(dst + size_t(q) * 64), fp4_quad_u8(src + size_t(q) * 32, lut));
}

// C[r][j*16 + n] (ld 32) as dot_tile_fp4, from integer activation rows. Per scale group (32 inputs,
// NV: 16) the integer sum of u = kFp4Offset + 2 e2m1 times the activation codes (vpdpbusd), one chain
// seeded with -kFp4Offset * sum q, converted once and multiplied by the group's scale and d in fp32;
// the tile's totals are halved at the end. MR = 1 runs two integer chains per (row, block). PANEL: b[j] are
// fp4_u8_panel_block panels (the u8 operand ready), else the blocks' codes, converted here.
// Q15 = false: q8 rows, x_r ~ d_r[b] * q_r[k] (b = k / 32).
// Q15 = true: q15 rows, x_r ~ d_r[b] * (128 hi_r[k] + lo_r[k]): the same weights feed a second
// vpdpbusd on hi, and 128 sum(u hi) + sum(u lo) - kFp4Offset sum q is sum 2 e2m1 q exactly
// (|.| <= 32 x 12 x 16256 < 2^24, so its fp32 conversion is exact too).
template <int MR, int NB, bool NV, bool Q15, bool PANEL>
inline void dot_tile_fp4_int(const int8_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                             float* c) {
  const int far = PANEL ? 0 : far_prefetch_bytes();
  constexpr int G = NV ? 16 : 32;  // inputs per weight scale
  constexpr int GQ = G / 4;        // quads per scale group
  constexpr int S = MR == 1 ? 2 : 1;
  __m512i acc[S][MR][NB];            // q8: q; q15: lo
  __m512i hi[Q15 ? S : 1][MR][NB];   // q15: hi
  __m512 tot[MR][NB];
  const __m512i lut = _mm512_loadu_si512((const void*)kFp4U8Lut.v);
  const IntRowLayout lay = int_row_layout(kp, Q15);
  const size_t lo_off = lay.lo;  // where the seeded chain's codes start in a row
  const float* d[MR];
  const int32_t* s16[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    d[r] = reinterpret_cast<const float*>(a[r] + lay.d);
    s16[r] = reinterpret_cast<const int32_t*>(a[r] + lay.s16);
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
      if constexpr (PANEL) {
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) w[j] = _mm512_loadu_si512((const void*)(b[j] + size_t(q) * 64));
      } else {
        fp4_quads_u8<NB>(b, q, far, lut, w);
      }
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

template <int NB, bool NV, bool Q15, bool PANEL>
void dot_rows_fp4_int_t(int mr, const int8_t* const* a, const uint8_t* const* b, const uint8_t* const* sc, int kp,
                        float* c) {
  switch (mr) {
    case 1: dot_tile_fp4_int<1, NB, NV, Q15, PANEL>(a, b, sc, kp, c); break;
    case 2: dot_tile_fp4_int<2, NB, NV, Q15, PANEL>(a, b, sc, kp, c); break;
    case 3: dot_tile_fp4_int<3, NB, NV, Q15, PANEL>(a, b, sc, kp, c); break;
    default: dot_tile_fp4_int<4, NB, NV, Q15, PANEL>(a, b, sc, kp, c); break;
  }
}
template <int NB, bool PANEL>
void dot_rows_fp4_int_p(bool nv, bool q15, int mr, const int8_t* const* a, const uint8_t* const* b,
                        const uint8_t* const* sc, int kp, float* c) {
  if (q15) {
    if (nv) dot_rows_fp4_int_t<NB, true, true, PANEL>(mr, a, b, sc, kp, c);
    else dot_rows_fp4_int_t<NB, false, true, PANEL>(mr, a, b, sc, kp, c);
  } else {
    if (nv) dot_rows_fp4_int_t<NB, true, false, PANEL>(mr, a, b, sc, kp, c);
    else dot_rows_fp4_int_t<NB, false, false, PANEL>(mr, a, b, sc, kp, c);
  }
}
// The rows are q15 rows if q15, else q8 rows; b: panels if panel (dot_tile_fp4_int).
template <int NB>
void dot_rows_fp4_int(bool nv, bool q15, bool panel, int mr, const int8_t* const* a, const uint8_t* const* b,
                      const uint8_t* const* sc, int kp, float* c) {
  if (panel) dot_rows_fp4_int_p<NB, true>(nv, q15, mr, a, b, sc, kp, c);
  else dot_rows_fp4_int_p<NB, false>(nv, q15, mr, a, b, sc, kp, c);
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
void dot_rows_fp4_int(bool, bool, bool, int, const int8_t* const*, const uint8_t* const*, const uint8_t* const*, int, float*) {}
inline void fp4_u8_panel_block(const uint8_t*, int, uint8_t*) {}
#endif

#if defined(__AVX2__) && !defined(LK_V512)
// One fp4 block into an avx2 integer panel (quad.h IntPanel): each quad's 16 byte pairs zero-extended to dwords, the
// nibbles brought into byte order and mapped to kFp4Offset + 2 e2m1 as fp4_quad_u8 does; per scale group the 16
// scales halved (the codes are 2 e2m1) and their kFp4Offset multiples.
inline void fp4_int_panel(const Fp4Weights& q, const uint8_t* src, const uint8_t* sc, int kp, const IntPanel& p) {
  const __m256i lut = _mm256_loadu_si256((const __m256i*)kFp4U8Lut.v);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int o = 0; o < kp / 4; ++o)
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(src + size_t(o) * 32 + 16 * h)));
      const __m256i nib = _mm256_and_si256(_mm256_or_si256(v, _mm256_slli_epi32(v, 12)), mask);
      _mm256_storeu_si256((__m256i*)(p.u + size_t(o) * 64 + 32 * h), _mm256_shuffle_epi8(lut, nib));
    }
  for (int i = 0; i < kp / p.group * kBlockN; ++i) {
    p.s[i] = 0.5f * (q.nv ? fp4_scale_f32<true>(sc[i]) : fp4_scale_f32<false>(sc[i]));
    p.sz[i] = p.s[i] * float(kFp4Offset);
  }
}
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

#if defined(LK_F32_PANELS)
// One fp4 block whole into an avx2 fp32 panel: e2m1 x its scale x gs. Per quad and 8-row half one
// load gives each row's two code bytes in a dword; each nibble's low 3 bits index the 8 e2m1
// magnitudes (vpermps), bit 3 is the sign.
template <bool NV>
inline void fp4_f32_panel_block_t(const uint8_t* src, const uint8_t* sc, int kp, float gs, float* dst) {
  constexpr int G = NV ? 16 : 32, GQ = G / 4;  // inputs and quads per scale group
  const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256i nib = _mm256_set1_epi32(15), sign = _mm256_set1_epi32(int32_t(0x80000000u));
  for (int g = 0; g < kp / G; ++g) {
    __m256 svs[2];
    if constexpr (NV) {  // the 16 fp8 scales at once
      const __m256i f16 = fp8x16_to_f16_div256(_mm_loadu_si128((const __m128i*)(sc + g * 16)));
      const __m256 k = _mm256_set1_ps(256.0f * gs);
      svs[0] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(f16)), k);
      svs[1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1)), k);
    } else {
      float sf[16];
      for (int n = 0; n < 16; ++n) sf[n] = fp4_scale_f32<NV>(sc[g * 16 + n]) * gs;
      svs[0] = _mm256_loadu_ps(sf);
      svs[1] = _mm256_loadu_ps(sf + 8);
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 sv = svs[h];
      for (int qd = g * GQ; qd < (g + 1) * GQ; ++qd) {
        // dword n: bytes 2n, 2n + 1 of the half (row 8h + n): inputs 4qd + t (low nibbles, pair-row
        // 2qd) and 4qd + 2 + t (high nibbles, pair-row 2qd + 1) of byte t
        const __m256i d = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(src + size_t(qd) * 32 + 16 * h)));
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {  // i = 2 pr + t: shift 4 pr + 8 t
          const int pr = i / 2, t = i % 2;
          const __m256i idx = _mm256_and_si256(_mm256_srli_epi32(d, 4 * pr + 8 * t), nib);
          const __m256 v = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, idx),
                                         _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(idx, 28), sign)));
          _mm256_storeu_ps(dst + size_t(2 * qd + pr) * 32 + 16 * h + 8 * t, _mm256_mul_ps(v, sv));
        }
      }
    }
  }
}
inline void fp4_f32_panel_block(const Fp4Weights& q, const uint8_t* src, const uint8_t* sc, int kp, float gs, float* dst) {
  if (q.nv) fp4_f32_panel_block_t<true>(src, sc, kp, gs, dst);
  else fp4_f32_panel_block_t<false>(src, sc, kp, gs, dst);
}
#endif

}  // namespace

void gate_up_fp4(const GateUpTask& t) {
  const Fp4Weights& q = *std::get_if<Fp4Weights>(&t.quant);
  const int grp = q.nv ? 16 : 32;  // inputs per scale
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / grp) * kBlockN;  // scale bytes per block
  const bool global = q.nv && (q.gs[0] != 1.0f || q.gs[1] != 1.0f);
  float* c = t.scratch->c;
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
    if (kHaveQ8 && t.q8_rows) {  // integer activations, the block pair in L1/L2 across row tiles
#if defined(__AVX2__) && !defined(LK_V512)
      const IntPanel pg = int_panel(*t.scratch, t.kp, grp, 0), pu = int_panel(*t.scratch, t.kp, grp, 1);
      fp4_int_panel(q, bg, sg, t.kp, pg);
      fp4_int_panel(q, bu, su, t.kp, pu);
      int_gate_up_rows<false, true>(t, pg, pu, finish);
      continue;
#endif
      const uint8_t* b[2] = {bg, bu};
      const uint8_t* sc[2] = {sg, su};
      const bool panel = int_panels(t.m);
      if (panel) {
        uint8_t* pan = reinterpret_cast<uint8_t*>(t.scratch->deq);
        fp4_u8_panel_block(bg, t.kp, pan);
        fp4_u8_panel_block(bu, t.kp, pan + 2 * block_bytes);
        b[0] = pan;
        b[1] = pan + 2 * block_bytes;
      }
      for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
        const int mr = tmin(kQ8TileRows, t.m - r0);
        dot_rows_fp4_int<2>(q.nv, t.q15, panel, mr, t.q8_rows + r0, b, sc, t.kp, c);
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
#if defined(LK_F32_PANELS)
    if (t.m >= kF32PanelMinRows4Bit) {  // the block pair into fp32 panels, the global scales folded in
      fp4_f32_panel_block(q, bg, sg, t.kp, q.nv ? q.gs[0] : 1.0f, f32_panel_of(*t.scratch, t.kp, 0));
      fp4_f32_panel_block(q, bu, su, t.kp, q.nv ? q.gs[1] : 1.0f, f32_panel_of(*t.scratch, t.kp, 1));
      gate_up_f32_panel(t, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr, 2 * block_bytes, [&](float* g, int r) {
        act_16(t, j, g, g + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      });
      continue;
    }
#endif
    // Prefill: the block pair dequantized whole (code x scale is exact in bf16) into the task's two
    // panels, then every row tile over all of K.
    fp4_panel_block(q, bg, sg, t.kp, panel_of(*t.scratch, t.kp, 0));
    fp4_panel_block(q, bu, su, t.kp, panel_of(*t.scratch, t.kp, 1));
#if defined(LK_V512)
    gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr,
                            2 * block_bytes, finish);
#else
    gate_up_segment(t, panel_of(*t.scratch, t.kp, 0), panel_of(*t.scratch, t.kp, 1), 0, t.kp, finish);
#endif
  }
}

void down_fp4(const DownTask& t) {
  const Fp4Weights& q = *std::get_if<Fp4Weights>(&t.quant);
  const int grp = q.nv ? 16 : 32;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / grp) * kBlockN;
  const float gs = q.nv ? q.gs[0] : 1.0f;  // the global scale rides on the router weight (both scalars)
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  const bool fused = t.m <= kFusedFp4Rows;
  if (fused)
    for (int r = 0; r < t.m; ++r) rows[r] = t.act + size_t(r) * t.act_ld;
  for (int j = 0; j < t.nblk; j += 2) {  // two blocks per tile share the activation broadcasts
    const int nb = tmin(2, t.nblk - j);
    const uint8_t* b[2] = {q.w + size_t(j) * block_bytes, q.w + size_t(j + nb - 1) * block_bytes};
    const uint8_t* s[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
    // row r's results (16 per block) times its router weight x gs into its out_acc row
    auto add = [&](const float* cr, int r) {
      float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
      for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r] * gs, cr + h * 16, o + h * 16);
    };
    if (kHaveQ8 && t.q8_act) {  // integer activations
#if defined(__AVX2__) && !defined(LK_V512)
      const IntPanel pan = int_panel(*t.scratch, t.kp, grp, 0);
      for (int h = 0; h < nb; ++h) {
        fp4_int_panel(q, b[h], s[h], t.kp, pan);
        int_down_rows<false, true>(t, pan, j + h, gs);
      }
      continue;
#endif
      const int8_t* rows8[kQ8TileRows];
      const bool panel = int_panels(t.m);
      const uint8_t* bb[2] = {b[0], b[1]};
      if (panel) {
        uint8_t* pan = reinterpret_cast<uint8_t*>(t.scratch->deq);
        for (int h = 0; h < nb; ++h) fp4_u8_panel_block(b[h], t.kp, pan + h * 2 * block_bytes);
        bb[0] = pan;
        bb[1] = pan + (nb - 1) * 2 * block_bytes;
      }
      for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
        const int mr = tmin(kQ8TileRows, t.m - r0);
        for (int r = 0; r < mr; ++r) rows8[r] = t.q8_act + size_t(r0 + r) * t.q8_ld;
        if (nb == 2) dot_rows_fp4_int<2>(q.nv, t.q15, panel, mr, rows8, bb, s, t.kp, c);
        else dot_rows_fp4_int<1>(q.nv, t.q15, panel, mr, rows8, bb, s, t.kp, c);
        for (int r = 0; r < mr; ++r) add(c + r * 32, r0 + r);
      }
      continue;
    }
    if (fused) {
      if (nb == 2) dot_rows_fp4<2>(q.nv, t.m, rows, b, s, t.kp, c);
      else dot_rows_fp4<1>(q.nv, t.m, rows, b, s, t.kp, c);
      for (int r = 0; r < t.m; ++r) add(c + r * 32, r);
      continue;
    }
#if defined(LK_F32_PANELS)
    if (t.m >= kF32PanelMinRows4Bit) {
      for (int h = 0; h < nb; ++h)
        fp4_f32_panel_block(q, b[h], s[h], t.kp, gs, f32_panel_of(*t.scratch, t.kp, h));
      down_f32_panel(t, j, nb, j + 2 < t.nblk ? b[0] + 2 * block_bytes : nullptr,
                     size_t(tmin(2, t.nblk - j - 2)) * block_bytes);
      continue;
    }
#endif
    for (int h = 0; h < nb; ++h) fp4_panel_block(q, b[h], s[h], t.kp, panel_of(*t.scratch, t.kp, h));
#if defined(LK_V512)
    down_panel<kSegNone>(t, j, nb, 0, nullptr, nullptr, gs, j + 2 < t.nblk ? b[0] + 2 * block_bytes : nullptr,
                         size_t(tmin(2, t.nblk - j - 2)) * block_bytes);
#else
    const void* bd[2] = {panel_of(*t.scratch, t.kp, 0), panel_of(*t.scratch, t.kp, nb - 1)};
    down_segment(t, bd, nb, 0, t.kp, add);
#endif
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
