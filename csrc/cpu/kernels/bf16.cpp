// bf16 / fp16 experts (converted to bf16 once at load): the vector tiles, and the AMX tiles on the
// amx tier once an expert has kAmxMinRows tokens.
#include "cpu/kernels/kernels.h"
#include "cpu/kernels/panels.h"

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {
namespace {

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
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
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

}  // namespace

#if defined(LK_AMX)
void gate_up_bf16(const GateUpTask& t) {
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
        gate_act_16(t, c + r * 32, c + r * 32 + 16, t.act + size_t(r0 + r) * t.act_ld + j * kBlockN);
    }
  }
  _tile_release();
}

void down_bf16(const DownTask& t) {
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
void gate_up_bf16(const GateUpTask& t) { gate_up_vec(t); }
void down_bf16(const DownTask& t) { down_vec(t); }
#endif

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
