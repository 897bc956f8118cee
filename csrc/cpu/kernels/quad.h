// Pieces of the 4-bit decode tiles shared by int4.cpp and fp4.cpp: the bf16 quad step and the
// accumulator chains of the bf16-activation tiles, and the u8 x s8 dot product of the integer ones.
#pragma once

#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

constexpr int kQ8TileRows = 4;  // activation rows per integer-activation tile (avx2: two tiles of two)
// Integer-activation tasks with more rows than one tile convert their weight blocks once into a panel of the
// tile's u8 operand (fp4.cpp, fp8.cpp) instead of once per row tile.
inline bool int_panels(int m) { return m > kQ8TileRows; }

#if defined(LK_V512)
constexpr bool kHaveQ8 = true;  // the integer-activation tiles (act_quant.cpp rows)

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

// The chains' lanes: fp32 sums (the bf16-activation tiles) or int32 ones (the integer tiles).
inline __attribute__((always_inline)) __m512 chain_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __attribute__((always_inline)) __m512i chain_add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
inline __attribute__((always_inline)) void chain_zero(__m512& v) { v = _mm512_setzero_ps(); }
inline __attribute__((always_inline)) void chain_zero(__m512i& v) { v = _mm512_setzero_si512(); }

// The S accumulator chains per (row, block) of the quantized decode tiles and their fp32 totals:
// all start at zero; after each scale group, take_chains sums a (row, block)'s chains and restarts
// them; store_totals writes the tile (ld 32).
template <int MR, int NB, int S, typename V>
inline __attribute__((always_inline)) void zero_chains(V (&acc)[S][MR][NB], __m512 (&tot)[MR][NB]) {
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      tot[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < S; ++i) chain_zero(acc[i][r][j]);
    }
}

template <int MR, int NB, int S, typename V>
inline __attribute__((always_inline)) V take_chains(V (&acc)[S][MR][NB], int r, int j) {
  V sum = acc[0][r][j];
  chain_zero(acc[0][r][j]);
#pragma GCC unroll 4
  for (int i = 1; i < S; ++i) {
    sum = chain_add(sum, acc[i][r][j]);
    chain_zero(acc[i][r][j]);
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

// ---- int8 activations (decode): u8 x s8 dot products
// acc (16 x int32) += sum over the 4 bytes of each dword of u[byte] * s[byte] (u unsigned, s signed).
inline __m512i dot4_u8s8(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else  // vpmaddubsw cannot saturate here: |2 * 15 * 128| < 2^15
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

#elif defined(__AVX2__)
constexpr bool kHaveQ8 = true;  // the avx2 integer tile below (LK_INT8_ACT=1; no q15 rows on this tier)

// ---- int8 activations on avx2: one tile for every format, over a panel of the block
// The task converts each block once into an IntPanel: per quad of 4 inputs 64 bytes, the dwords of rows 0-7 then
// of rows 8-15, each 4 codes (the int4 / fp4 formats: u8 codes with a per-row offset; int8_channel: the int8 codes
// themselves, SIGNED), and per scale group of `group` inputs 16 fp32 scales s and 16 s x z (z: the row's code
// offset). The tile sums codes x q8 activation codes per L = min(group, 32) inputs in int32 (vpmaddubsw +
// vpmaddwd: 32 multiply-adds in two multiplies against four fp32 FMAs; no saturation: |2 x 128 x 127| < 2^15, the
// int8 codes as |w| and q with w's sign), then tot += sum x d x s - (s z) x d x sum q in fp32. Q15 (the 4-bit
// formats' default decode, as on the AVX-512 tiers): q15 rows, q = 128 hi + lo, two multiplies per quad on the
// same codes, 128 sum(u hi) + sum(u lo) exact in int32 (|.| <= 32 x 24 x 16256 < 2^24): bf16's error.
struct IntPanel {
  uint8_t* u;
  float* s;
  float* sz;
  int group;
};
// Panel h (0 or 1) of a task's scratch deq (2 x 16 x kp code bytes, then the scales and offsets of both).
inline IntPanel int_panel(const KernelScratch& sc, int kp, int group, int h) {
  uint8_t* base = reinterpret_cast<uint8_t*>(sc.deq);
  float* f = reinterpret_cast<float*>(base + size_t(2) * kBlockN * kp);
  const size_t per = size_t(kp / group) * kBlockN;
  return {base + size_t(h) * kBlockN * kp, f + h * per, f + 2 * per + h * per, group};
}

template <int MR, int L, bool SIGNED, bool OFFSET, bool Q15>
inline void dot_tile_int2(const int8_t* const* a, const IntPanel& p, int kp, float* c) {
  __m256i acc[MR][2];                // q8: q; q15: lo
  __m256i hacc[Q15 ? MR : 1][2];     // q15: hi
  __m256 tot[MR][2];
  for (int r = 0; r < MR; ++r) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const IntRowLayout lay = int_row_layout(kp, Q15);
  const float *d[MR], *ds[MR];
  const int32_t* s16[MR];
  for (int r = 0; r < MR; ++r) {
    d[r] = reinterpret_cast<const float*>(a[r] + lay.d);
    ds[r] = reinterpret_cast<const float*>(a[r] + lay.ds);  // q8 rows only
    s16[r] = reinterpret_cast<const int32_t*>(a[r] + lay.s16);
  }
  auto dot = [&](__m256i acc_, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc_, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones));
  };
  for (int k0 = 0; k0 < kp; k0 += L) {
    for (int r = 0; r < MR; ++r) {
      acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      if constexpr (Q15) hacc[r][0] = hacc[r][1] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int qd = 0; qd < L / 4; ++qd) {
      const int o = k0 / 4 + qd;
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)(p.u + size_t(o) * 64));
      const __m256i w1 = _mm256_loadu_si256((const __m256i*)(p.u + size_t(o) * 64 + 32));
      const __m256i u0 = SIGNED ? _mm256_abs_epi8(w0) : w0, u1 = SIGNED ? _mm256_abs_epi8(w1) : w1;
#pragma GCC unroll 2
      for (int r = 0; r < MR; ++r) {
        int32_t xi;
        memcpy(&xi, a[r] + lay.lo + 4 * o, 4);  // q8: q; q15: lo
        const __m256i x = _mm256_set1_epi32(xi);
        const __m256i x0 = SIGNED ? _mm256_sign_epi8(x, w0) : x, x1 = SIGNED ? _mm256_sign_epi8(x, w1) : x;
        acc[r][0] = dot(acc[r][0], u0, x0);
        acc[r][1] = dot(acc[r][1], u1, x1);
        if constexpr (Q15) {  // the 4-bit formats only (unsigned codes)
          memcpy(&xi, a[r] + 4 * o, 4);
          const __m256i xh = _mm256_set1_epi32(xi);
          hacc[r][0] = dot(hacc[r][0], u0, xh);
          hacc[r][1] = dot(hacc[r][1], u1, xh);
        }
      }
    }
    const int g = k0 / p.group;
    const __m256 sv[2] = {_mm256_loadu_ps(p.s + g * 16), _mm256_loadu_ps(p.s + g * 16 + 8)};
    for (int r = 0; r < MR; ++r) {
      const float dv = d[r][k0 / kQ8Group];
      const __m256 dd = _mm256_set1_ps(dv);
      for (int h = 0; h < 2; ++h) {
        __m256i sum = acc[r][h];
        if constexpr (Q15) sum = _mm256_add_epi32(_mm256_slli_epi32(hacc[r][h], 7), sum);
        tot[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dd, sv[h]), tot[r][h]);
      }
      if constexpr (OFFSET) {  // d x sum q over the L inputs: the q8 row's per-block value, or d x the 16-sums
        const float sq = Q15 ? dv * float(L == 32 ? s16[r][k0 / 16] + s16[r][k0 / 16 + 1] : s16[r][k0 / 16])
                             : L == 32 ? ds[r][k0 / 32] : dv * float(s16[r][k0 / 16]);
        const __m256 sqv = _mm256_set1_ps(sq);
        for (int h = 0; h < 2; ++h) tot[r][h] = _mm256_fnmadd_ps(_mm256_loadu_ps(p.sz + g * 16 + 8 * h), sqv, tot[r][h]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * 32, tot[r][0]);
    _mm256_storeu_ps(c + r * 32 + 8, tot[r][1]);
  }
}

// C[r][0:16] (ld 32) for mr rows of q8 codes (q15: q15 rows, one row a tile) against one panel, in tiles of two rows.
template <int L, bool SIGNED, bool OFFSET>
void int_rows_l(bool q15, int mr, const int8_t* const* a, const IntPanel& p, int kp, float* c) {
  for (int r = 0; r < mr;) {
    if (q15) {
      // q15 rows only reach formats with q15_decode (moe_layer.cpp), none of them signed (int8_channel)
      if constexpr (SIGNED) __builtin_trap();
      else dot_tile_int2<1, L, SIGNED, OFFSET, true>(a + r, p, kp, c + r * 32);
      r += 1;
    } else if (mr - r >= 2) {
      dot_tile_int2<2, L, SIGNED, OFFSET, false>(a + r, p, kp, c + r * 32);
      r += 2;
    } else {
      dot_tile_int2<1, L, SIGNED, OFFSET, false>(a + r, p, kp, c + r * 32);
      r += 1;
    }
  }
}
template <bool SIGNED, bool OFFSET>
void int_rows(bool q15, int mr, const int8_t* const* a, const IntPanel& p, int kp, float* c) {
  if (p.group < kQ8Group) int_rows_l<16, SIGNED, OFFSET>(q15, mr, a, p, kp, c);
  else int_rows_l<32, SIGNED, OFFSET>(q15, mr, a, p, kp, c);
}

// A gate/up task's rows against the panels of its block pair j (pg, pu, filled by the caller): fin(c, r) takes row
// r's gate (c[0:16]) and up (c[16:32]) sums.
template <bool SIGNED, bool OFFSET, typename Fin>
void int_gate_up_rows(const GateUpTask& t, const IntPanel& pg, const IntPanel& pu, Fin&& fin) {
  float* c = t.scratch->c;
  for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
    const int mr = tmin(kQ8TileRows, t.m - r0);
    int_rows<SIGNED, OFFSET>(t.q15, mr, t.q8_rows + r0, pg, t.kp, c);
    int_rows<SIGNED, OFFSET>(t.q15, mr, t.q8_rows + r0, pu, t.kp, c + 16);
    for (int r = 0; r < mr; ++r) fin(c + r * 32, r0 + r);
  }
}

// A down task's rows against the panel of its block blk: each row's 16 sums times its router weight times w are
// added to its out_acc row.
template <bool SIGNED, bool OFFSET>
void int_down_rows(const DownTask& t, const IntPanel& p, int blk, float w) {
  float* c = t.scratch->c;
  const int8_t* rows[kQ8TileRows];
  for (int r0 = 0; r0 < t.m; r0 += kQ8TileRows) {
    const int mr = tmin(kQ8TileRows, t.m - r0);
    for (int r = 0; r < mr; ++r) rows[r] = t.q8_act + size_t(r0 + r) * t.q8_ld;
    int_rows<SIGNED, OFFSET>(t.q15, mr, rows, p, t.kp, c);
    for (int r = 0; r < mr; ++r)
      axpy_16(t.row_weight[r0 + r] * w, c + r * 32, t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + blk * kBlockN);
  }
}
#else
constexpr bool kHaveQ8 = false;
#endif

}  // namespace

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
