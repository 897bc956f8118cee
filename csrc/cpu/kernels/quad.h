// Pieces of the 4-bit decode tiles shared by int4.cpp and fp4.cpp: the bf16 quad step and the
// accumulator chains of the bf16-activation tiles, and the u8 x s8 dot product of the integer ones.
#pragma once

#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

constexpr int kQ8TileRows = 4;  // activation rows per int8-activation tile (int4 and fp4)
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

// The chains' lanes: fp32 sums (the bf16-activation tiles) or int32 ones (the integer tiles).
inline __attribute__((always_inline)) __m512 chain_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __attribute__((always_inline)) __m512i chain_add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
inline __attribute__((always_inline)) void chain_zero(__m512& v) { v = _mm512_setzero_ps(); }
inline __attribute__((always_inline)) void chain_zero(__m512i& v) { v = _mm512_setzero_si512(); }

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

#else
constexpr bool kHaveQ8 = false;
#endif

}  // namespace

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
