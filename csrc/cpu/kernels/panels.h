// The quantized formats' prefill panels (AVX-512 tiers) and the AMX tiles: the row tiles over a
// block (pair) dequantized whole into bf16, with its segment scales (see simd.h for the tiers).
#pragma once

#include "cpu/kernels/simd.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

// The two bf16 panels of a task's scratch (2 x 16 x kp each way; the fp32 segment scales of the
// AVX-512 tiers after them, panel_scales).
inline uint16_t* panel_of(const KernelScratch& s, int kp, int h) { return s.deq + size_t(h) * kBlockN * kp; }

#if defined(LK_V512)

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

// A format's dequantization of the next block (pair) into the other panel set, in `parts` parts (any
// count; part p of n does its p-th n-th), run by the tiles of the current one between their k-steps (AMX)
// or after them (the vector tiles). Null fn: nothing to do.
struct Fill {
  void (*fn)(void* ctx, int part, int parts) = nullptr;
  void* ctx = nullptr;
  void run_all() const {
    if (fn) fn(ctx, 0, 1);
  }
};

// Units [first, last) of `units` for part p of n.
inline void part_range(int units, int p, int n, int& first, int& last) {
  first = int(int64_t(units) * p / n);
  last = int(int64_t(units) * (p + 1) / n);
}

// A Fill over the inputs of up to two blocks: deq(h, set, k0, k1) dequantizes inputs [k0, k1) of the next
// pair's block h into panel set `set` (k0, k1 multiples of unit_k, which divides kp).
template <typename Deq>
struct PanelFill {
  const Deq* deq;
  int blocks, set, kp, unit_k;
  static void run(void* ctx, int part, int parts) {
    const auto& f = *static_cast<const PanelFill*>(ctx);
    int a, b;
    part_range(f.kp / f.unit_k, part, parts, a, b);
    for (int h = 0; h < f.blocks && b > a; ++h) (*f.deq)(h, f.set, a * f.unit_k, b * f.unit_k);
  }
  Fill fill() const { return blocks ? Fill{&PanelFill::run, const_cast<PanelFill*>(this)} : Fill{}; }
};

inline float* panel_scales(const KernelScratch& s, int kp) {
  return reinterpret_cast<float*>(s.deq + size_t(2) * kBlockN * kp);
}

#if !defined(LK_VBF16)
// The avx512 tier (no AVX512-BF16) runs panel tasks of up to kF32PanelMaxInputs inputs on fp32. Its bf16 tile
// splits each weight pair-row and each activation pair into fp32 with a shift and a mask on the two 512-bit ports
// the multiply-adds use. Here each block of the task's panels becomes an fp32 panel once per task (per input, its
// 16 rows' weights, the segment scales folded in: exact for the codes and their power-of-two or small-integer
// products, one fp32 rounding for fp8 x an fp32 scale, as the avx2 tier's panels), each row tile's activations
// fp32 rows once per block (pair), and the tile only loads and multiplies (one FMA per row, block and input, its
// activation a broadcast load). 16-core Xeon, Qwen3-30B-A3B shape, quantized prefill against bf16's in the same
// run (session 40): 0.86-1.04x at M = 256 (bf16 panels: 1.01-1.07x), 0.97-1.04x at 1024 (0.96-1.08x).
#define LK_F32_PANELS_512 1
// Up to 2048 inputs (Qwen3-30B-A3B's gate/up, DeepSeek-V3's down) the two fp32 blocks and the rows take 176 bytes an
// input (352 KiB) beside the bf16 panels in L2; DeepSeek-V3's 7168-input gate/up would take 1.2 MiB, and its layer
// ran slower with them (1.20-1.43x bf16's prefill at M = 64, against 1.11-1.18x on bf16 panels).
constexpr int kF32PanelMaxInputs = 2048;
static_assert(kF32PanelRows == 12, "the tile below holds 12 rows x 2 blocks of accumulators");

// Block h's fp32 panel (16 x kp floats, input-major) and the row tile's fp32 rows (kF32PanelRows x kp).
inline float* f32_panel512(const KernelScratch& s, int kp, int h) { return s.f32 + size_t(h) * kBlockN * kp; }
inline float* f32_row_buffer512(const KernelScratch& s, int kp) { return s.f32 + size_t(2) * kBlockN * kp; }

// One bf16 panel block (pair-row layout: word 2n + b is row n, input 2p + b) into its fp32 panel, each
// segment's scales folded in (SEG as dot_tile's: one per segment, or one per row and segment).
template <int SEG>
inline void f32_from_panel(const uint16_t* src, int kp, int seg, const float* scale, float* dst) {
  const __m512i hi = _mm512_set1_epi32(int32_t(0xffff0000u));
  const int seg_pairs = SEG == kSegNone ? kp / 2 : seg / 2;
  for (int p0 = 0, sidx = 0; p0 < kp / 2; p0 += seg_pairs, ++sidx) {
    __m512 sv = _mm512_set1_ps(1.0f);
    if constexpr (SEG == kSegVector) sv = _mm512_loadu_ps(scale + 16 * sidx);
    if constexpr (SEG == kSegScalar) sv = _mm512_set1_ps(scale[sidx]);
    for (int p = p0; p < p0 + seg_pairs; ++p) {
      const __m512i w = _mm512_loadu_si512(src + size_t(p) * 32);
      __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      __m512 o = _mm512_castsi512_ps(_mm512_and_si512(w, hi));
      if constexpr (SEG != kSegNone) {
        e = _mm512_mul_ps(e, sv);
        o = _mm512_mul_ps(o, sv);
      }
      _mm512_storeu_ps(dst + size_t(p) * 32, e);
      _mm512_storeu_ps(dst + size_t(p) * 32 + 16, o);
    }
  }
}

// mr bf16 rows of kp inputs into fp32 rows (ld kp).
inline void f32_rows_from(int mr, const uint16_t* const* a, int kp, float* dst) {
  for (int r = 0; r < mr; ++r)
    for (int k = 0; k < kp; k += 16) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r] + k));
      _mm512_storeu_ps(dst + size_t(r) * kp + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    }
}

// C[r][16 j + n] (ld 32) = sum_k a[r][k] x b_j[k][n]: MR fp32 rows (ld kp) over NB fp32 panel blocks; the next
// codes trickle into L2 meanwhile.
template <int MR, int NB>
inline void f32_tile512(const float* a, int kp, const float* const* b, float* c, Prefetch pf) {
  __m512 acc[MR][NB];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  Trickle trickle(pf, kp);
  for (int k = 0; k < kp; ++k) {
    trickle.step();
    __m512 w[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) w[j] = _mm512_loadu_ps(b[j] + size_t(k) * kBlockN);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[size_t(r) * kp + k]);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_fmadd_ps(w[j], av, acc[r][j]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + r * 32 + j * 16, acc[r][j]);
}

template <int NB>
inline void f32_rows512(int mr, const float* a, int kp, const float* const* b, float* c, Prefetch pf) {
  switch (mr) {
    case 1: return f32_tile512<1, NB>(a, kp, b, c, pf);
    case 2: return f32_tile512<2, NB>(a, kp, b, c, pf);
    case 3: return f32_tile512<3, NB>(a, kp, b, c, pf);
    case 4: return f32_tile512<4, NB>(a, kp, b, c, pf);
    case 5: return f32_tile512<5, NB>(a, kp, b, c, pf);
    case 6: return f32_tile512<6, NB>(a, kp, b, c, pf);
    case 7: return f32_tile512<7, NB>(a, kp, b, c, pf);
    case 8: return f32_tile512<8, NB>(a, kp, b, c, pf);
    case 9: return f32_tile512<9, NB>(a, kp, b, c, pf);
    case 10: return f32_tile512<10, NB>(a, kp, b, c, pf);
    case 11: return f32_tile512<11, NB>(a, kp, b, c, pf);
    default: return f32_tile512<12, NB>(a, kp, b, c, pf);
  }
}

// The row tiles of m rows (row(r): its bf16 inputs) over the nb fp32 panel blocks, tiles of equal height (32
// rows: 11 + 11 + 10, not 12 + 12 + 8); fin(c, r) takes row r's results.
template <typename Row, typename Fin>
inline void f32_panel_rows512(const KernelScratch& s, int m, int kp, int nb, Row&& row, const void* next,
                              size_t next_bytes, Fin&& fin) {
  const float* b[2] = {f32_panel512(s, kp, 0), f32_panel512(s, kp, nb - 1)};
  float* af = f32_row_buffer512(s, kp);
  const uint16_t* rows[kF32PanelRows];
  const int tiles = (m + kF32PanelRows - 1) / kF32PanelRows;
  for (int tile = 0, r0 = 0; tile < tiles; ++tile) {
    const int mr = (m - r0) / (tiles - tile);
    for (int r = 0; r < mr; ++r) rows[r] = row(r0 + r);
    f32_rows_from(mr, rows, kp, af);
    const Prefetch pf = tile_share(next, next_bytes, tile, tiles);
    if (nb == 2) f32_rows512<2>(mr, af, kp, b, s.c, pf);
    else f32_rows512<1>(mr, af, kp, b, s.c, pf);
    for (int r = 0; r < mr; ++r) fin(s.c + r * 32, r0 + r);
    r0 += mr;
  }
}
#endif  // !LK_VBF16

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
  // GCC 12 does not count the rows/colsb stores as read by _tile_loadconfig and drops them in the
  // out-of-line copy (zero rows: every tile unconfigured, the first tilezero raises SIGILL; seen on a
  // Sapphire Rapids VM, 2026-12-03). The barrier keeps them.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// What the core does while the matrix unit runs the tiles, a share per k-step: bring the next block
// (pair)'s codes into L2 (`pf`: lines left) and, where a format pipelines its panels, dequantize the next
// block (pair) into the other panel set (`fill(ctx, part, parts)`, part by part). Tile instructions take
// 16 cycles each and run beside the vector units, so work placed between them is mostly hidden.
struct SideWork {
  Prefetch pf;
  Fill fill;
  int part = 0, parts = 0;  // fill parts done, of how many (one per k-step of the first row tile)
  int steps = 0;            // k-steps left to spread the prefetch over
  inline void step() {
    if (pf.lines > 0) {
      const int n = steps > 1 ? (pf.lines + steps - 1) / steps : pf.lines;
      for (int l = 0; l < n; ++l) _mm_prefetch(pf.p + 64 * l, _MM_HINT_T1);
      pf.p += 64 * n;
      pf.lines -= n;
    }
    if (steps > 0) --steps;
    if (fill.fn && part < parts) fill.fn(fill.ctx, part++, parts);
  }
  inline void finish() {  // whatever the k-steps left undone (none when `parts` counted them all)
    while (fill.fn && part < parts) fill.fn(fill.ctx, part++, parts);
  }
};

// Accumulator tiles 0-3 += A (32 rows, stride lda elements) x [B0 | B1] over inputs [k0, k1), with a share
// of the side work per k-step.
inline void amx_accumulate(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int k0, int k1,
                           SideWork& w) {
  const size_t stride = lda * 2;
  for (int k = k0; k < k1; k += 32) {
    w.step();
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
inline void amx_tile_32x32(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int kp, float* c,
                           SideWork& w) {
  amx_zero();
  amx_accumulate(a, lda, b0, b1, 0, kp, w);
  amx_store(c);
}
inline void amx_tile_32x32(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int kp, float* c) {
  SideWork none;
  amx_tile_32x32(a, lda, b0, b1, kp, c, none);
}

// amx_tile_32x32 with segment scales (SEG as dot_tile's): each `seg` inputs (a multiple of 32) the four
// accumulator tiles go to `tmp` (32 x 32 fp32) and are added into C scaled, in fp32.
template <int SEG>
inline void amx_tile_32x32_seg(const uint16_t* a, size_t lda, const uint16_t* b0, const uint16_t* b1, int kp,
                               int seg, const float* const* scale, float* c, float* tmp, SideWork& w) {
  for (int r = 0; r < 32; ++r) {
    _mm512_storeu_ps(c + r * 32, _mm512_setzero_ps());
    _mm512_storeu_ps(c + r * 32 + 16, _mm512_setzero_ps());
  }
  for (int k0 = 0, sidx = 0; k0 < kp; k0 += seg, ++sidx) {
    amx_zero();
    amx_accumulate(a, lda, b0, b1, k0, k0 + seg, w);
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
                           const float* const* scale, float* c, float* tmp, SideWork& w) {
  const auto* b0 = static_cast<const uint16_t*>(b[0]);
  const auto* b1 = static_cast<const uint16_t*>(b[1]);
  if constexpr (SEG == kSegNone) amx_tile_32x32(a, lda, b0, b1, kp, c, w);
  else amx_tile_32x32_seg<SEG>(a, lda, b0, b1, kp, seg, scale, c, tmp, w);
}

// Segment scales folded into a panel for the AMX row tiles: each weight of a pair-row of the bf16 block
// layout (word 2n + b: row n, input b of the pair) times its row's scale, rounded to bf16 once (to nearest
// even): the rounding vLLM's GPU kernels apply when they dequantize (Marlin's W4A16 multiplies code and
// scale in 16 bits). The tiles then run over all of K with no partial sums through memory, where
// per-segment scaling stores the four accumulator tiles and adds them back every segment (int4 group 32:
// every k-step). FoldScales holds a segment's 16 row scales as the two halves' per-word vectors; apply()
// folds one pair-row in registers, as the dequantization writes it.
struct FoldScales {
  __m512 lo, hi;
  explicit FoldScales(const float* s16) {
    const __m512i idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512 sv = _mm512_loadu_ps(s16);
    lo = _mm512_permutexvar_ps(idx, sv);
    hi = _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(8)), sv);
  }
  __m512i apply(__m512i w) const {
    const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16));
    const __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16));
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(b, hi), _mm512_mul_ps(a, lo));
  }
};

// The unit's token rows gathered once into a tile-strided panel (rows up to the tile height zeroed).
inline void amx_gather_rows(const GateUpTask& t) {
  const int mt = (t.m + 31) / 32 * 32;
  for (int r = 0; r < mt; ++r) {
    if (r < t.m) memcpy(t.scratch->panel + size_t(r) * t.kp, t.x_rows[r], size_t(t.kp) * 2);
    else memset(t.scratch->panel + size_t(r) * t.kp, 0, size_t(t.kp) * 2);
  }
}

// The 32-row tiles of m rows (a: tile-strided, lda elements) over a block pair's panels, scaled per
// segment as SEG says; fin(c, r) takes row r's 32 results. Meanwhile the side work: the next codes
// (`next`, `next_bytes`) into L2, a lone tile too (one tile per expert is the common prefill case at a few
// hundred tokens, where the panels' dequantization otherwise waits on DRAM), and the format's `fill`.
template <int SEG, typename Fin>
inline void amx_panel_rows(const uint16_t* a, size_t lda, int m, const void* const* b, int kp, int seg,
                           const float* const* scale, const KernelScratch& s, const void* next, size_t next_bytes,
                           const Fill& fill, Fin&& fin) {
  amx_configure();
  SideWork w;
  w.steps = (m + 31) / 32 * (kp / 32);
  w.pf = Prefetch{static_cast<const char*>(next), next ? int(next_bytes / 64) : 0};
  w.fill = fill;
  w.parts = fill.fn ? kp / 32 : 0;  // during the first row tile: later ones run undisturbed
  for (int r0 = 0; r0 < m; r0 += 32) {
    amx_panel_tile<SEG>(a + size_t(r0) * lda, lda, b, kp, seg, scale, s.c, s.acc, w);
    for (int r = 0; r < tmin(32, m - r0); ++r) fin(s.c + r * 32, r0 + r);
  }
  _tile_release();
  w.finish();
}
#endif  // LK_AMX

// Row tiles of a gate/up task over the panels of block pair j; fin(c, r) takes row r's 32 results.
// Meanwhile the tiles trickle the next block pair's codes (`next`, `next_bytes`) into L2, so that its
// dequantization does not wait on DRAM (the bf16 path does the same for its weights). On the amx tier
// the task's rows are gathered into the tile panel with its first block pair (j == 0).
template <int SEG, typename Fin>
void gate_up_panel(const GateUpTask& t, int j, int seg, const float* sg, const float* su, const void* next,
                   size_t next_bytes, Fin&& fin, const Fill& fill = {}, int set = 0) {
  float* c = t.scratch->c;
  const void* b[2] = {panel_of(*t.scratch, t.kp, 2 * set), panel_of(*t.scratch, t.kp, 2 * set + 1)};
  const float* sc[2] = {sg, su};
  constexpr int R = SEG == kSegNone ? kMaxRows : kSegTileRows;
#if defined(LK_AMX)
  if (t.m >= kAmxMinRows) {
    if (j == 0) amx_gather_rows(t);
    return amx_panel_rows<SEG>(t.scratch->panel, t.kp, t.m, b, t.kp, seg, sc, *t.scratch, next, next_bytes, fill, fin);
  }
#endif
#if defined(LK_F32_PANELS_512)
  if (t.kp <= kF32PanelMaxInputs) {
    f32_from_panel<SEG>(static_cast<const uint16_t*>(b[0]), t.kp, seg, sg, f32_panel512(*t.scratch, t.kp, 0));
    f32_from_panel<SEG>(static_cast<const uint16_t*>(b[1]), t.kp, seg, su, f32_panel512(*t.scratch, t.kp, 1));
    f32_panel_rows512(*t.scratch, t.m, t.kp, 2, [&](int r) { return t.x_rows[r]; }, next, next_bytes, fin);
    return fill.run_all();
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
  fill.run_all();
}

// Row tiles of a down task over the panels of blocks j and j + nb - 1: row r's results times its
// router weight x gs (and x row_scale[h][n], per-row formats) are added to its out_acc row; the
// tiles trickle the next blocks' codes into L2 as gate_up_panel does.
template <int SEG>
void down_panel(const DownTask& t, int j, int nb, int seg, const float* const* seg_scale,
                const float* const* row_scale, float gs, const void* next, size_t next_bytes, const Fill& fill = {},
                int set = 0) {
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  const void* b[2] = {panel_of(*t.scratch, t.kp, 2 * set), panel_of(*t.scratch, t.kp, 2 * set + nb - 1)};
  constexpr int R = SEG == kSegNone ? kMaxRows : kSegTileRows;
  // row r's results c (16 per block) into its out_acc row
  auto add = [&](const float* c, int r) {
    float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld + j * kBlockN;
    const float w = t.row_weight[r] * gs;
    for (int h = 0; h < nb; ++h) {
      if (row_scale) axpy_vec_16(w, c + h * 16, row_scale[h], o + h * 16);
      else axpy_16(w, c + h * 16, o + h * 16);
    }
  };
#if defined(LK_AMX)
  if (t.m >= kAmxMinRows)  // act rows past m are readable slack, as in down_bf16()
    return amx_panel_rows<SEG>(t.act, t.act_ld, t.m, b, t.kp, seg, seg_scale, *t.scratch, next, next_bytes, fill, add);
#endif
#if defined(LK_F32_PANELS_512)
  if (t.kp <= kF32PanelMaxInputs) {
    for (int h = 0; h < nb; ++h)
      f32_from_panel<SEG>(static_cast<const uint16_t*>(b[h]), t.kp, seg, seg_scale ? seg_scale[h] : nullptr,
                          f32_panel512(*t.scratch, t.kp, h));
    f32_panel_rows512(*t.scratch, t.m, t.kp, nb, [&](int r) { return t.act + size_t(r) * t.act_ld; }, next,
                      next_bytes, add);
    return fill.run_all();
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
    for (int r = 0; r < mr; ++r) add(c + r * 32, r0 + r);
  }
  fill.run_all();
}
#elif defined(__AVX2__)
#define LK_F32_PANELS 1

// Prefill of the quantized formats on the avx2 tier (tasks of kF32PanelMinRows rows or more; the 4-bit formats: every task): each
// block (pair) whole into an fp32 panel, every weight with its scales folded in ((u - z) x a bf16/fp16
// scale, e2m1 x a power of two or an fp8 scale: exact in fp32; fp8/int8 codes x an fp32 scale: one
// rounding), in the order the tile consumes it: per pair-row p and 8-row half h, the 8 weights of
// input 2p, then the 8 of input 2p + 1 (floats p * 32 + h * 16 + t * 8 + n). The bf16 tile spends a
// shift and a mask on every pair-row it loads, once per row tile; here the dequantization pays them
// once per task and the tile (f32_panel_tile: four rows over one block) only loads and multiplies. No
// segment scales in the tile: one pass over all of K per row tile. Each format writes its panels
// straight from its codes (q4_f32_panel_block, fp8_f32_panel_block, fp4_f32_panel_block).
constexpr int kF32PanelMinRows = 4;
// The 4-bit formats take the panels from one row: their segment path below it dequantizes int4 codes in scalar
// code and fp4 ones a segment per row tile. 2 Zen4 cores, avx2 tier, Qwen3-30B-A3B layer, M = 1 / 4 ms, segments
// -> panels: wna16_int4 7.51 / 27.07 -> 2.18 / 7.92, nvfp4 3.91 / 13.39 -> 2.64 / 9.54, mxfp4 3.04 / 11.12 -> 3.13 /
// 10.23; the byte formats lost with panels there (fp8_block 2.75 / 9.94 -> 3.48 / 12.43) and keep the segments
// (docs/results/2026-12-05_dev2c_avx2_decode.log).
constexpr int kF32PanelMinRows4Bit = 1;
inline float* f32_panel_of(const KernelScratch& s, int kp, int h) {
  return reinterpret_cast<float*>(s.deq) + size_t(h) * kBlockN * kp;
}
// The fp32 panel tile over blocks b[0] .. b[nb - 1] (row r's 16 sums per block at c + r * 32 + 16 h), mr rows
// (1 .. kF32TileRows); the next codes' prefetch goes with the first block.
inline void f32_panel_rows(int mr, const uint16_t* const* a, const float* const* b, int nb, int kp, float* c,
                           Prefetch pf) {
  for (int h = 0; h < nb; ++h, pf = Prefetch{}) {
    switch (mr) {
      case 1: f32_panel_tile<1>(a, b[h], kp, c + 16 * h, pf); break;
      case 2: f32_panel_tile<2>(a, b[h], kp, c + 16 * h, pf); break;
      case 3: f32_panel_tile<3>(a, b[h], kp, c + 16 * h, pf); break;
      default: f32_panel_tile<4>(a, b[h], kp, c + 16 * h, pf); break;
    }
  }
}

// Row tiles of a gate/up task over the fp32 panels of its block pair; fin(c, r) takes row r's 32 results.
template <typename Fin>
void gate_up_f32_panel(const GateUpTask& t, const void* next, size_t next_bytes, Fin&& fin) {
  float* c = t.scratch->c;
  const float* b[2] = {f32_panel_of(*t.scratch, t.kp, 0), f32_panel_of(*t.scratch, t.kp, 1)};
  constexpr int R = kF32TileRows;
  const int tiles = (t.m + R - 1) / R;
  for (int r0 = 0, tile = 0; r0 < t.m; r0 += R, ++tile) {
    const int mr = tmin(R, t.m - r0);
    f32_panel_rows(mr, t.x_rows + r0, b, 2, t.kp, c, tile_share(next, next_bytes, tile, tiles));
    for (int r = 0; r < mr; ++r) fin(c + r * 32, r0 + r);
  }
}

// Row tiles of a down task over the fp32 panels of blocks j and j + nb - 1: row r's results times its
// router weight are added to its out_acc row.
inline void down_f32_panel(const DownTask& t, int j, int nb, const void* next, size_t next_bytes) {
  float* c = t.scratch->c;
  constexpr int R = kF32TileRows;
  const uint16_t* rows[R];
  const float* b[2] = {f32_panel_of(*t.scratch, t.kp, 0), f32_panel_of(*t.scratch, t.kp, nb - 1)};
  const int tiles = (t.m + R - 1) / R;
  for (int r0 = 0, tile = 0; r0 < t.m; r0 += R, ++tile) {
    const int mr = tmin(R, t.m - r0);
    for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld;
    f32_panel_rows(mr, rows, b, nb, t.kp, c, tile_share(next, next_bytes, tile, tiles));
    for (int r = 0; r < mr; ++r) {
      float* o = t.out_acc + size_t(t.out_row[r0 + r]) * t.out_ld + j * kBlockN;
      for (int h = 0; h < nb; ++h) axpy_16(t.row_weight[r0 + r], c + r * 32 + h * 16, o + h * 16);
    }
  }
}

// Every block pair of a down task through the fp32 panels: write(blk, dst) fills block blk's panel
// from the codes at `codes` (block_bytes each), whose next pair the tiles trickle into L2.
template <typename Write>
void down_f32_panels(const DownTask& t, const uint8_t* codes, size_t block_bytes, Write&& write) {
  for (int j = 0; j < t.nblk; j += 2) {
    const int nb = tmin(2, t.nblk - j);
    for (int h = 0; h < nb; ++h) write(j + h, f32_panel_of(*t.scratch, t.kp, h));
    down_f32_panel(t, j, nb, j + 2 < t.nblk ? codes + size_t(j + 2) * block_bytes : nullptr,
                   size_t(tmin(2, t.nblk - j - 2)) * block_bytes);
  }
}
#endif  // LK_V512 / __AVX2__

// Prefill of the quantized formats on the tiers without the panels (generic; avx2 below
// kF32PanelMinRows rows; the AVX-512 tiers never get here): one segment of `len` inputs from input
// k0, which the caller dequantized into L1 (a block pair dg, du; or blocks b[0], b[nb - 1]), run over
// every row tile of the task with the bf16 tile; add(c, r) takes row r's partial sums (32: gate and up; 16 per block: down).
template <typename Add>
void gate_up_segment(const GateUpTask& t, const uint16_t* dg, const uint16_t* du, int k0, int len, Add&& add) {
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  const void* b[2] = {dg, du};
  for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
    const int mr = tmin(kMaxRows, t.m - r0);
    for (int r = 0; r < mr; ++r) rows[r] = t.x_rows[r0 + r] + k0;
    dot_rows<2>(mr, rows, b, len, c);
    for (int r = 0; r < mr; ++r) add(c + r * 32, r0 + r);
  }
}

// Block pair j of a gate/up task over segments of `seg` inputs with one scale per output row and segment (int4
// groups, mxfp8): prep(s, dg, du, sg, su) dequantizes segment s of the gate and up blocks into dg / du (bf16, 16 x seg
// each) and their 16 row scales into sg / su; each row's partial sums are added times the scales in fp32 (totals in
// the task's acc scratch), then activated into act.
template <typename Prep>
void gate_up_row_scaled_segments(const GateUpTask& t, int j, int seg, Prep&& prep) {
  float* tot = t.scratch->acc;
  uint16_t* dg = t.scratch->deq;
  uint16_t* du = dg + size_t(seg) * kBlockN;
  float sg[kBlockN], su[kBlockN];
  memset(tot, 0, size_t(t.m) * 32 * 4);
  for (int s = 0; s < t.kp / seg; ++s) {  // dequantize each segment once, reuse it for every row tile
    prep(s, dg, du, sg, su);
    gate_up_segment(t, dg, du, s * seg, seg, [&](const float* cr, int r) {
      float* o = tot + size_t(r) * 32;
      axpy_vec_16(1.0f, cr, sg, o);
      axpy_vec_16(1.0f, cr + 16, su, o + 16);
    });
  }
  for (int r = 0; r < t.m; ++r)
    gate_act_16(t, tot + size_t(r) * 32, tot + size_t(r) * 32 + 16, t.act + size_t(r) * t.act_ld + j * kBlockN);
}

template <typename Add>
void down_segment(const DownTask& t, const void* const* b, int nb, int k0, int len, Add&& add) {
  float* c = t.scratch->c;
  const uint16_t* rows[kMaxRows];
  for (int r0 = 0; r0 < t.m; r0 += kMaxRows) {
    const int mr = tmin(kMaxRows, t.m - r0);
    for (int r = 0; r < mr; ++r) rows[r] = t.act + size_t(r0 + r) * t.act_ld + k0;
    if (nb == 2) dot_rows<2>(mr, rows, b, len, c);
    else dot_rows<1>(mr, rows, b, len, c);
    for (int r = 0; r < mr; ++r) add(c + r * 32, r0 + r);
  }
}

}  // namespace

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
