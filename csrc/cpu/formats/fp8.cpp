// One-byte codes with fp32 scales, as vLLM holds them after weight loading:
// - fp8_block (Fp8MoEMethod, block quantization: DeepSeek-V3, Qwen3-FP8): w13_weight / w2_weight
//   float8_e4m3fn [E, 2I, H] / [E, H, I], w13_weight_scale_inv / w2_weight_scale_inv fp32 per (bn x bk)
//   block, [E, ceil(2I/bn), H/bk] / [E, ceil(H/bn), I/bk].
// - fp8_channel / int8_channel (compressed-tensors channel quantization, CT FP8 channel and CT W8A8
//   int8): the same codes (int8 for int8_channel), one fp32 scale per output row, [E, 2I(, 1)] / [E, H(, 1)].
// - mxfp8 (OCP MX FP8, ModelOpt MXFP8: MiniMax-M3's release): the fp8 codes with one e8m0 scale byte per output row
//   and 32 inputs, uint8 [E, 2I, ceil(H/32)] / [E, H, ceil(I/32)].
// Packed (Fp8Weights, kernel_table.h): the codes in the bf16 block layout, one byte per weight; scales
// per block [kp/seg] (fp8_block: the checkpoint's blocks repeated per 16 rows) or per row [16]; mxfp8's
// e8m0 bytes per block [kp/32][16] (the checkpoint's bytes).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cpu/format.h"

namespace lk {
namespace {

// Scales per packed block: one per row, or one per segment of the checkpoint's block width.
int scales_per_block(const MoEShape& sh, int kp, int seg) { return sh.format->per_row ? kBlockN : kp / seg; }

void configure_block(const WeightSource& src, MoEShape& sh, std::vector<float>&, std::vector<float>&) {
  // The segment loop needs whole scale blocks that are whole AMX/pair rows.
  const int hidden = sh.hidden, intermediate = sh.intermediate;
  const ByteScales& sc = src.as<ByteScales>();
  if (sc.bk % kPadK || sc.bk > kMaxSeg || hidden % sc.bk || intermediate % sc.bk || sc.bn % kBlockN)
    throw std::invalid_argument("fp8 block size " + std::to_string(sc.bn) + "x" + std::to_string(sc.bk) +
                                " does not fit H=" + std::to_string(hidden) + ", I=" + std::to_string(intermediate) +
                                " (need a block width that divides H and I, a multiple of 32 up to 256, "
                                "and a block height that is a multiple of 16)");
  sh.seg1 = sh.seg2 = sc.bk;
}

void configure_channel(const WeightSource& src, MoEShape& sh, std::vector<float>&, std::vector<float>&) {
  src.as<ByteScales>();  // the per-row scales are there
  int seg = kMaxSeg;  // dequantization chunk: the largest power of two <= 256 dividing both
  while (sh.kp1 % seg || sh.kp2 % seg) seg /= 2;
  sh.seg1 = sh.seg2 = seg;
}

void allocate(const MoEShape& sh, NodeSlice& sl, int node) {
  const size_t b13 = size_t(sh.experts) * (sl.ib1 - sl.ib0) * 2, b2 = size_t(sh.experts) * (sl.hb1 - sl.hb0);
  sl.w13 = HostBuffer(b13 * sh.kp1 * kBlockN, node);
  sl.w2 = HostBuffer(b2 * sh.kp2 * kBlockN, node);
  sl.s13 = HostBuffer(b13 * scales_per_block(sh, sh.kp1, sh.seg1) * 4, node);
  sl.s2 = HostBuffer(b2 * scales_per_block(sh, sh.kp2, sh.seg2) * 4, node);
}

char* row_buffer(const RepackUnit& u) {
  return static_cast<char*>(u.ctx.buffer(u.row_slot, size_t(16) * std::max(u.sh.kp1, u.sh.kp2) * 2));
}

void repack13(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const WeightSource& src = u.src;
  const ByteScales& sc = src.as<ByteScales>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, r0 = u.r0;
  char* row = row_buffer(u);
  char* dst = u.sl.w13.as<char>() + u.blk * sh.kp1 * kBlockN;
  const char* base = static_cast<const char*>(src.w13) + size_t(e) * 2 * I * H;
  pack_block(base, r0, I, H, sh.kp1, 1, src.type, u.kt, row, dst);                                      // gate
  pack_block(base + size_t(I) * H, r0, I, H, sh.kp1, 1, src.type, u.kt, row, dst + size_t(sh.kp1) * kBlockN);  // up
  // The scales of the gate and up blocks whose first row is r0 (row of the gate half of w13).
  if (sh.format->per_row) {
    float* sd = u.sl.s13.as<float>() + u.blk * kBlockN;
    const float* ss = sc.s13 + size_t(e) * 2 * I;
    for (int n = 0; n < kBlockN; ++n) {
      sd[n] = r0 + n < I ? ss[r0 + n] : 0.0f;
      sd[kBlockN + n] = r0 + n < I ? ss[I + r0 + n] : 0.0f;
    }
    return;
  }
  const int nseg = sh.kp1 / sh.seg1, srows = (2 * I + sc.bn - 1) / sc.bn;
  float* sd = u.sl.s13.as<float>() + u.blk * nseg;
  const float* ss = sc.s13 + size_t(e) * srows * nseg;
  for (int q = 0; q < nseg; ++q) {
    sd[q] = ss[size_t(r0 / sc.bn) * nseg + q];
    sd[nseg + q] = ss[size_t((I + r0) / sc.bn) * nseg + q];
  }
}

void repack2(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const WeightSource& src = u.src;
  const ByteScales& sc = src.as<ByteScales>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, r0 = u.r0;
  pack_block(static_cast<const char*>(src.w2) + size_t(e) * H * I, r0, H, I, sh.kp2, 1, src.type, u.kt, row_buffer(u),
             u.sl.w2.as<char>() + u.blk * sh.kp2 * kBlockN);
  if (sh.format->per_row) {
    float* sd = u.sl.s2.as<float>() + u.blk * kBlockN;
    for (int n = 0; n < kBlockN; ++n) sd[n] = r0 + n < H ? sc.s2[size_t(e) * H + r0 + n] : 0.0f;
    return;
  }
  const int nseg = sh.kp2 / sh.seg2, srows = (H + sc.bn - 1) / sc.bn;
  float* sd = u.sl.s2.as<float>() + u.blk * nseg;
  const float* ss = sc.s2 + size_t(e) * srows * nseg;
  for (int q = 0; q < nseg; ++q) sd[q] = ss[size_t(r0 / sc.bn) * nseg + q];
}

// mxfp8: segments of 32 inputs (the checkpoint's scale blocks; any H and I, the padded inputs zero codes).
constexpr int kMxSeg = 32;

void configure_mx(const WeightSource& src, MoEShape& sh, std::vector<float>&, std::vector<float>&) {
  src.as<E8m0Scales>();
  sh.seg1 = sh.seg2 = kMxSeg;
}

void allocate_mx(const MoEShape& sh, NodeSlice& sl, int node) {
  const size_t b13 = size_t(sh.experts) * (sl.ib1 - sl.ib0) * 2, b2 = size_t(sh.experts) * (sl.hb1 - sl.hb0);
  sl.w13 = HostBuffer(b13 * sh.kp1 * kBlockN, node);
  sl.w2 = HostBuffer(b2 * sh.kp2 * kBlockN, node);
  sl.s13 = HostBuffer(b13 * (sh.kp1 / kMxSeg) * kBlockN, node);
  sl.s2 = HostBuffer(b2 * (sh.kp2 / kMxSeg) * kBlockN, node);
}

// Rows [r0, r0 + 16) of a [rows, ceil(k/32)] e8m0 matrix -> one block's [kp/32][16] bytes (past the rows or the
// columns: 127, a scale of one over zero codes).
void pack_mx_scales(const uint8_t* src, int r0, int rows, int k, int kp, uint8_t* dst) {
  const int cols = (k + kMxSeg - 1) / kMxSeg;
  for (int q = 0; q < kp / kMxSeg; ++q)
    for (int n = 0; n < kBlockN; ++n)
      dst[size_t(q) * kBlockN + n] = r0 + n < rows && q < cols ? src[size_t(r0 + n) * cols + q] : 127;
}

void repack13_mx(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const E8m0Scales& sc = u.src.as<E8m0Scales>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, r0 = u.r0, cols = (H + kMxSeg - 1) / kMxSeg;
  char* row = row_buffer(u);
  char* dst = u.sl.w13.as<char>() + u.blk * sh.kp1 * kBlockN;
  const char* base = static_cast<const char*>(u.src.w13) + size_t(e) * 2 * I * H;
  pack_block(base, r0, I, H, sh.kp1, 1, u.src.type, u.kt, row, dst);                                      // gate
  pack_block(base + size_t(I) * H, r0, I, H, sh.kp1, 1, u.src.type, u.kt, row, dst + size_t(sh.kp1) * kBlockN);  // up
  const size_t per = size_t(sh.kp1 / kMxSeg) * kBlockN;
  uint8_t* sd = u.sl.s13.as<uint8_t>() + u.blk * per;
  const uint8_t* ss = sc.s13 + size_t(e) * 2 * I * cols;
  pack_mx_scales(ss, r0, I, H, sh.kp1, sd);
  pack_mx_scales(ss + size_t(I) * cols, r0, I, H, sh.kp1, sd + per);
}

void repack2_mx(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const E8m0Scales& sc = u.src.as<E8m0Scales>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, r0 = u.r0, cols = (I + kMxSeg - 1) / kMxSeg;
  pack_block(static_cast<const char*>(u.src.w2) + size_t(e) * H * I, r0, H, I, sh.kp2, 1, u.src.type, u.kt,
             row_buffer(u), u.sl.w2.as<char>() + u.blk * sh.kp2 * kBlockN);
  const size_t per = size_t(sh.kp2 / kMxSeg) * kBlockN;
  pack_mx_scales(sc.s2 + size_t(e) * H * cols, r0, H, I, sh.kp2, u.sl.s2.as<uint8_t>() + u.blk * per);
}

Fp8Weights weights(const MoEShape& sh, const uint8_t* codes, const float* scales, int seg) {
  Fp8Weights q;
  q.w = codes;
  q.scale = scales;
  q.seg = seg;
  q.per_row = sh.format->per_row;
  q.int8 = sh.format->int8_codes;
  return q;
}

Fp8Weights mx_weights(const uint8_t* codes, const uint8_t* scales) {
  Fp8Weights q;
  q.w = codes;
  q.mx_scale = scales;
  q.seg = kMxSeg;
  return q;
}

void gate_up_task_mx(const TaskBlocks& w, GateUpTask& t) {
  const MoEShape& sh = w.sh;
  t.w13 = nullptr;
  t.quant = mx_weights(w.sl.w13.as<uint8_t>() + w.b * 2 * sh.kp1 * kBlockN,
                       w.sl.s13.as<uint8_t>() + w.b * 2 * (sh.kp1 / kMxSeg) * kBlockN);
}

void down_task_mx(const TaskBlocks& w, DownTask& t) {
  const MoEShape& sh = w.sh;
  t.w2 = nullptr;
  t.quant = mx_weights(w.sl.w2.as<uint8_t>() + w.b * sh.kp2 * kBlockN,
                       w.sl.s2.as<uint8_t>() + w.b * (sh.kp2 / kMxSeg) * kBlockN);
}

void gate_up_task(const TaskBlocks& w, GateUpTask& t) {
  const MoEShape& sh = w.sh;
  t.w13 = nullptr;
  t.quant = weights(sh, w.sl.w13.as<uint8_t>() + w.b * 2 * sh.kp1 * kBlockN,
                    w.sl.s13.as<float>() + w.b * 2 * scales_per_block(sh, sh.kp1, sh.seg1), sh.seg1);
}

void down_task(const TaskBlocks& w, DownTask& t) {
  const MoEShape& sh = w.sh;
  t.w2 = nullptr;
  t.quant = weights(sh, w.sl.w2.as<uint8_t>() + w.b * sh.kp2 * kBlockN,
                    w.sl.s2.as<float>() + w.b * scales_per_block(sh, sh.kp2, sh.seg2), sh.seg2);
}

}  // namespace

const Format kFp8BlockFormat = {
    .name = "fp8_block", .family = Family::kByteCodes, .decode_wide = DecodeWide::kQuantized,
    .configure = &configure_block, .allocate = &allocate, .repack13 = &repack13, .repack2 = &repack2,
    .gate_up_task = &gate_up_task, .down_task = &down_task};
const Format kFp8ChannelFormat = {
    .name = "fp8_channel", .family = Family::kByteCodes, .per_row = true, .decode_wide = DecodeWide::kQuantized,
    .configure = &configure_channel, .allocate = &allocate, .repack13 = &repack13, .repack2 = &repack2,
    .gate_up_task = &gate_up_task, .down_task = &down_task};
const Format kInt8ChannelFormat = {
    .name = "int8_channel", .family = Family::kByteCodes, .int8_codes = true, .per_row = true,
    .decode_wide = DecodeWide::kQuantized, .int8_act = true, .configure = &configure_channel, .allocate = &allocate,
    .repack13 = &repack13, .repack2 = &repack2, .gate_up_task = &gate_up_task, .down_task = &down_task};

// The kernels take mxfp8 blocks segment by segment (kernels/fp8.cpp gate_up_mx / down_mx).
const Format kMxfp8Format = {
    .name = "mxfp8", .family = Family::kByteCodes, .mx = true, .decode_wide = DecodeWide::kQuantized,
    .configure = &configure_mx, .allocate = &allocate_mx, .repack13 = &repack13_mx, .repack2 = &repack2_mx,
    .gate_up_task = &gate_up_task_mx, .down_task = &down_task_mx};

}  // namespace lk
