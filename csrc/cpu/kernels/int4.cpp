// 4-bit integer experts: wna16_int4 (compressed-tensors WNA16). Layout: kernel_table.h Int4Weights.
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/panels.h"
#include "cpu/kernels/quad.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

// ---------------------------------------------------------------- int4 (wna16_int4)
// Strategy. Layout (kernel_table.h Int4Weights): octets of 64 bytes, byte 4n + j = inputs 8o + j (low
// nibble) and 8o + 4 + j (high nibble) of row n, so one cache line is 128 codes and one and (low) or
// shift + and (high) yields 16 dwords of 4 consecutive u8 codes per output row: the u8 operand of
// vpdpbusd, without widening anything to 16 bits.
// Decode (chunks of <= kQ8MaxTokens tokens on the AVX-512 tiers): the engine quantizes each activation row
// once per chunk (x before phase 1, act before phase 2) per 32 inputs to integers: by default 15-bit q15
// rows (act_quant.cpp: q = 128 hi + lo, a power-of-two scale; bf16's error), with LK_INT8_ACT=1 (first
// named LK_WNA16_INT8_ACT) symmetric int8 (q8_row: d = max|x| / 127, llama.cpp's Q8_0 scheme);
// dot_tile_q4q8 accumulates u * q in int32 with vpdpbusd (vpmaddubsw + vpmaddwd on the avx512 tier,
// same integers: no saturation at |2 * 15 * 127|; q15: a second one on hi), converts every 32 inputs and
// multiplies by d in fp32, and per weight group subtracts z * sum(d * sum q) and applies the 16 row
// scales. About 5 vector ops per 128 weights and row with int8 (q15: ~7; the bf16 widening below: ~16);
// up to 4 rows share each weight load (q15: 2). Error: rel RMS of the layer output ~0.012 with int8
// against the fp32 reference on the dequantized weights (q15 and the exact path ~0.0035); budget and
// reasoning in tests/engine/conftest.py.
// The avx2 tier: quad.h's avx2 integer tile over q4_int_panel panels, on q15 rows in decode (the default, as
// above) and on q8 rows with LK_INT8_ACT=1 (decode and prefill).
// Decode, exact (the A/B setting _set_fp4_decode_acts("bf16"), m <= kFusedQ4Rows, dot_tile_q4): each
// octet becomes 4 bf16 pair-rows in registers (zero-extend, nibbles, vpermt2w into the block order, OR
// 0x4300 = bf16(128 + u) exactly); vdpbf16ps (or the even/odd fp32 split without AVX512-BF16) accumulates sum A (128 + u)
// in fp32 per group, then (128 + z) * sum A (row sums computed once per task) is subtracted and the
// group's 16 per-row scales applied in fp32.
// Prefill (more rows): u - z of the block (pair) dequantized to bf16 (exact: |u - z| <= 15; a 32-entry
// vpermw table on AVX-512), on the AVX-512 tiers whole into a panel with the group scales applied per
// segment by the tile (vector dot_tile, or AMX tiles on the amx tier; see panels.h, "Prefill of the quantized
// formats"; the amx tier's group-32 tiles take bf16(code x scale) panels instead, q4_folds), on the avx2
// tier whole into an fp32 panel with the scales folded in (q4_f32_panel_block), on the generic tier one group at a time into L1, adding scale x partial into fp32 sums.
// Measured on the 2-core Zen4 dev VM (avx512_bf16, 2 threads, benchmarks/moe_layer.py --format
// wna16_int4 --shapes qwen3-30b-a3b, gs=128 sym; docs/results/2026-11-30_epyc2c_wna16_vnni_moe_layer.log):
// medians of 3 runs, before (bf16 widening) -> after: M=1 0.565 -> 0.535 ms (0.75 -> 0.78 of read
// bandwidth), M=4 2.14 -> 2.07 ms (0.75 -> 0.74), M=16 5.97 -> 5.74 ms (0.69 -> 0.74), with the VM's
// read bandwidth at 41-49 GB/s (it measured 81 GB/s on the day the old kernel reached 0.30).
// Hot weights (one expert, L3-resident, 1 thread): M=1 68 GB/s of quantized bytes per core (bf16
// widening: 49), M=4 2.3x and M=16 2.3x the bf16 path: decode is now bound by the weight stream
// (DRAM latency of short streams, hence decode units of 8 blocks), not by the unpacking.

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
#if defined(LK_V512)
// The AVX-512 body of q4_dequant_seg: each pair-row of u - z words passes through map before its store
// (the identity, or FoldScales::apply for the amx tier's folded panels).
template <typename Map>
inline void q4_dequant_words(const uint8_t* src, const uint8_t* zero, uint16_t* dst, int seg, Map&& map) {
  const __m512i lut = _mm512_loadu_si512((const void*)kQ4Lut.v);
  const __m512i zv = zero ? q4_zero_words(zero) : _mm512_set1_epi16(8);
  const __m512i idx0 = _mm512_loadu_si512((const void*)kQ4Perm.v);
  const __m512i idx2 = _mm512_add_epi16(idx0, _mm512_set1_epi16(2));
  for (int o = 0; o < seg / 8; ++o) {
    __m512i pr[4];
    q4_octet_words(src + o * 64, idx0, idx2, pr);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      _mm512_storeu_si512((void*)(dst + o * 128 + i * 32), map(_mm512_permutexvar_epi16(_mm512_sub_epi16(pr[i], zv), lut)));
  }
}
#endif

inline void q4_dequant_seg(const uint8_t* src, const uint8_t* zero, uint16_t* dst, int seg) {
#if defined(LK_V512)
  q4_dequant_words(src, zero, dst, seg, [](__m512i w) { return w; });
#else
  const int octets = seg / 8;
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

constexpr int kQ8PrefetchOctets = 96;  // prefetch distance in each block stream (64 B per octet)

// C[r][j*16 + n] (ld 32) = sum_g scale_j[g][n] * sum_{k in g} x_r[k] * (u_j[n][k] - z_j[g][n]) with
// x_r ~ d_r[b] * q_r[k] (q8 rows, b = k / 32): per 32 inputs the integer sum of u * q (vpdpbusd: one
// and/shift per 128 codes, no widening), times d in fp32; per group minus z * sum_b d * sum q, times
// the scales. With few rows the accumulator chains bound the speed: S independent integer
// accumulators per (row, block) take the low/high nibbles of each octet in turn.
// Q15 (the default, Format::q15_decode): q15 rows, x_r ~ d_r[b] * (128 hi_r[k] + lo_r[k]): each weight load
// feeds a second vpdpbusd, on hi, and 128 sum(u hi) + sum(u lo) is sum(u q) exactly (|.| <= 32 x 15 x 16256 <
// 2^24: its fp32 conversion is exact too), so the error is bf16's, not int8's (act_quant.cpp, q15_row).
// Fewer chains then (the hi accumulators take their registers); tiles of at most 2 rows (dot_rows_q4q8_t).
template <int MR, int NB, bool ASYM, bool Q15>
inline void dot_tile_q4q8(const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                          const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  const int far = far_prefetch_bytes();
  constexpr int S = Q15 ? (MR == 1 ? 2 : 1) : (MR == 1 ? 4 : 2);
  __m512i acc[S][MR][NB];              // q8: q; q15: lo
  __m512i hacc[Q15 ? S : 1][MR][NB];   // q15: hi
  __m512 gacc[MR][NB], tot[MR][NB];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      tot[r][j] = gacc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < S; ++i) acc[i][r][j] = hacc[Q15 ? i : 0][r][j] = _mm512_setzero_si512();
    }
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const int ngroups = kp / group, bpg = group / kQ8Group;
  const IntRowLayout lay = int_row_layout(kp, Q15);
  const float *d[MR], *ds[MR];  // ds: q8 rows' d x sum q per block
  const int32_t* s16[MR];       // q15: sums of q per 16 inputs
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    d[r] = reinterpret_cast<const float*>(a[r] + lay.d);
    ds[r] = reinterpret_cast<const float*>(a[r] + lay.ds);
    s16[r] = reinterpret_cast<const int32_t*>(a[r] + lay.s16);
  }
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
          int32_t x0, x1;  // q8: q; q15: hi
          memcpy(&x0, a[r] + 8 * o, 4);
          memcpy(&x1, a[r] + 8 * o + 4, 4);
          const __m512i a0 = _mm512_set1_epi32(x0), a1 = _mm512_set1_epi32(x1);
          if constexpr (Q15) {
            int32_t y0, y1;  // lo
            memcpy(&y0, a[r] + lay.lo + 8 * o, 4);
            memcpy(&y1, a[r] + lay.lo + 8 * o + 4, 4);
            const __m512i b0 = _mm512_set1_epi32(y0), b1 = _mm512_set1_epi32(y1);
#pragma GCC unroll 2
            for (int j = 0; j < NB; ++j) {
              hacc[il][r][j] = dot4_u8s8(hacc[il][r][j], lo[j], a0);
              hacc[ih][r][j] = dot4_u8s8(hacc[ih][r][j], hi[j], a1);
              acc[il][r][j] = dot4_u8s8(acc[il][r][j], lo[j], b0);
              acc[ih][r][j] = dot4_u8s8(acc[ih][r][j], hi[j], b1);
            }
          } else {
#pragma GCC unroll 2
            for (int j = 0; j < NB; ++j) {
              acc[il][r][j] = dot4_u8s8(acc[il][r][j], lo[j], a0);
              acc[ih][r][j] = dot4_u8s8(acc[ih][r][j], hi[j], a1);
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 dv = _mm512_set1_ps(d[r][bb]);
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          __m512i sum = take_chains<MR, NB, S>(acc, r, j);
          if constexpr (Q15) sum = _mm512_add_epi32(_mm512_slli_epi32(take_chains<MR, NB, S>(hacc, r, j), 7), sum);
          gacc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), dv, gacc[r][j]);
        }
      }
    }
    float zs[MR];  // sum over the group of d * sum q, per row
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      zs[r] = 0.0f;
      for (int bb = g * bpg; bb < (g + 1) * bpg; ++bb)
        zs[r] += Q15 ? d[r][bb] * float(s16[r][2 * bb] + s16[r][2 * bb + 1]) : ds[r][bb];
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

template <int NB, bool ASYM, bool Q15>
void dot_rows_q4q8_t(int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                     const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  if constexpr (Q15) {  // tiles of 1-2 rows (the hi chains double the accumulators)
    for (int r0 = 0; r0 < mr; r0 += 2) {
      if (mr - r0 == 1) dot_tile_q4q8<1, NB, ASYM, true>(a + r0, b, kp, c + r0 * 32, group, scale, zero, fp16);
      else dot_tile_q4q8<2, NB, ASYM, true>(a + r0, b, kp, c + r0 * 32, group, scale, zero, fp16);
    }
    return;
  }
  switch (mr) {
    case 1: dot_tile_q4q8<1, NB, ASYM, false>(a, b, kp, c, group, scale, zero, fp16); break;
    case 2: dot_tile_q4q8<2, NB, ASYM, false>(a, b, kp, c, group, scale, zero, fp16); break;
    case 3: dot_tile_q4q8<3, NB, ASYM, false>(a, b, kp, c, group, scale, zero, fp16); break;
    default: dot_tile_q4q8<4, NB, ASYM, false>(a, b, kp, c, group, scale, zero, fp16); break;
  }
}
// The rows are q15 rows if q15, else q8 rows (dot_tile_q4q8).
template <int NB>
void dot_rows_q4q8(bool q15, int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c, int group,
                   const uint16_t* const* scale, const uint8_t* const* zero, bool fp16) {
  if (q15) {
    if (zero[0]) dot_rows_q4q8_t<NB, true, true>(mr, a, b, kp, c, group, scale, zero, fp16);
    else dot_rows_q4q8_t<NB, false, true>(mr, a, b, kp, c, group, scale, zero, fp16);
  } else {
    if (zero[0]) dot_rows_q4q8_t<NB, true, false>(mr, a, b, kp, c, group, scale, zero, fp16);
    else dot_rows_q4q8_t<NB, false, false>(mr, a, b, kp, c, group, scale, zero, fp16);
  }
}

void gate_up_q4q8(const GateUpTask& t) {
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
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
      dot_rows_q4q8<2>(t.q15, mr, t.q8_rows + r0, b, t.kp, c, q.group, sc, zz, q.fp16_scale);
      for (int r = 0; r < mr; ++r)
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
    }
  }
}

void down_q4q8(const DownTask& t) {
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
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
      if (nb == 2) dot_rows_q4q8<2>(t.q15, mr, rows, b, t.kp, c, q.group, s, z, q.fp16_scale);
      else dot_rows_q4q8<1>(t.q15, mr, rows, b, t.kp, c, q.group, s, z, q.fp16_scale);
      for (int r = 0; r < mr; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r0 + r], c + r * 32 + h * 16, o + h * 16);
      }
    }
  }
}
#else
#if defined(__AVX2__)
// One int4 block into an avx2 integer panel (quad.h IntPanel): the low nibbles of an octet are the dwords of quad 2o,
// the high ones of quad 2o + 1 (rows 0-7 in its first 32 bytes); per group the 16 scales and scale x zero point.
inline void q4_int_panel(const Int4Weights& q, const uint8_t* src, const uint16_t* scale, const uint8_t* zero, int kp,
                         const IntPanel& p) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int o = 0; o < kp / 8; ++o)
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(src + size_t(o) * 64 + 32 * h));
      _mm256_storeu_si256((__m256i*)(p.u + size_t(2 * o) * 64 + 32 * h), _mm256_and_si256(v, mask));
      _mm256_storeu_si256((__m256i*)(p.u + size_t(2 * o + 1) * 64 + 32 * h),
                          _mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
    }
  for (int g = 0; g < kp / q.group; ++g) {
    scales_16(scale + g * kBlockN, q.fp16_scale, p.s + g * 16);
    for (int n = 0; n < 16; ++n) p.sz[g * 16 + n] = p.s[g * 16 + n] * float(zero ? (zero[g * 8 + n / 2] >> (4 * (n % 2))) & 15 : 8);
  }
}

void gate_up_q4q8(const GateUpTask& t) {
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / q.group) * kBlockN;
  const IntPanel pg = int_panel(*t.scratch, t.kp, q.group, 0), pu = int_panel(*t.scratch, t.kp, q.group, 1);
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint16_t* scg = q.scale + size_t(j) * 2 * per;
    const uint8_t* zg = q.zero ? q.zero + size_t(j) * per : nullptr;
    q4_int_panel(q, bg, scg, zg, t.kp, pg);
    q4_int_panel(q, bg + block_bytes, scg + per, zg ? zg + per / 2 : nullptr, t.kp, pu);
    int_gate_up_rows<false, true>(t, pg, pu, [&](float* g, int r) {
      gate_act_16(t, g, g + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
    });
  }
}

void down_q4q8(const DownTask& t) {
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(t.kp / q.group) * kBlockN;
  const IntPanel pan = int_panel(*t.scratch, t.kp, q.group, 0);
  for (int j = 0; j < t.nblk; ++j) {
    q4_int_panel(q, q.w + size_t(j) * block_bytes, q.scale + size_t(j) * per, q.zero ? q.zero + size_t(j) * per / 2 : nullptr,
                 t.kp, pan);
    int_down_rows<false, true>(t, pan, j, 1.0f);
  }
}
#else
inline void gate_up_q4q8(const GateUpTask&) {}
inline void down_q4q8(const DownTask&) {}
#endif
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

#if defined(LK_AMX)
// The amx tier's row tiles over groups of one k-step (32 inputs): the block whole into a panel of
// bf16((u - z) x scale) (FoldScales), so the tiles need no segment scales. Per-segment scaling would store and
// re-add the accumulator tiles every k-step: 1.28 / 1.50 / 1.75x bf16's prefill at 64 / 256 / 1024 tokens
// (Qwen3-30B-A3B shape, 2 cores) against 1.22 / 1.07 / 1.15x folded. Larger groups keep their exact codes
// and scale per segment: group 128 measured 0.95 / 1.03 / 1.12x so, 1.25 / 1.08 / 1.15x folded (the fold's
// conversions cost more than a tile store every 4 k-steps).
inline bool q4_folds(int m, int kp, int group) { return m >= kAmxMinRows && group == 32 && group < kp; }
inline void q4_folded_panel_block(const Int4Weights& q, const uint8_t* src, const uint16_t* scale,
                                  const uint8_t* zero, int kp, uint16_t* dst) {
  float sf[16];
  for (int s = 0; s < kp / q.group; ++s) {
    scales_16(scale + s * kBlockN, q.fp16_scale, sf);
    const FoldScales f(sf);
    q4_dequant_words(src + size_t(s) * q.group * kBlockN / 2, zero ? zero + s * 8 : nullptr,
                     dst + size_t(s) * q.group * kBlockN, q.group, [&](__m512i w) { return f.apply(w); });
  }
}
#endif

#if defined(LK_F32_PANELS)
// One int4 block whole into an avx2 fp32 panel: (u - z) x the group's row scale, exact in fp32. Per
// octet and 8-row half one load gives the 8 rows' dwords of 4 code bytes: input i of the octet is the
// nibble at bit 8i (i < 4) or 8(i - 4) + 4.
inline void q4_f32_panel_block(const Int4Weights& q, const uint8_t* src, const uint16_t* scale, const uint8_t* zero,
                               int kp, float* dst) {
  const int go = q.group / 8;
  const __m256i nib = _mm256_set1_epi32(15);
  for (int s = 0; s < kp / q.group; ++s) {
    float sf[16];
    int32_t zi[16];
    scales_16(scale + s * kBlockN, q.fp16_scale, sf);
    for (int n = 0; n < 16; ++n) zi[n] = zero ? (zero[s * 8 + n / 2] >> (4 * (n % 2))) & 15 : 8;
    for (int h = 0; h < 2; ++h) {
      const __m256 sv = _mm256_loadu_ps(sf + 8 * h);
      const __m256i zv = _mm256_loadu_si256((const __m256i*)(zi + 8 * h));
      for (int o = s * go; o < (s + 1) * go; ++o) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(src + size_t(o) * 64 + 32 * h));
        float* d = dst + size_t(o) * 128 + 16 * h;  // octet o: pair-rows 4o .. 4o + 3
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m256i u = _mm256_and_si256(_mm256_srli_epi32(v, i < 4 ? 8 * i : 8 * (i - 4) + 4), nib);
          _mm256_storeu_ps(d + (i / 2) * 32 + (i % 2) * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(u, zv)), sv));
        }
      }
    }
  }
}
#endif

// The fused tile needs m x kp/group row sums in the scratch accumulator.
inline bool q4_fused(int m, int kp, int group) {
  return m <= kFusedQ4Rows && size_t(m) * (kp / group) <= size_t(kMaxRowsPerTask) * 32;
}

}  // namespace

void gate_up_q4(const GateUpTask& t) {
  if (kHaveQ8 && t.q8_rows) return gate_up_q4q8(t);  // decode with int8 activations
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
  const int seg = q.group, nseg = t.kp / seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN / 2;
  const size_t per = size_t(nseg) * kBlockN;  // scales (and zeros) per block
  float* tot = t.scratch->acc;
  float* c = t.scratch->c;
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
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      continue;
    }
#if defined(LK_AMX)
    if (q4_folds(t.m, t.kp, seg)) {
      q4_folded_panel_block(q, bg, scg, zg, t.kp, panel_of(*t.scratch, t.kp, 0));
      q4_folded_panel_block(q, bu, scu, zu, t.kp, panel_of(*t.scratch, t.kp, 1));
      uint16_t* act = t.act + j * kBlockN;
      const void* next = j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr;
      gate_up_panel<kSegNone>(t, j, seg, nullptr, nullptr, next, 2 * block_bytes,
                              [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
#if defined(LK_V512)
    {
      float* fs = panel_scales(*t.scratch, t.kp);  // [gate groups x 16 | up groups x 16]
      q4_panel_block(q, bg, scg, zg, t.kp, panel_of(*t.scratch, t.kp, 0), fs);
      q4_panel_block(q, bu, scu, zu, t.kp, panel_of(*t.scratch, t.kp, 1), fs + nseg * 16);
      uint16_t* act = t.act + j * kBlockN;
      const void* next = j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr;
      gate_up_panel<kSegVector>(t, j, seg, fs, fs + nseg * 16, next, 2 * block_bytes,
                                [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
#if defined(LK_F32_PANELS)
    if (t.m >= kF32PanelMinRows4Bit) {
      q4_f32_panel_block(q, bg, scg, zg, t.kp, f32_panel_of(*t.scratch, t.kp, 0));
      q4_f32_panel_block(q, bu, scu, zu, t.kp, f32_panel_of(*t.scratch, t.kp, 1));
      uint16_t* act = t.act + j * kBlockN;
      gate_up_f32_panel(t, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr, 2 * block_bytes,
                        [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
    gate_up_row_scaled_segments(t, j, seg, [&](int s, uint16_t* dg, uint16_t* du, float* sg, float* su) {
      const size_t off = size_t(s) * seg * kBlockN / 2;
      q4_dequant_seg(bg + off, zg ? zg + s * 8 : nullptr, dg, seg);
      q4_dequant_seg(bu + off, zu ? zu + s * 8 : nullptr, du, seg);
      scales_16(scg + s * kBlockN, q.fp16_scale, sg);
      scales_16(scu + s * kBlockN, q.fp16_scale, su);
    });
  }
}

void down_q4(const DownTask& t) {
  if (kHaveQ8 && t.q8_act) return down_q4q8(t);
  const Int4Weights& q = *std::get_if<Int4Weights>(&t.quant);
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
#if defined(LK_AMX)
  const bool folds = q4_folds(t.m, t.kp, seg);
#endif
  float* fs = panel_scales(*t.scratch, t.kp);
  for (int j = 0; j < t.nblk; j += 2) {
    const int nb = tmin(2, t.nblk - j);
    const void* next = j + 2 < t.nblk ? q.w + size_t(j + 2) * block_bytes : nullptr;
    const size_t next_bytes = size_t(tmin(2, t.nblk - j - 2)) * block_bytes;
#if defined(LK_AMX)
    if (folds) {
      for (int h = 0; h < nb; ++h)
        q4_folded_panel_block(q, q.w + size_t(j + h) * block_bytes, q.scale + size_t(j + h) * per,
                              q.zero ? q.zero + size_t(j + h) * per / 2 : nullptr, t.kp, panel_of(*t.scratch, t.kp, h));
      down_panel<kSegNone>(t, j, nb, seg, nullptr, nullptr, 1.0f, next, next_bytes);
      continue;
    }
#endif
    for (int h = 0; h < nb; ++h)
      q4_panel_block(q, q.w + size_t(j + h) * block_bytes, q.scale + size_t(j + h) * per,
                     q.zero ? q.zero + size_t(j + h) * per / 2 : nullptr, t.kp, panel_of(*t.scratch, t.kp, h),
                     fs + size_t(h) * nseg * 16);
    const float* ss[2] = {fs, fs + size_t(nb - 1) * nseg * 16};
    down_panel<kSegVector>(t, j, nb, seg, ss, nullptr, 1.0f, next, next_bytes);
  }
  return;
#elif defined(LK_F32_PANELS)
  if (t.m >= kF32PanelMinRows4Bit)
    return down_f32_panels(t, q.w, block_bytes, [&](int blk, float* dst) {
      q4_f32_panel_block(q, q.w + size_t(blk) * block_bytes, q.scale + size_t(blk) * per,
                         q.zero ? q.zero + size_t(blk) * per / 2 : nullptr, t.kp, dst);
    });
#endif
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* src = q.w + size_t(j) * block_bytes;
    const uint16_t* scj = q.scale + size_t(j) * per;
    const uint8_t* zj = q.zero ? q.zero + size_t(j) * per / 2 : nullptr;
    for (int s = 0; s < nseg; ++s) {
      const void* b[2] = {d, d};
      q4_dequant_seg(src + size_t(s) * seg * kBlockN / 2, zj ? zj + s * 8 : nullptr, d, seg);
      scales_16(scj + s * kBlockN, q.fp16_scale, sc);
      down_segment(t, b, 1, s * seg, seg, [&](const float* cr, int r) {
        axpy_vec_16(t.row_weight[r], cr, sc, t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN);
      });
    }
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
