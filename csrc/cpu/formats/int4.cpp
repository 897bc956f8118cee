// wna16_int4: 4-bit integer experts with 16-bit group scales (and optional zero points).
//
// Compressed-tensors "pack-quantized" int4 experts as vLLM 0.26.0's
// CompressedTensorsWNA16MarlinMoEMethod / CompressedTensorsWNA16MoEMethod hold them after weight
// loading (before process_weights_after_loading). Facts this code relies on, and where they come from:
//  - compressed_tensors/compressors/pack_quantized/helpers.py (v0.17), pack_to_int32 (l. 20-88):
//    signed codes q in [-8, 7] (quantization/utils/helpers.py calculate_range l. 199-212: q_min = -2^(b-1),
//    q_max = 2^(b-1) - 1) are stored unsigned as u = q + 8 (l. 62-63: offset = 1 << (num_bits-1));
//    8 codes per int32 along the packed dim, code i of a word in bits 4i..4i+3, LSB first
//    (l. 82-83: bit_shifts = arange(pack_factor) * num_bits); unpack_from_int32 (l. 130-160)
//    masks with 0xF and subtracts 8. Weights are packed along dim 1 = K of the [N, K] weight
//    (pack_quantized/base.py l. 91, default packed_dim=1); asymmetric zero points [N, K/gs] are
//    packed the same way along dim 0 = N (base.py l. 96, packed_dim=0), also as zp + 8.
//  - Dequantization (quantization/lifecycle/forward_helpers.py _dequantize, l. 246-268):
//    w = (q - zp) * scale; in stored nibbles (u - z) * scale with z = zp + 8, so a symmetric
//    checkpoint (no zero point) has z = 8.
//  - vLLM creates the parameters K-first (compressed_tensors_moe_wna16.py l. 70-92 and
//    compressed_tensors_moe_wna16_marlin.py get_weight_shape l. 97-181, "Marlin" layouts):
//    w13_weight_packed int32 [E, H/8, 2I], w2_weight_packed int32 [E, I/8, H],
//    w13_weight_scale [E, H/gs, 2I], w2_weight_scale [E, I/gs, H] in params_dtype (bf16/fp16),
//    zero points (asymmetric only, marlin l. 324-354) int32 [E, H/gs, 2I/8], [E, I/gs, H/8];
//    group strategy requires gs | H and gs | I (l. 266-283); channel strategy: one group (gs = K).
//  - The loader transposes every checkpoint tensor of these methods (fused_moe/routed_experts.py
//    l. 623-635: is_transposed -> loaded_weight.t().contiguous()), so [N, K/8] -> [K/8, N] and zero points
//    [N/8, K/gs] -> [K/gs, N/8]; w1 fills N columns [0, I) and w3 [I, 2I) of w13 (gate, up).
// The engine repacks once into Int4Weights blocks (kernel_table.h): 4-bit codes (the same bytes
// count), 16-bit scales as given, 4-bit zero points: the checkpoint's bytes, ~1.0x.
#include <stdexcept>
#include <string>

#include "cpu/format.h"

namespace lk {
namespace {

// Engine segment: the largest of 256/128/64/32 dividing the group (a segment = whole quads and
// pair-rows, within one group); groups past 256 inputs (channel strategy) repeat their scale.
int seg_of(int gs) {
  for (int s = kMaxSeg; s >= kPadK; s /= 2)
    if (gs % s == 0) return s;
  return 0;
}

void configure(const WeightSource& src, MoEShape& sh, std::vector<float>&, std::vector<float>&) {
  const int hidden = sh.hidden, intermediate = sh.intermediate;
  const Int4Groups& g = src.as<Int4Groups>();
  if (g.gs1 <= 0 || g.gs2 <= 0 || hidden % g.gs1 || intermediate % g.gs2 || !seg_of(g.gs1) ||
      !seg_of(g.gs2))
    throw std::invalid_argument("int4 group sizes " + std::to_string(g.gs1) + " (over H=" + std::to_string(hidden) +
                                ") and " + std::to_string(g.gs2) + " (over I=" + std::to_string(intermediate) +
                                ") are not supported: each must divide its dimension and be a multiple of 32");
  sh.zero_points = g.z13 != nullptr;
  sh.fp16_scales = g.fp16_scale;
  sh.seg1 = seg_of(g.gs1);
  sh.seg2 = seg_of(g.gs2);
}

// H and I are multiples of 32 here, so kp1 = H and kp2 = I.
void allocate(const MoEShape& sh, NodeSlice& sl, int node) {
  const size_t b13 = size_t(sh.experts) * (sl.ib1 - sl.ib0) * 2, b2 = size_t(sh.experts) * (sl.hb1 - sl.hb0);
  const size_t p13 = b13 * (sh.kp1 / sh.seg1) * kBlockN, p2 = b2 * (sh.kp2 / sh.seg2) * kBlockN;
  sl.w13 = HostBuffer(b13 * sh.kp1 * kBlockN / 2, node);
  sl.w2 = HostBuffer(b2 * sh.kp2 * kBlockN / 2, node);
  sl.s13 = HostBuffer(p13 * 2, node);
  sl.s2 = HostBuffer(p2 * 2, node);
  if (sh.zero_points) {
    sl.z13 = HostBuffer(p13 / 2, node);  // 4-bit zero points
    sl.z2 = HostBuffer(p2 / 2, node);
  }
}

// Columns [col0, col0+16) of a K-first packed [K/8, N] int32 matrix -> one Int4Weights block.
// Columns at or past col_end (padding rows of a block) get the code 8 with zero point 8: weight 0.
void pack_int4(const int32_t* src, int n_cols, int col0, int col_end, int k, uint8_t* dst) {
  for (int k8 = 0; k8 < k / 8; ++k8) {
    const int32_t* row = src + size_t(k8) * n_cols + col0;
    uint8_t* d = dst + size_t(k8) * 64;  // octet k8: byte 4n + j = codes 8 k8 + j (low), 8 k8 + 4 + j (high)
    for (int n = 0; n < kBlockN; ++n) {
      const uint32_t w = col0 + n < col_end ? uint32_t(row[n]) : 0x88888888u;
      for (int j = 0; j < 4; ++j) d[4 * n + j] = uint8_t(((w >> (4 * j)) & 15u) | (((w >> (4 * (4 + j))) & 15u) << 4));
    }
  }
}

// Scales (and zero points) of columns [col0, col0+16) per engine segment of `seg` inputs (a
// divisor of the checkpoint group gs, so a segment lies in one group). Zero points: 8 bytes per
// segment, column n in nibble n%2 of byte n/2 (low nibble first).
void int4_params(const uint16_t* scale, const int32_t* zero, int n_cols, int nz, int col0, int col_end, int gs,
                 int seg, int nseg, uint16_t* sd, uint8_t* zd) {
  for (int q = 0; q < nseg; ++q) {
    const int g = q * seg / gs;
    for (int n = 0; n < kBlockN; ++n) {
      const int c = col0 + n;
      const bool in = c < col_end;
      sd[q * kBlockN + n] = in ? scale[size_t(g) * n_cols + c] : 0;
      if (zd) {
        const uint32_t z = in ? (uint32_t(zero[size_t(g) * nz + c / 8]) >> (4 * (c % 8))) & 15u : 8u;
        uint8_t& byte = zd[q * (kBlockN / 2) + n / 2];
        byte = uint8_t(n % 2 ? (byte & 0x0F) | (z << 4) : z);
      }
    }
  }
}

void repack13(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const Int4Groups& g = u.src.as<Int4Groups>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e;
  const int nseg1 = sh.kp1 / sh.seg1;
  const size_t bb1 = size_t(sh.kp1) * kBlockN / 2;  // block bytes
  const int32_t* w13 = static_cast<const int32_t*>(u.src.w13);
  const int g1 = H / g.gs1;    // checkpoint groups per row
  const int nz1 = (2 * I + 7) / 8;  // zero-point words per group row
  for (int h = 0; h < 2; ++h) {
    const int col0 = h * I + u.r0;
    const size_t b = u.blk + h;
    pack_int4(w13 + size_t(e) * (H / 8) * 2 * I, 2 * I, col0, I * (h + 1), H, u.sl.w13.as<uint8_t>() + b * bb1);
    int4_params(g.s13 + size_t(e) * g1 * 2 * I, g.z13 ? g.z13 + size_t(e) * g1 * nz1 : nullptr, 2 * I, nz1,
                col0, I * (h + 1), g.gs1, sh.seg1, nseg1, u.sl.s13.as<uint16_t>() + b * nseg1 * kBlockN,
                sh.zero_points ? u.sl.z13.as<uint8_t>() + b * nseg1 * kBlockN / 2 : nullptr);
  }
}

void repack2(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const Int4Groups& g = u.src.as<Int4Groups>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e;
  const int nseg2 = sh.kp2 / sh.seg2;
  const size_t bb2 = size_t(sh.kp2) * kBlockN / 2;
  const int32_t* w2 = static_cast<const int32_t*>(u.src.w2);
  const int g2 = I / g.gs2, nz2 = (H + 7) / 8;
  const size_t b = u.blk;
  pack_int4(w2 + size_t(e) * (I / 8) * H, H, u.r0, H, I, u.sl.w2.as<uint8_t>() + b * bb2);
  int4_params(g.s2 + size_t(e) * g2 * H, g.z2 ? g.z2 + size_t(e) * g2 * nz2 : nullptr, H, nz2, u.r0, H,
              g.gs2, sh.seg2, nseg2, u.sl.s2.as<uint16_t>() + b * nseg2 * kBlockN,
              sh.zero_points ? u.sl.z2.as<uint8_t>() + b * nseg2 * kBlockN / 2 : nullptr);
}

// Blocks from packed block b on of a projection's buffers (w codes, s scales, z zero points).
Int4Weights weights(const MoEShape& sh, const HostBuffer& w, const HostBuffer& s, const HostBuffer& z, size_t b,
                    int kp, int seg) {
  const size_t per = size_t(kp / seg) * kBlockN;  // scales (and zero-point nibbles) per block
  Int4Weights q;
  q.w = w.as<uint8_t>() + b * kp * kBlockN / 2;
  q.scale = s.as<uint16_t>() + b * per;
  q.zero = sh.zero_points ? z.as<uint8_t>() + b * per / 2 : nullptr;
  q.group = seg;
  q.fp16_scale = sh.fp16_scales;
  return q;
}

void gate_up_task(const TaskBlocks& w, GateUpTask& t) {
  t.w13 = nullptr;
  t.quant = weights(w.sh, w.sl.w13, w.sl.s13, w.sl.z13, w.b * 2, w.sh.kp1, w.sh.seg1);
}

void down_task(const TaskBlocks& w, DownTask& t) {
  t.w2 = nullptr;
  t.quant = weights(w.sh, w.sl.w2, w.sl.s2, w.sl.z2, w.b, w.sh.kp2, w.sh.seg2);
}

}  // namespace

const Format kWna16Int4Format = {
    .name = "wna16_int4", .family = Family::kInt4, .decode_wide = DecodeWide::kFourBit, .int8_act = true,
    .q15_decode = true, .configure = &configure, .allocate = &allocate, .repack13 = &repack13,
    .repack2 = &repack2, .gate_up_task = &gate_up_task, .down_task = &down_task};

}  // namespace lk
