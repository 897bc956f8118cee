// One-byte codes with fp32 scales: fp8_block (fp8 e4m3fn, one scale per block of the checkpoint),
// fp8_channel and int8_channel (one scale per output row). Layout: kernel_table.h Fp8Weights.
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/panels.h"
#include "cpu/kernels/quad.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

// n (multiple of 32) fp8 e4m3fn values -> bf16.
inline void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int n) {
  int i = 0;
#if defined(LK_FP8_TABLE)
  i = fp8_table_run(src, dst, n, fp8_lut());
#endif
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
  for (; i + 32 <= n; i += 32) {  // the decode tiles' widening (one vcvtne2ps2bf16 a pair-row with AVX512-BF16)
    _mm_prefetch((const char*)(src + i + 512), _MM_HINT_T0);
    _mm512_storeu_si512((void*)(dst + i), int8x32_to_bf16(_mm256_loadu_si256((const __m256i*)(src + i))));
  }
#elif defined(__AVX2__)
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128((const __m128i*)(src + i));
    const __m256i lo = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))), 16);
    const __m256i hi = _mm256_srli_epi32(
        _mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))), 16);
    // packus works per 128-bit lane: [lo 0-3, hi 0-3, lo 4-7, hi 4-7] -> element order
    _mm256_storeu_si256((__m256i*)(dst + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_bf16(float(int8_t(src[i])));
}

inline void dequant_bf16(const Fp8Weights& q, const uint8_t* src, uint16_t* dst, int n) {
  if (q.int8) int8_to_bf16(src, dst, n);
  else fp8_to_bf16(src, dst, n);
}

#if defined(LK_F32_PANELS)
// One block of codes whole into an avx2 fp32 panel: code x its scale (per segment, or per row). Per
// pair-row and 8-row half, pshufb splits the 16 code bytes into the even inputs' 8 and the odd ones';
// fp8 codes go through fp16 (fp8x16_to_f16_div256, the 256 riding on the scale), int8 codes are
// sign-extended and converted.
// Pair-rows [p0, p1) of a block of codes into its panel, times sv[h] (rows 8h .. 8h + 7; fp8 codes come out 1/256
// of their value, the 256 rides on the scale).
inline void f32_panel_pairs(const uint8_t* src, int p0, int p1, const __m256* sv, bool int8, float* dst) {
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int p = p0; p < p1; ++p)
    for (int h = 0; h < 2; ++h) {
      const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(src + size_t(p) * 32 + 16 * h)), split);
      __m256 w0, w1;
      if (int8) {
        w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
      } else {
        const __m256i f16 = fp8x16_to_f16_div256(b);
        w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(f16));
        w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1));
      }
      float* d = dst + size_t(p) * 32 + 16 * h;
      _mm256_storeu_ps(d, _mm256_mul_ps(w0, sv[h]));
      _mm256_storeu_ps(d + 8, _mm256_mul_ps(w1, sv[h]));
    }
}

inline void fp8_f32_panel_block(const Fp8Weights& q, const uint8_t* src, const float* sc, int kp, float* dst) {
  const float unit = q.int8 ? 1.0f : 256.0f;
  const int chunk = q.per_row ? kp : q.seg;
  for (int k0 = 0; k0 < kp; k0 += chunk) {
    const float s = q.per_row ? unit : unit * sc[k0 / q.seg];
    const __m256 sv[2] = {q.per_row ? _mm256_mul_ps(_mm256_loadu_ps(sc), _mm256_set1_ps(s)) : _mm256_set1_ps(s),
                          q.per_row ? _mm256_mul_ps(_mm256_loadu_ps(sc + 8), _mm256_set1_ps(s)) : _mm256_set1_ps(s)};
    f32_panel_pairs(src, k0 / 2, tmin(k0 + chunk, kp) / 2, sv, q.int8, dst);
  }
}

// mxfp8: one block into its panel, each 32-input segment times its 16 rows' e8m0 scales (powers of two: exact). A
// segment with a scale of 2^120 or more (whose 256x would overflow) is converted value by value.
inline void mx_f32_panel_block(const uint8_t* src, const uint8_t* e8, int kp, float* dst) {
  for (int s = 0; s < kp / 32; ++s) {
    const uint8_t* e = e8 + size_t(s) * kBlockN;
    float sc[kBlockN];
    bool huge = false;
    for (int n = 0; n < kBlockN; ++n) {
      sc[n] = e8m0_to_f32(e[n]);
      huge |= e[n] >= 247 && e[n] != 255;
    }
    if (huge) {
      for (int p = 16 * s; p < 16 * (s + 1); ++p)  // panel float p * 32 + 16h + 8t + n: row 8h + n, input 2p + t
        for (int i = 0; i < 32; ++i) {
          const int h = i / 16, t = (i / 8) % 2, n = i % 8;
          dst[size_t(p) * 32 + i] = bf16_to_f32(fp8_to_bf16_1(src[size_t(p) * 32 + 2 * (8 * h + n) + t])) * sc[8 * h + n];
        }
      continue;
    }
    for (int n = 0; n < kBlockN; ++n) sc[n] *= 256.0f;
    const __m256 sv[2] = {_mm256_loadu_ps(sc), _mm256_loadu_ps(sc + 8)};
    f32_panel_pairs(src, 16 * s, 16 * (s + 1), sv, false, dst);
  }
}
#endif

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
template <int NB, int CODES, int SEG = kSegNone>
void dot_rows_codes(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, int seg,
                    const float* const* scale) {
  switch (mr) {
    case 1: dot_tile<1, NB, CODES, SEG>(a, b, kp, c, {}, seg, scale); break;
    case 2: dot_tile<2, NB, CODES, SEG>(a, b, kp, c, {}, seg, scale); break;
    case 3: dot_tile<3, NB, CODES, SEG>(a, b, kp, c, {}, seg, scale); break;
    default: dot_tile<4, NB, CODES, SEG>(a, b, kp, c, {}, seg, scale); break;
  }
}
template <int NB>
void dot_rows_fp8(int mr, const uint16_t* const* a, const void* const* b, int kp, float* c, int seg,
                  const float* const* scale, bool int8_codes) {
  if (int8_codes) dot_rows_codes<NB, kCodesInt8>(mr, a, b, kp, c, seg, scale);
  else dot_rows_codes<NB, kCodesFp8>(mr, a, b, kp, c, seg, scale);
}
#else
constexpr int kFusedFp8Rows = 0;
template <int NB>
void dot_rows_fp8(int, const uint16_t* const*, const void* const*, int, float*, int, const float* const*, bool) {}
#endif

#if defined(LK_V512)
// ---------------------------------------------------------------- int8 codes x int8 activations
// int8_channel with LK_INT8_ACT=1 (Format::int8_act): x and act arrive as q8 rows (kernel_table.h, x ~ d q per
// 32 inputs), the codes w as they are, so sum_k x_k w_k = sum_b d_b sum_{k in b} q_k w_k is an integer sum per
// 32-input block, converted and scaled by d_b in fp32 (exact: |sum| <= 32 x 255 x 127 < 2^24), and the row's
// channel scale is applied once at the end. The block layout holds pair-rows (inputs 2p, 2p + 1 of the 16 rows,
// 32 words); one vpermw interleaves pair-rows 2o and 2o + 1 into the 16 dwords of 4 consecutive inputs per row
// that vpdpbusd takes (u8 x s8). With VNNI the codes become u = w + 128 (one xor) and sum q w = sum q u - 128
// sum q (the q8 row keeps d x sum q per block). Without it (the avx512 tier) vpmaddubsw would saturate on u:
// it takes |w| and q with w's sign instead (|2 x 128 x 127| < 2^15). Prefill tasks convert each block once
// into a panel of these dwords (scratch deq) for all their row tiles; decode tasks convert in registers. Per
// 64 codes and row: one vpdpbusd (vdpbf16ps takes 32), plus per 32 inputs one conversion and one fma.
struct I8QuadPerm {
  uint16_t v[32];
};
constexpr I8QuadPerm make_i8_quad_perm() {  // word 2n + t <- word n of pair-row t (t = 0: words 0..15, 1: 16..31)
  I8QuadPerm p{};
  for (int i = 0; i < 32; ++i) p.v[i] = uint16_t(i % 2 ? 16 + i / 2 : i / 2);
  return p;
}
constexpr I8QuadPerm kI8QuadPerm = make_i8_quad_perm();
constexpr int kI8PrefetchQuads = 96;  // decode: prefetch distance in each block stream (64 B per quad)

#if defined(__AVX512VNNI__)
constexpr bool kI8Offset = true;  // u = w + 128 into vpdpbusd, minus 128 x sum q
#else
constexpr bool kI8Offset = false;  // |w| and sign(w) q into vpmaddubsw
#endif

// 64 code bytes (pair-rows 2o, 2o + 1 of a block) -> the quad's 16 dwords as the tile reads them.
inline __m512i i8_quad(const uint8_t* src, __m512i perm) {
  const __m512i v = _mm512_permutexvar_epi16(perm, _mm512_loadu_si512((const void*)src));
  return kI8Offset ? _mm512_xor_si512(v, _mm512_set1_epi8(int8_t(0x80))) : v;
}

// One quad of weight dwords as the dot product takes it: u = w + 128 (VNNI), or |w| and w's negative bytes.
struct I8Operand {
  __m512i u;
  __mmask64 neg;
};
inline __attribute__((always_inline)) I8Operand i8_operand(__m512i w) {
#if defined(__AVX512VNNI__)
  return {w, 0};
#else
  return {_mm512_abs_epi8(w), _mm512_movepi8_mask(w)};
#endif
}
inline __attribute__((always_inline)) __m512i i8_dot(__m512i acc, const I8Operand& w, __m512i q) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w.u, q);
#else
  const __m512i qs = _mm512_mask_sub_epi8(q, w.neg, _mm512_setzero_si512(), q);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w.u, qs), _mm512_set1_epi16(1)));
#endif
}

// One block of codes -> its panel of quad dwords (16 x kp bytes).
inline void i8_panel_block(const uint8_t* src, int kp, uint8_t* dst) {
  const __m512i perm = _mm512_loadu_si512((const void*)kI8QuadPerm.v);
  for (int o = 0; o < kp / 4; ++o) _mm512_storeu_si512((void*)(dst + size_t(o) * 64), i8_quad(src + size_t(o) * 64, perm));
}

// C[r][j*16 + n] (ld 32) = sum_b d_r[b] sum_{k in b} q_r[k] w_j[n][k]: the rows' dot products with the codes, before
// the channel scales. b[j]: a panel (PANEL) or the block's codes. S independent chains per (row, block) for few rows.
template <int MR, int NB, bool PANEL>
inline void dot_tile_i8q8(const int8_t* const* a, const uint8_t* const* b, int kp, float* c) {
  constexpr int S = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  __m512i acc[S][MR][NB];
  __m512 tot[MR][NB];
  zero_chains<MR, NB, S>(acc, tot);
  const __m512i perm = _mm512_loadu_si512((const void*)kI8QuadPerm.v);
  const int far = PANEL ? 0 : far_prefetch_bytes();
  const int nb = kp / kQ8Group;
  const IntRowLayout lay = int_row_layout(kp, false);
  const float *d[MR], *ds[MR];  // d per block, d x sum q per block
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    d[r] = reinterpret_cast<const float*>(a[r] + lay.d);
    ds[r] = reinterpret_cast<const float*>(a[r] + lay.ds);
  }
  for (int bb = 0; bb < nb; ++bb) {
#pragma GCC unroll 8
    for (int oo = 0; oo < kQ8Group / 4; ++oo) {
      const int o = bb * (kQ8Group / 4) + oo;
      I8Operand w[NB];
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        if constexpr (PANEL) {
          w[j] = i8_operand(_mm512_loadu_si512((const void*)(b[j] + size_t(o) * 64)));
        } else {
          _mm_prefetch((const char*)(b[j] + size_t(o + kI8PrefetchQuads) * 64), _MM_HINT_T0);
          if (far) _mm_prefetch((const char*)(b[j] + size_t(o) * 64 + far), _MM_HINT_T1);
          w[j] = i8_operand(i8_quad(b[j] + size_t(o) * 64, perm));
        }
      }
      const int i = oo % S;
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        int32_t x;
        memcpy(&x, a[r] + 4 * o, 4);
        const __m512i xb = _mm512_set1_epi32(x);
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) acc[i][r][j] = i8_dot(acc[i][r][j], w[j], xb);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512 dv = _mm512_set1_ps(d[r][bb]);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j)
        tot[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(take_chains<MR, NB, S>(acc, r, j)), dv, tot[r][j]);
    }
  }
  if constexpr (kI8Offset) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      float zs = 0.0f;  // sum of d x sum q over the row's blocks
      for (int bb = 0; bb < nb; ++bb) zs += ds[r][bb];
      const __m512 off = _mm512_set1_ps(128.0f * zs);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) tot[r][j] = _mm512_sub_ps(tot[r][j], off);
    }
  }
  store_totals<MR, NB>(tot, c);
}

template <int NB, bool PANEL>
void dot_rows_i8q8(int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c) {
  switch (mr) {
    case 1: dot_tile_i8q8<1, NB, PANEL>(a, b, kp, c); break;
    case 2: dot_tile_i8q8<2, NB, PANEL>(a, b, kp, c); break;
    case 3: dot_tile_i8q8<3, NB, PANEL>(a, b, kp, c); break;
    default: dot_tile_i8q8<4, NB, PANEL>(a, b, kp, c); break;
  }
}
template <int NB>
void dot_rows_i8q8(bool panel, int mr, const int8_t* const* a, const uint8_t* const* b, int kp, float* c) {
  if (panel) dot_rows_i8q8<NB, true>(mr, a, b, kp, c);
  else dot_rows_i8q8<NB, false>(mr, a, b, kp, c);
}

void gate_up_i8q8(const GateUpTask& t, const Fp8Weights& q) {
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const bool panel = int_panels(t.m);
  uint8_t* pan = reinterpret_cast<uint8_t*>(t.scratch->deq);
  float* c = t.scratch->c;
  for (int j = 0; j < t.nblk; ++j) {  // the block pair stays in L1/L2 across the row tiles
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* b[2] = {bg, bg + block_bytes};
    if (panel) {
      i8_panel_block(b[0], t.kp, pan);
      i8_panel_block(b[1], t.kp, pan + block_bytes);
      b[0] = pan;
      b[1] = pan + block_bytes;
    }
    const float* sg = q.scale + size_t(j) * 2 * kBlockN;
    const float* su = sg + kBlockN;
    for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
      const int mr = tmin(kQ8TileRows, t.m - r0);
      dot_rows_i8q8<2>(panel, mr, t.q8_rows + r0, b, t.kp, c);
      for (int r = 0; r < mr; ++r) {
        mul_16(c + r * 32, sg);
        mul_16(c + r * 32 + 16, su);
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
      }
    }
  }
}

void down_i8q8(const DownTask& t, const Fp8Weights& q) {
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const bool panel = int_panels(t.m);
  uint8_t* pan = reinterpret_cast<uint8_t*>(t.scratch->deq);
  float* c = t.scratch->c;
  const int8_t* rows[kQ8TileRows];
  for (int j = 0; j < t.nblk; j += 2) {  // two blocks per tile share the activation broadcasts
    const int nb = tmin(2, t.nblk - j);
    const uint8_t* b[2] = {q.w + size_t(j) * block_bytes, q.w + size_t(j + nb - 1) * block_bytes};
    if (panel) {
      for (int h = 0; h < nb; ++h) i8_panel_block(b[h], t.kp, pan + h * block_bytes);
      b[0] = pan;
      b[1] = pan + (nb - 1) * block_bytes;
    }
    const float* sc = q.scale + size_t(j) * kBlockN;  // the nb blocks' row scales, 16 each
    for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
      const int mr = tmin(kQ8TileRows, t.m - r0);
      for (int r = 0; r < mr; ++r) rows[r] = t.q8_act + size_t(r0 + r) * t.q8_ld;
      if (nb == 2) dot_rows_i8q8<2>(panel, mr, rows, b, t.kp, c);
      else dot_rows_i8q8<1>(panel, mr, rows, b, t.kp, c);
      for (int r = 0; r < mr; ++r) {
        float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
        for (int h = 0; h < nb; ++h) axpy_vec_16(t.row_weight[r0 + r], c + r * 32 + h * 16, sc + h * kBlockN, o + h * 16);
      }
    }
  }
}
#elif defined(__AVX2__)
// One block of int8 codes into an avx2 integer panel (quad.h IntPanel, SIGNED): pair-rows 2o and 2o + 1 interleaved
// by words (vpunpck*wd works per 128-bit lane: rows 0-3 and 8-11, then 4-7 and 12-15, put in order by two lane
// swaps); one group of all kp inputs with the 16 row scales.
inline void i8_int_panel(const uint8_t* src, const float* scale, int kp, const IntPanel& p) {
  for (int o = 0; o < kp / 4; ++o) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(src + size_t(o) * 64));
    const __m256i b = _mm256_loadu_si256((const __m256i*)(src + size_t(o) * 64 + 32));
    const __m256i x = _mm256_unpacklo_epi16(a, b), y = _mm256_unpackhi_epi16(a, b);
    _mm256_storeu_si256((__m256i*)(p.u + size_t(o) * 64), _mm256_permute2x128_si256(x, y, 0x20));
    _mm256_storeu_si256((__m256i*)(p.u + size_t(o) * 64 + 32), _mm256_permute2x128_si256(x, y, 0x31));
  }
  memcpy(p.s, scale, kBlockN * sizeof(float));
}

void gate_up_i8q8(const GateUpTask& t, const Fp8Weights& q) {
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const IntPanel pg = int_panel(*t.scratch, t.kp, t.kp, 0), pu = int_panel(*t.scratch, t.kp, t.kp, 1);
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const float* sg = q.scale + size_t(j) * 2 * kBlockN;
    i8_int_panel(bg, sg, t.kp, pg);
    i8_int_panel(bg + block_bytes, sg + kBlockN, t.kp, pu);
    int_gate_up_rows<true, false>(t, pg, pu, [&](float* g, int r) {
      gate_act_16(t, g, g + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
    });
  }
}

void down_i8q8(const DownTask& t, const Fp8Weights& q) {
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const IntPanel pan = int_panel(*t.scratch, t.kp, t.kp, 0);
  for (int j = 0; j < t.nblk; ++j) {
    i8_int_panel(q.w + size_t(j) * block_bytes, q.scale + size_t(j) * kBlockN, t.kp, pan);
    int_down_rows<true, false>(t, pan, j, 1.0f);
  }
}
#else
inline void gate_up_i8q8(const GateUpTask&, const Fp8Weights&) {}
inline void down_i8q8(const DownTask&, const Fp8Weights&) {}
#endif

#if defined(LK_V512)
// fp8_block on the amx tier: each segment's block scale folded into the panel, bf16(value x scale) through
// fp8_scaled_lut, so the AMX tiles run over all of K; per-segment scales store and re-add the four accumulator
// tiles every 128 inputs, once per 32-row tile, so the fold pays from 4 row tiles on (>= 128 rows). 2 cores,
// prefill_formats.py, fp8_block vs bf16 at M = 256 / 1024: DeepSeek-V3 shape 1.11 / 1.20 -> 1.04 / 1.11, Qwen3-30B-A3B
// shape 1.39 / 1.41 -> 1.28 / 1.19 (noisier); M = 64 (32 rows an expert) unchanged, unfolded. The rounding of code x
// scale to bf16 once is vLLM's GPU kernels' when they dequantize, as the int4 group-32 panels fold (int4.cpp q4_folds).
#if defined(LK_AMX) && defined(LK_FP8_TABLE)
inline bool fp8_folds(int m, const Fp8Weights& q) { return m >= 128 && !q.int8 && !q.per_row; }
// Inputs [k0, k1) of one block (codes src, its segment scales) into its panel dst, bf16(code x scale).
inline void fp8_folded_range(const Fp8Weights& q, const uint8_t* src, const float* scale, int k0, int k1,
                             uint16_t* dst) {
  for (int k = k0; k < k1;) {
    const int sidx = k / q.seg, end = tmin(k1, (sidx + 1) * q.seg);
    const int i0 = k * kBlockN, i1 = end * kBlockN;
    int i = i0 + fp8_table_run(src + i0, dst + i0, i1 - i0, fp8_scaled_lut(scale[sidx]));
    for (; i < i1; ++i)  // (ranges of 2 inputs: 32 codes)
      dst[i] = f32_to_bf16(bf16_to_f32(fp8_to_bf16_1(src[i])) * scale[sidx]);
    k = end;
  }
}
#else
inline bool fp8_folds(int, const Fp8Weights&) { return false; }
inline void fp8_folded_range(const Fp8Weights&, const uint8_t*, const float*, int, int, uint16_t*) {}
#endif

// Two panel sets (four blocks of bf16) at most this large pipeline: with DeepSeek-V3's 7168 inputs (896 KiB)
// they and the rows' panel outgrew L2 and the pipelined layer ran 9-13% slower (2 cores, Sapphire Rapids).
constexpr size_t kPipelinedPanelBytes = 256 << 10;
inline bool panels_pipelined(int kp) { return size_t(4) * kBlockN * kp * 2 <= kPipelinedPanelBytes; }

// Gate/up over bf16 panels, pipelined where they fit: block pair j + 1 is dequantized into the other panel set
// while the tiles run over pair j (hidden behind the AMX tiles), the codes of pair j + 2 trickling into L2.
// Panels too large to pipeline take no prefetch either (DeepSeek-V3's gate/up lost 3-9% to it).
void gate_up_fp8_panels(const GateUpTask& t, const Fp8Weights& q) {
  const int per = q.per_row ? kBlockN : t.kp / q.seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const KernelScratch& s = *t.scratch;
  const bool pipe = panels_pipelined(t.kp);
  const bool fold = fp8_folds(t.m, q);
  auto codes = [&](int j) { return q.w + size_t(j) * 2 * block_bytes; };
  int pair = 0;  // the pair whose panels `deq` fills
  auto deq = [&](int h, int set, int k0, int k1) {
    if (fold)
      return fp8_folded_range(q, codes(pair) + h * block_bytes, q.scale + (size_t(pair) * 2 + h) * per, k0, k1,
                              panel_of(s, t.kp, 2 * set + h));
    dequant_bf16(q, codes(pair) + h * block_bytes + size_t(k0) * kBlockN,
                 panel_of(s, t.kp, 2 * set + h) + size_t(k0) * kBlockN, (k1 - k0) * kBlockN);
  };
  for (int j = 0; j < t.nblk; ++j) {
    const int set = pipe ? j & 1 : 0;
    if (j == 0 || !pipe) {
      pair = j;
      deq(0, set, 0, t.kp);
      deq(1, set, 0, t.kp);
    }
    const float* sg = q.scale + size_t(j) * 2 * per;
    const float* su = sg + per;
    pair = j + 1;
    const PanelFill<decltype(deq)> pf{&deq, pipe && j + 1 < t.nblk ? 2 : 0, set ^ 1, t.kp, 2};
    const void* next = pipe && j + 2 < t.nblk ? codes(j + 2) : nullptr;
    uint16_t* act = t.act + j * kBlockN;
    if (q.per_row)
      gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, next, 2 * block_bytes, [&](float* g, int r) {
        mul_16(g, sg);
        mul_16(g + 16, su);
        gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld);
      }, pf.fill(), set);
    else if (fold)
      gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, next, 2 * block_bytes,
                              [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); },
                              pf.fill(), set);
    else
      gate_up_panel<kSegScalar>(t, j, q.seg, sg, su, next, 2 * block_bytes,
                                [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); },
                                pf.fill(), set);
  }
}

// Down over bf16 panels of blocks j and j + 1, pipelined as gate_up_fp8_panels.
void down_fp8_panels(const DownTask& t, const Fp8Weights& q) {
  const int per = q.per_row ? kBlockN : t.kp / q.seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  const KernelScratch& s = *t.scratch;
  const bool pipe = panels_pipelined(t.kp);
  const bool fold = fp8_folds(t.m, q);
  int first = 0;  // the first block of the pair `deq` fills
  auto deq = [&](int h, int set, int k0, int k1) {
    if (fold)
      return fp8_folded_range(q, q.w + size_t(first + h) * block_bytes, q.scale + size_t(first + h) * per, k0, k1,
                              panel_of(s, t.kp, 2 * set + h));
    dequant_bf16(q, q.w + size_t(first + h) * block_bytes + size_t(k0) * kBlockN,
                 panel_of(s, t.kp, 2 * set + h) + size_t(k0) * kBlockN, (k1 - k0) * kBlockN);
  };
  for (int j = 0, step = 0; j < t.nblk; j += 2, ++step) {
    const int nb = tmin(2, t.nblk - j), set = pipe ? step & 1 : 0;
    if (j == 0 || !pipe) {
      first = j;
      for (int h = 0; h < nb; ++h) deq(h, set, 0, t.kp);
    }
    const float* sc[2] = {q.scale + size_t(j) * per, q.scale + size_t(j + nb - 1) * per};
    first = j + 2;
    const PanelFill<decltype(deq)> pf{&deq, pipe ? tmax(0, tmin(2, t.nblk - j - 2)) : 0, set ^ 1, t.kp, 2};
    const void* next = pipe && j + 4 < t.nblk ? q.w + size_t(j + 4) * block_bytes : nullptr;
    const size_t next_bytes = size_t(tmax(0, tmin(2, t.nblk - j - 4))) * block_bytes;
    if (q.per_row) down_panel<kSegNone>(t, j, nb, 0, nullptr, sc, 1.0f, next, next_bytes, pf.fill(), set);
    else if (fold) down_panel<kSegNone>(t, j, nb, 0, nullptr, nullptr, 1.0f, next, next_bytes, pf.fill(), set);
    else down_panel<kSegScalar>(t, j, nb, q.seg, sc, nullptr, 1.0f, next, next_bytes, pf.fill(), set);
  }
}
#endif

// mxfp8 (e8m0 scales per output row and 32 inputs): on the AVX-512 tiers up to kFusedFp8Rows rows (decode) the codes
// converted in registers as fp8_block's, each segment's partial sums times its 16 rows' scales in the tile (fp32,
// converted once per block), and more rows on exact bf16 panels (mx_bf16_panel_block); on avx2 from
// kF32PanelMinRows rows the fp32 panels (scales folded in, exact); otherwise (and for scales whose products leave
// bf16's range) each 32-input segment of the block (pair) dequantized exactly into L1, the tier's bf16 tile over
// every row tile, the partial sums added times the rows' scales in fp32.
inline void mx_scales_16(const uint8_t* e, float* s) {
  for (int n = 0; n < kBlockN; ++n) s[n] = e8m0_to_f32(e[n]);
}
inline void mx_scales_block(const uint8_t* e, int nseg, float* s) {
  for (int i = 0; i < nseg; ++i) mx_scales_16(e + size_t(i) * kBlockN, s + size_t(i) * kBlockN);
}

#if defined(LK_V512)
// mxfp8 prefill on the AVX-512 tiers: code x 2^(e - 127) has a bf16 code's 8 significant bits, so a block dequantizes
// exactly into a bf16 panel while every product stays in bf16's normal range (codes span 2^-9 .. 448: scale bytes
// kMxPanelMinE .. kMxPanelMaxE); the bf16 path's tiles (AMX, or the vector tiles) then run over all of K with no
// segment scales. A task with any scale outside that range (or a NaN scale, 255) keeps the per-segment path.
constexpr int kMxPanelMinE = 10, kMxPanelMaxE = 246;
inline bool mx_panels_exact(const uint8_t* e, size_t n) {
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= e[i] >= kMxPanelMinE && e[i] <= kMxPanelMaxE;
  return ok;
}

// One block of codes (its e8m0 scales e8, [kp / 32][16]) into its bf16 panel: per pair-row the 32 codes as bf16
// (rows in the 32-bit lanes: input 2p in the low word, 2p + 1 in the high one), each half times its rows' scales in
// fp32 (exact), the bf16 bits taken back.
inline void mx_bf16_panel_block(const uint8_t* src, const uint8_t* e8, int kp, uint16_t* dst) {
  const __m512i hi_mask = _mm512_set1_epi32(int32_t(0xffff0000u));
  for (int s = 0; s < kp / 32; ++s) {
    const __m128i e = _mm_loadu_si128((const __m128i*)(e8 + size_t(s) * kBlockN));
    const __m512 sv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(e), 23));  // 2^(e - 127)
    for (int p = 16 * s; p < 16 * (s + 1); ++p) {
      const __m512i w = fp8x32_to_bf16(_mm256_loadu_si256((const __m256i*)(src + size_t(p) * 32)));
      const __m512 lo = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), sv);
      const __m512 hi = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi_mask)), sv);
      _mm512_storeu_si512((void*)(dst + size_t(p) * 32),
                          _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(lo), 16),
                                          _mm512_and_si512(_mm512_castps_si512(hi), hi_mask)));
    }
  }
}
#endif

void gate_up_mx(const GateUpTask& t, const Fp8Weights& q) {
  const int seg = q.seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN, per = size_t(t.kp / seg) * kBlockN;
#if defined(LK_V512)
  if (t.m > kFusedFp8Rows && mx_panels_exact(q.mx_scale, size_t(t.nblk) * 2 * per)) {
    for (int j = 0; j < t.nblk; ++j) {
      const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
      const uint8_t* eg = q.mx_scale + size_t(j) * 2 * per;
      mx_bf16_panel_block(bg, eg, t.kp, panel_of(*t.scratch, t.kp, 0));
      mx_bf16_panel_block(bg + block_bytes, eg + per, t.kp, panel_of(*t.scratch, t.kp, 1));
      uint16_t* act = t.act + j * kBlockN;
      gate_up_panel<kSegNone>(t, j, 0, nullptr, nullptr, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr,
                              2 * block_bytes,
                              [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
    }
    return;
  }
#endif
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* bg = q.w + size_t(j) * 2 * block_bytes;
    const uint8_t* bu = bg + block_bytes;
    const uint8_t* eg = q.mx_scale + size_t(j) * 2 * per;
    const uint8_t* eu = eg + per;
#if defined(LK_V512)
    if (t.m <= kFusedFp8Rows) {
      float* sg = reinterpret_cast<float*>(t.scratch->deq);
      float* su = sg + per;
      mx_scales_block(eg, t.kp / seg, sg);
      mx_scales_block(eu, t.kp / seg, su);
      const void* b[2] = {bg, bu};
      const float* sc[2] = {sg, su};
      dot_rows_codes<2, kCodesFp8, kSegVector>(t.m, t.x_rows, b, t.kp, t.scratch->c, seg, sc);
      for (int r = 0; r < t.m; ++r)
        gate_act_16(t, t.scratch->c + r * 32, t.scratch->c + r * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      continue;
    }
#endif
#if defined(LK_F32_PANELS)
    if (t.m >= kF32PanelMinRows) {  // avx2: the pair whole into fp32 panels, scales folded in (as fp8_block)
      mx_f32_panel_block(bg, eg, t.kp, f32_panel_of(*t.scratch, t.kp, 0));
      mx_f32_panel_block(bu, eu, t.kp, f32_panel_of(*t.scratch, t.kp, 1));
      uint16_t* act = t.act + j * kBlockN;
      gate_up_f32_panel(t, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr, 2 * block_bytes,
                        [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
    gate_up_row_scaled_segments(t, j, seg, [&](int s, uint16_t* dg, uint16_t* du, float* sg, float* su) {
      const size_t off = size_t(s) * seg * kBlockN;
      fp8_to_bf16(bg + off, dg, seg * kBlockN);
      fp8_to_bf16(bu + off, du, seg * kBlockN);
      mx_scales_16(eg + size_t(s) * kBlockN, sg);
      mx_scales_16(eu + size_t(s) * kBlockN, su);
    });
  }
}

void down_mx(const DownTask& t, const Fp8Weights& q) {
  const int seg = q.seg, nseg = t.kp / seg;
  const size_t block_bytes = size_t(t.kp) * kBlockN, per = size_t(nseg) * kBlockN;
#if defined(LK_F32_PANELS)
  if (t.m >= kF32PanelMinRows)
    return down_f32_panels(t, q.w, block_bytes, [&](int blk, float* dst) {
      mx_f32_panel_block(q.w + size_t(blk) * block_bytes, q.mx_scale + size_t(blk) * per, t.kp, dst);
    });
#endif
#if defined(LK_V512)
  if (t.m <= kFusedFp8Rows) {
    const uint16_t* rows[kFusedFp8Rows];
    for (int r = 0; r < t.m; ++r) rows[r] = t.act + size_t(r) * t.act_ld;
    float* sc = reinterpret_cast<float*>(t.scratch->deq);
    for (int j = 0; j < t.nblk; ++j) {
      const void* b[2] = {q.w + size_t(j) * block_bytes, nullptr};
      const float* scs[2] = {sc, sc};
      mx_scales_block(q.mx_scale + size_t(j) * per, nseg, sc);
      dot_rows_codes<1, kCodesFp8, kSegVector>(t.m, rows, b, t.kp, t.scratch->c, seg, scs);
      for (int r = 0; r < t.m; ++r)
        axpy_16(t.row_weight[r], t.scratch->c + r * 32, t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN);
    }
    return;
  }
  if (mx_panels_exact(q.mx_scale, size_t(t.nblk) * per)) {
    for (int j = 0; j < t.nblk; j += 2) {
      const int nb = tmin(2, t.nblk - j);
      for (int h = 0; h < nb; ++h)
        mx_bf16_panel_block(q.w + size_t(j + h) * block_bytes, q.mx_scale + size_t(j + h) * per, t.kp,
                            panel_of(*t.scratch, t.kp, h));
      const size_t next_bytes = size_t(tmax(0, tmin(2, t.nblk - j - 2))) * block_bytes;
      down_panel<kSegNone>(t, j, nb, 0, nullptr, nullptr, 1.0f, next_bytes ? q.w + size_t(j + 2) * block_bytes : nullptr,
                           next_bytes);
    }
    return;
  }
#endif
  uint16_t* d = t.scratch->deq;
  float sc[kBlockN];
  for (int j = 0; j < t.nblk; ++j) {
    const uint8_t* src = q.w + size_t(j) * block_bytes;
    const uint8_t* e = q.mx_scale + size_t(j) * per;
    for (int s = 0; s < nseg; ++s) {
      const void* b[2] = {d, d};
      fp8_to_bf16(src + size_t(s) * seg * kBlockN, d, seg * kBlockN);
      mx_scales_16(e + size_t(s) * kBlockN, sc);
      down_segment(t, b, 1, s * seg, seg, [&](const float* cr, int r) {
        axpy_vec_16(t.row_weight[r], cr, sc, t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN);
      });
    }
  }
}

}  // namespace

// FP8 block weights: per `seg` inputs, dequantize the segment of the block (pair) exactly into
// L1, run the bf16 dot tile on it, and add scale x partial into fp32 sums. Same arithmetic as
// the bf16 path (the scales are applied in fp32), at ~3% extra per segment.
void gate_up_fp8(const GateUpTask& t) {
  const Fp8Weights& q = *std::get_if<Fp8Weights>(&t.quant);
  const int seg = q.seg, nseg = t.kp / seg;
  const int per = q.per_row ? kBlockN : nseg;  // scales per block
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  float* c = t.scratch->c;
  if (q.mx_scale) return gate_up_mx(t, q);
  if (kHaveQ8 && t.q8_rows) return gate_up_i8q8(t, q);  // int8 codes with int8 activations
#if defined(LK_V512)
  if (t.m > kFusedFp8Rows) return gate_up_fp8_panels(t, q);
#endif
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
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
      }
      continue;
    }
#if defined(LK_F32_PANELS)
    if (t.m >= kF32PanelMinRows) {
      fp8_f32_panel_block(q, bg, sg, t.kp, f32_panel_of(*t.scratch, t.kp, 0));
      fp8_f32_panel_block(q, bu, su, t.kp, f32_panel_of(*t.scratch, t.kp, 1));
      uint16_t* act = t.act + j * kBlockN;
      gate_up_f32_panel(t, j + 1 < t.nblk ? bg + 2 * block_bytes : nullptr, 2 * block_bytes,
                        [&](float* g, int r) { gate_act_16(t, g, g + 16, act + size_t(r) * t.act_ld); });
      continue;
    }
#endif
    // Many rows: dequantize each segment once (per-row scales: the whole block pair, one pass over K,
    // no partial sums per segment), reuse it for every row tile.
    const int step = q.per_row ? t.kp : seg;
    float* tot = t.scratch->acc;
    uint16_t* dg = t.scratch->deq;
    uint16_t* du = dg + size_t(step) * kBlockN;
    memset(tot, 0, size_t(t.m) * 32 * 4);
    for (int s = 0; s < t.kp / step; ++s) {
      const size_t off = size_t(s) * step * kBlockN;
      dequant_bf16(q, bg + off, dg, step * kBlockN);
      dequant_bf16(q, bu + off, du, step * kBlockN);
      gate_up_segment(t, dg, du, s * step, step, [&](const float* cr, int r) {
        float* o = tot + size_t(r) * 32;
        if (q.per_row) {
          axpy_vec_16(1.0f, cr, sg, o);
          axpy_vec_16(1.0f, cr + 16, su, o + 16);
        } else {
          axpy_16(sg[s], cr, o);
          axpy_16(su[s], cr + 16, o + 16);
        }
      });
    }
    for (int r = 0; r < t.m; ++r)
      gate_act_16(t, tot + size_t(r) * 32, tot + size_t(r) * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
  }
}

void down_fp8(const DownTask& t) {
  const Fp8Weights& q = *std::get_if<Fp8Weights>(&t.quant);
  const int seg = q.seg, nseg = t.kp / seg;
  const int per = q.per_row ? kBlockN : nseg;
  const size_t block_bytes = size_t(t.kp) * kBlockN;
  uint16_t* d = t.scratch->deq;
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  if (q.mx_scale) return down_mx(t, q);
  if (kHaveQ8 && t.q8_act) return down_i8q8(t, q);  // int8 codes with int8 activations
#if defined(LK_V512)
  if (t.m > kFusedFp8Rows) return down_fp8_panels(t, q);
#elif defined(LK_F32_PANELS)
  if (t.m >= kF32PanelMinRows)
    return down_f32_panels(t, q.w, block_bytes, [&](int blk, float* dst) {
      fp8_f32_panel_block(q, q.w + size_t(blk) * block_bytes, q.scale + size_t(blk) * per, t.kp, dst);
    });
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
    const int step = q.per_row ? t.kp : seg;  // per-row scales: the whole block in one pass
    for (int s = 0; s < t.kp / step; ++s) {
      const void* b[2] = {d, d};
      dequant_bf16(q, src + size_t(s) * step * kBlockN, d, step * kBlockN);
      down_segment(t, b, 1, s * step, step, [&](const float* cr, int r) {
        float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
        if (q.per_row) axpy_vec_16(t.row_weight[r], cr, sc, o);
        else axpy_16(t.row_weight[r] * sc[s], cr, o);
      });
    }
  }
}

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
