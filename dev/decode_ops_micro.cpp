// What the building blocks of the 4-bit decode tile (csrc/cpu/kernels/fp4.cpp, dot_tile_fp4) cost on
// this CPU, in core cycles, on L1-resident data (a diagnostic, not a test; needs AVX512-BF16):
//   g++ -O2 -march=native -o /tmp/decode_ops_micro dev/decode_ops_micro.cpp && /tmp/decode_ops_micro
// Every variant runs the M = 1, two-block quad loop of the tile over the same 16 KiB of codes; the
// variants take turns for several rounds (a shared machine drifts) and the medians are printed.
// Cycles come from a calibration loop of dependent scalar adds (1 cycle each).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kQuads = 256;         // quads per block: 8 KiB of codes per block, two blocks
constexpr int kPasses = 20000;      // passes over the blocks per timing
alignas(64) uint8_t g_codes[2][kQuads * 32];
alignas(64) uint16_t g_words[3][2][kQuads * 64];  // pre-converted bf16 pair-rows: fp4 values, 128 + u, normals
alignas(64) uint16_t g_act[kQuads * 4];
alignas(64) uint16_t g_lut[32];
volatile float g_sink;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ns per cycle: a chain of dependent adds, one cycle each
double ns_per_cycle() {
  const double t0 = now_s();
  uint64_t x = 1;
  for (long i = 0; i < 400000000L; ++i) asm volatile("add $1, %0" : "+r"(x));
  return (now_s() - t0) * 1e9 / 400000000.0;
}

inline __m512i bcast(const uint16_t* a) {
  int32_t v;
  memcpy(&v, a, 4);
  return _mm512_set1_epi32(v);
}

// The tile's loop: codes -> bf16 by vpermw, vdpbf16ps into S chains per block (the kernel: S = 4);
// PF: with the kernel's prefetches (per two quads and block: T0 3 KiB ahead, T1 8 KiB ahead).
template <int S, bool PF = false>
float full() {
  const __m512i lut = _mm512_loadu_si512(g_lut);
  __m512 acc[S][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_ps();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {  // chain index from the in-group quad: constants once unrolled
      const int q = g + qq;
      const __m512i a01 = bcast(g_act + 4 * q), a23 = bcast(g_act + 4 * q + 2);
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        if (PF && (qq & 1) == 0) {
          _mm_prefetch((const char*)(g_codes[j] + (q + 96) * 32), _MM_HINT_T0);
          _mm_prefetch((const char*)(g_codes[j] + q * 32 + 8192), _MM_HINT_T1);
        }
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(g_codes[j] + q * 32)));
        const __m512i wl = _mm512_permutexvar_epi16(v, lut), wh = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
        acc[(2 * qq) % S][j] = _mm512_dpbf16_ps(acc[(2 * qq) % S][j], (__m512bh)a01, (__m512bh)wl);
        acc[(2 * qq + 1) % S][j] = _mm512_dpbf16_ps(acc[(2 * qq + 1) % S][j], (__m512bh)a23, (__m512bh)wh);
      }
    }
  __m512 s = _mm512_setzero_ps();
  for (auto& c : acc) s = _mm512_add_ps(s, _mm512_add_ps(c[0], c[1]));
  return _mm512_reduce_add_ps(s);
}

// The conversion alone (vpermw results folded with xor, no dot products).
float convert_only() {
  const __m512i lut = _mm512_loadu_si512(g_lut);
  __m512i x[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {
      const int q = g + qq;
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(g_codes[j] + q * 32)));
        x[j] = _mm512_ternarylogic_epi32(x[j], _mm512_permutexvar_epi16(v, lut),
                                         _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut), 0x96);
      }
    }
  return float(_mm512_reduce_add_epi32(_mm512_xor_si512(x[0], x[1])));
}

// The dot products alone on pre-converted bf16 weights (set w: 0 fp4 values, 1 128 + u, 2 normals).
template <int S>
float dots_only(int w) {
  __m512 acc[S][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_ps();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {  // chain index from the in-group quad: constants once unrolled
      const int q = g + qq;
      const __m512i a01 = bcast(g_act + 4 * q), a23 = bcast(g_act + 4 * q + 2);
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i wl = _mm512_load_si512(g_words[w][j] + q * 64), wh = _mm512_load_si512(g_words[w][j] + q * 64 + 32);
        acc[(2 * qq) % S][j] = _mm512_dpbf16_ps(acc[(2 * qq) % S][j], (__m512bh)a01, (__m512bh)wl);
        acc[(2 * qq + 1) % S][j] = _mm512_dpbf16_ps(acc[(2 * qq + 1) % S][j], (__m512bh)a23, (__m512bh)wh);
      }
    }
  __m512 s = _mm512_setzero_ps();
  for (auto& c : acc) s = _mm512_add_ps(s, _mm512_add_ps(c[0], c[1]));
  return _mm512_reduce_add_ps(s);
}

// The same products in fp32: each bf16 word pair split into two fp32 vectors, two vfmadd231ps.
template <int S>
float fma_fp32() {
  const __m512i lut = _mm512_loadu_si512(g_lut);
  const __m512i hi = _mm512_set1_epi32(int32_t(0xffff0000u));
  __m512 acc[S][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_ps();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {  // chain index from the in-group quad: constants once unrolled
      const int q = g + qq;
      const __m512i a01 = bcast(g_act + 4 * q), a23 = bcast(g_act + 4 * q + 2);
      const __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(a01, 16)), a1 = _mm512_castsi512_ps(_mm512_and_si512(a01, hi));
      const __m512 a2 = _mm512_castsi512_ps(_mm512_slli_epi32(a23, 16)), a3 = _mm512_castsi512_ps(_mm512_and_si512(a23, hi));
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(g_codes[j] + q * 32)));
        const __m512i wl = _mm512_permutexvar_epi16(v, lut), wh = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
        __m512& c0 = acc[(2 * qq) % S][j];
        __m512& c1 = acc[(2 * qq + 1) % S][j];
        c0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wl, 16)), a0, c0);
        c0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wl, hi)), a1, c0);
        c1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wh, 16)), a2, c1);
        c1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wh, hi)), a3, c1);
      }
    }
  __m512 s = _mm512_setzero_ps();
  for (auto& c : acc) s = _mm512_add_ps(s, _mm512_add_ps(c[0], c[1]));
  return _mm512_reduce_add_ps(s);
}

// The int8-activation decode (LK_INT8_ACT=1): codes -> unsigned bytes 12 + 2 e2m1 (vpmovzxwd,
// vpternlogd, vpshufb), vpdpbusd with broadcast int8 activations, 2 chains per block.
float int8_act() {
  __m512i lut;
  {
    alignas(64) uint8_t t[64];
    const int mag2[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    for (int i = 0; i < 64; ++i) t[i] = uint8_t(12 + (i & 8 ? -mag2[i & 7] : mag2[i & 7]));
    lut = _mm512_load_si512(t);
  }
  __m512i acc[2][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_si512();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {  // chain index from the in-group quad: constants once unrolled
      const int q = g + qq;
      int32_t x;
      memcpy(&x, g_act + 2 * q, 4);
      const __m512i av = _mm512_set1_epi32(x);
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i*)(g_codes[j] + q * 32)));
        const __m512i nib = _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi8(0x0F), 0xA8);
        acc[qq % 2][j] = _mm512_dpbusd_epi32(acc[qq % 2][j], _mm512_shuffle_epi8(lut, nib), av);
      }
    }
  __m512i s = _mm512_setzero_si512();
  for (auto& c : acc) s = _mm512_add_epi32(s, _mm512_add_epi32(c[0], c[1]));
  return float(_mm512_reduce_add_epi32(s));
}

// int16 activations (exact for the group's top 2^7 range): codes -> int16 2 e2m1 by vpermw, then
// vpdpwssd with broadcast int16 activation pairs, S chains per block (1 dot = 1 vpdpwssd).
template <int S>
float int16_act() {
  alignas(64) int16_t t[32];
  const int mag2[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  for (int i = 0; i < 32; ++i) t[i] = int16_t(i & 8 ? -mag2[i & 7] : mag2[i & 7]);
  const __m512i lut = _mm512_load_si512(t);
  __m512i acc[S][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_si512();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 8
      for (int qq = 0; qq < 8; ++qq) {
      const int q = g + qq;
      const __m512i a01 = bcast(g_act + 4 * q), a23 = bcast(g_act + 4 * q + 2);
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(g_codes[j] + q * 32)));
        const __m512i wl = _mm512_permutexvar_epi16(v, lut), wh = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
        acc[(2 * qq) % S][j] = _mm512_dpwssd_epi32(acc[(2 * qq) % S][j], a01, wl);
        acc[(2 * qq + 1) % S][j] = _mm512_dpwssd_epi32(acc[(2 * qq + 1) % S][j], a23, wh);
      }
    }
  __m512i s = _mm512_setzero_si512();
  for (auto& c : acc) s = _mm512_add_epi32(s, _mm512_add_epi32(c[0], c[1]));
  return float(_mm512_reduce_add_epi32(s));
}

// The same with a 64-byte load per two quads viewed as words (a layout whose word w holds the four
// nibbles of one (row, input parity) for four pair-rows): 3 shifts + 4 vpermw, no vpmovzxbw.
template <int S>
float int16_act_words() {
  alignas(64) int16_t t[32];
  const int mag2[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  for (int i = 0; i < 32; ++i) t[i] = int16_t(i & 8 ? -mag2[i & 7] : mag2[i & 7]);
  const __m512i lut = _mm512_load_si512(t);
  __m512i acc[S][2];
  for (auto& c : acc) c[0] = c[1] = _mm512_setzero_si512();
  for (int pass = 0; pass < kPasses; ++pass)
    for (int g = 0; g < kQuads; g += 8)
#pragma GCC unroll 4
      for (int oo = 0; oo < 8; oo += 2) {  // two quads (one octet of inputs) per 64-byte load
      const int q = g + oo;
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_load_si512((const void*)(g_codes[j] + q * 32));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m512i w = _mm512_permutexvar_epi16(k ? _mm512_srli_epi16(v, 4 * k) : v, lut);
          acc[(oo + k) % S][j] = _mm512_dpwssd_epi32(acc[(oo + k) % S][j], bcast(g_act + 4 * q + 2 * k), w);
        }
      }
    }
  __m512i s = _mm512_setzero_si512();
  for (auto& c : acc) s = _mm512_add_epi32(s, _mm512_add_epi32(c[0], c[1]));
  return float(_mm512_reduce_add_epi32(s));
}

uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const uint16_t mag[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
  for (int i = 0; i < 32; ++i) g_lut[i] = uint16_t(mag[i & 7] | (i & 8 ? 0x8000 : 0));
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < kQuads * 32; ++i) g_codes[j][i] = uint8_t(rng());
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < kQuads * 64; ++i) {
      g_words[0][j][i] = g_lut[rng() & 15];
      g_words[1][j][i] = uint16_t(0x4300 | (rng() & 15));
      g_words[2][j][i] = bf16(nd(rng));
    }
  for (auto& a : g_act) a = bf16(nd(rng));
  const double ns_cycle = ns_per_cycle();
  std::printf("# core clock ~%.2f GHz (dependent adds)\n", 1.0 / ns_cycle);
  struct Variant {
    std::string name;
    std::function<float()> fn;
  };
  const std::vector<Variant> variants = {
      {"tile as in the kernel (vpermw + vdpbf16ps, 4 chains per block)", full<4>},
      {"same, 8 chains per block", full<8>},
      {"same with the kernel's prefetch instructions", full<4, true>},
      {"same, 2 chains per block", full<2>},
      {"conversion only (vpmovzxbw + 2 vpermw + vpsrlw)", convert_only},
      {"vdpbf16ps only, 4 chains, fp4 values", [] { return dots_only<4>(0); }},
      {"vdpbf16ps only, 4 chains, 128 + u values", [] { return dots_only<4>(1); }},
      {"vdpbf16ps only, 4 chains, normal values", [] { return dots_only<4>(2); }},
      {"vdpbf16ps only, 8 chains, fp4 values", [] { return dots_only<8>(0); }},
      {"vdpbf16ps only, 16 chains, fp4 values", [] { return dots_only<16>(0); }},
      {"conversion + fp32 vfmadd231ps split (4 chains)", fma_fp32<4>},
      {"conversion + fp32 vfmadd231ps split (8 chains)", fma_fp32<8>},
      {"int8 activations: vpshufb codes + vpdpbusd (1 dot = 1 vpdpbusd)", int8_act},
      {"int16 activations: vpermw int16 codes + vpdpwssd (4 chains)", int16_act<4>},
      {"int16 activations, 64-byte word loads, no vpmovzxbw (4 chains)", int16_act_words<4>},
  };
  constexpr int kRounds = 7;
  std::vector<std::vector<double>> t(variants.size());
  for (int r = 0; r < kRounds; ++r)
    for (size_t v = 0; v < variants.size(); ++v) {
      const double t0 = now_s();
      g_sink = variants[v].fn();
      t[v].push_back(now_s() - t0);
    }
  const double quads = double(kPasses) * kQuads;  // one quad of both blocks: 64 bytes of codes, 4 dot products
  std::printf("%-66s %12s %12s %14s\n", "variant (median of 7 rounds)", "cycles/quad", "cycles/dot", "GB/s of codes");
  for (size_t v = 0; v < variants.size(); ++v) {
    std::sort(t[v].begin(), t[v].end());
    const double s = t[v][kRounds / 2];
    const double cyc = s * 1e9 / ns_cycle / quads;
    std::printf("%-66s %12.2f %12.2f %14.1f\n", variants[v].name.c_str(), cyc, cyc / 4, quads * 64 / s / 1e9);
  }
  return 0;
}
