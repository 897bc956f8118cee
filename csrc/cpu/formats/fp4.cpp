// 4-bit float experts: mxfp4 (OCP microscaling, gpt-oss) and nvfp4 (ModelOpt), packed alike
// (Fp4Weights, kernel_table.h) with their own scales.
//
// mxfp4: OCP MX FP4 experts as vLLM 0.26.0's GptOssMxfp4MoEMethod / Mxfp4MoEMethod
// hold them after loading (before process_weights_after_loading). Facts relied on (paths under vllm/):
//  - model_executor/layers/quantization/mxfp4.py create_weights l. 183-275: w13_weight uint8
//    [E, 2I, H/2] (l. 203-212), w13_weight_scale uint8 [E, 2I, H/32] (l. 215-224, mxfp4_block = 32
//    l. 195), w2_weight uint8 [E, H, I/2] (l. 229-238), w2_weight_scale uint8 [E, H, I/32] (l. 241-250),
//    w13_bias bf16 [E, 2I] and w2_bias bf16 [E, H] when the model has biases (l. 253-274). All are
//    torch.zeros, so padding rows/columns are zero. H and I there are the rounded-up sizes
//    (maybe_roundup_sizes l. 166-181 -> fused_moe/oracle/mxfp4.py l. 635-673: multiples of 32, 64,
//    128 or 256 by backend), so the engine takes the real H and I from the caller and reads only them.
//  - Nibble order: element 2i of a row is the low nibble of byte i, element 2i + 1 the high nibble
//    (model_executor/layers/quantization/utils/nvfp4_emulation_utils.py break_fp4_bytes l. 316-333:
//    l. 321-324 high = (a & 0xF0) >> 4, low = a & 0x0F, stack((low, high))); e2m1 code: bit 3 sign
//    (l. 326), bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6} (l. 20-21 kE2M1ToFloat, l. 327-331).
//  - e8m0 scale byte s = 2^(s - 127) (model_executor/layers/quantization/utils/mxfp8_utils.py l. 222:
//    exp2(scales - 127)); 0xFF is NaN in the OCP MX spec (the engine maps it to NaN).
//  - gpt-oss w13 rows are interleaved: row 2j = gate_j, row 2j + 1 = up_j (models/gpt_oss.py: TP
//    narrows w13 rows and w13_bias as [2 * tp_rank_start, 2 * tp_rank_end) l. 472 and 514; the
//    activation reads gate = x[..., ::2], up = x[..., 1::2], model_executor/layers/activation.py l. 453).
//  - swigluoai (activation.py SwigluOAIAndMul l. 445-464, alpha = 1.702, limit = 7.0):
//    gate = min(gate, limit), up = clamp(up, -limit, limit), out = (up + 1) * gate * sigmoid(alpha * gate).
//  - Biases: the fused MoE kernel adds the bias to the GEMM result, then multiplies by the router
//    weight (fused_moe/fused_moe.py l. 559-567), so out = sum_k w_k (w2_e act + b2_e), and
//    act = swigluoai(w13_e x + b13_e). models/gpt_oss.py l. 533-536 zeroes w2_bias on TP ranks != 0.
// The engine repacks once into Fp4Weights blocks (kernel_table.h), de-interleaving gate/up rows and
// dropping vLLM's padding: 4-bit codes and 1-byte scales as given, biases bf16: <= the checkpoint's bytes.
//
// nvfp4: ModelOpt NVFP4 experts as vLLM 0.26.0's ModelOptNvFp4FusedMoE holds them after
// weight loading, before process_weights_after_loading (model_executor/layers/quantization/modelopt.py
// create_weights l. 1441-1555; the loader is fused_moe/routed_experts.py weight_loader). Facts relied on:
//  - w13_weight uint8 [E, 2I, H/2] (l. 1461-1474), rows [gate (w1); up (w3)] (routed_experts.py _load_w13
//    l. 483-489: w1 into rows [0, I), w3 into [I, 2I)); w2_weight uint8 [E, H, I/2] (l. 1476-1488).
//    Two e2m1 codes per byte along the input dimension, element 2i in the low nibble of byte i, 2i + 1 in
//    the high one (quantization/utils/nvfp4_emulation_utils.py break_fp4_bytes l. 316-333: l. 321-324
//    high = (a & 0xF0) >> 4, low = a & 0x0F, stack((low, high))); code bit 3 = sign, bits 0-2 index
//    {0, 0.5, 1, 1.5, 2, 3, 4, 6} (same file l. 20-21, 325-331).
//  - w13_weight_scale float8_e4m3fn [E, 2I, H/16], w2_weight_scale float8_e4m3fn [E, H, I/16] (l. 1490-1516,
//    group_size 16 = ModelOptNvFp4Config default, l. 1026 / 1089-1090): one block scale per row and 16
//    consecutive inputs, in the same row order as the codes. 0x7F / 0xFF are NaN (e4m3fn).
//  - w13_weight_scale_2 float32 [E, 2] (l. 1522-1526: [E, w13_num_shards], 2 for gated experts), filled
//    per shard: [e][0] = gate_proj.weight_scale_2, [e][1] = up_proj.weight_scale_2 (routed_experts.py
//    _load_per_tensor_weight_scale l. 290-306, reached from the ModelOpt branch l. 744-775);
//    w2_weight_scale_2 float32 [E] (l. 1528-1532). vLLM's own GPU kernels keep only [:, 0] for w13
//    (process_weights_after_loading l. 1557-1570, with a warning when they differ); the engine uses each
//    shard's own scale, which is what the checkpoint says.
//  - Dequantized weight = e2m1(code) * float(fp8 block scale) * weight_scale_2: ModelOpt stores the
//    per-tensor global scale as amax / (6 * 448), not its reciprocal (modelopt.py l. 1253-1262, the W4A16
//    method's note; nvfp4_emulation_utils.py dequantize_to_dtype l. 391-397: out = code * (fp8 scale *
//    global_scale); fused_moe/experts/nvfp4_emulation_moe.py l. 98-99 the same for MoE).
//  - w13_input_scale float32 [E', 2] and w2_input_scale float32 [E'] (l. 1541-1555; E' = E, or the global
//    expert count on FlashInfer backends) are the activation scales of W4A4 kernels. The engine computes
//    W4A16-style (bf16 activations, fp32 sums) like vLLM's Marlin NVFP4 MoE backend, which drops them too;
//    they are accepted (checked for dtype and shape) and ignored.
//  - No padding (the method keeps FusedMoEMethodBase.maybe_roundup_sizes), no biases; H and I must be
//    multiples of 16. Non-gated experts (w13_num_shards = 1) are refused.
// Repacked into the Fp4Weights blocks with one fp8 byte per (row, 16 inputs): the checkpoint's bytes,
// plus 12 bytes of global scales per expert (H, I not multiples of 32 pad one zero group per row).
// Kernels (kernels/fp4.cpp, shared with mxfp4): decode (<= 4 rows per expert, AVX-512
// tiers) converts codes to bf16 in registers through the 16-entry vpermw table, accumulates each
// 16-input group in fp32 (vdpbf16ps, or the exact even/odd fp32 split on plain AVX-512) with 2 chains
// per (row, block) at one row, then multiplies the group's 16 fp8 scales (converted in registers:
// magnitude << 20 times 2^120, NaN kept) into the total; prefill and the generic/avx2 tiers dequantize
// code x fp8 scale into bf16 per 256-input segment (exact, see fp4_dequant_seg_t) and run the bf16
// tiles. The global scale multiplies the fp32 sums: gate/up before the activation, w2 folded into the
// router weight. Measured (2-core Zen4 VM, avx512_bf16, 2 threads, benchmarks/moe_layer.py --format
// nvfp4 --shapes qwen3-30b-a3b: E=128, K=8, H=2048, I=768, 4 packed copies rotated; read bandwidth of
// that run 41.9 GB/s): M=1 0.765 ms = 27.7 GB/s of NVFP4 bytes = 0.66 of read; M=4 2.81 ms (0.66);
// M=16 7.14 ms (0.73); prefill M=256 59.8 ms (0.32 TFLOP/s); nbytes / checkpoint bytes 1.0000
// (docs/results/2026-11-30_epyc2c_nvfp4_moe_layer.log). Chains at one row: 2 measured better than 4 on
// LLC-resident experts (49 vs 34-42 GB/s, the VM is noisy); DRAM-bound runs could not tell them apart.
#include <stdexcept>
#include <string>

#include "cpu/format.h"

namespace lk {
namespace {

int group_of(const MoEShape& sh) { return sh.format->nv ? 16 : 32; }  // inputs per scale

void configure(const WeightSource& src, MoEShape& sh, std::vector<float>& gs13, std::vector<float>& gs2) {
  const Fp4Blocks& f = src.as<Fp4Blocks>();
  sh.seg1 = sh.seg2 = group_of(sh);
  sh.bias = f.b13 || f.b2;
  if (!sh.format->nv) return;
  // per-expert global scales: gate and up of w13 ([E][2]), w2 ([E])
  if (!f.g13 || !f.g2) throw std::invalid_argument("nvfp4 needs the global scales of w13 and w2");
  if (sh.hidden % 16 || sh.intermediate % 16)
    throw std::invalid_argument("nvfp4 needs H and I to be multiples of 16 (one scale per 16 inputs), got H=" +
                                std::to_string(sh.hidden) + ", I=" + std::to_string(sh.intermediate));
  gs13.assign(f.g13, f.g13 + size_t(sh.experts) * 2);
  gs2.assign(f.g2, f.g2 + size_t(sh.experts));
}

// 4-bit codes, one scale byte per (row, 32 inputs: e8m0 / nvfp4: 16 inputs, fp8), bf16 biases.
void allocate(const MoEShape& sh, NodeSlice& sl, int node) {
  const int grp = group_of(sh);
  const size_t b13 = size_t(sh.experts) * (sl.ib1 - sl.ib0) * 2, b2 = size_t(sh.experts) * (sl.hb1 - sl.hb0);
  sl.w13 = HostBuffer(b13 * sh.kp1 * kBlockN / 2, node);
  sl.w2 = HostBuffer(b2 * sh.kp2 * kBlockN / 2, node);
  sl.s13 = HostBuffer(b13 * (sh.kp1 / grp) * kBlockN, node);
  sl.s2 = HostBuffer(b2 * (sh.kp2 / grp) * kBlockN, node);
  if (sh.bias) {
    sl.b13 = HostBuffer(b13 * kBlockN * 2, node);
    sl.b2 = HostBuffer(b2 * kBlockN * 2, node);
  }
}

// 16 checkpoint rows (rows[n] < 0: padding row, weight 0) of a uint8 [rows, c] matrix of e2m1
// nibble pairs (element 2i low nibble of byte i) -> one Fp4Weights block of kp inputs; inputs at or
// past k get the code 0 (+0.0). Scales [rows, cs] (one per grp inputs: e8m0 for 32, fp8 e4m3fn for
// 16) -> [kp/grp][16]; groups past the checkpoint's and padding rows get `one` (1.0).
// An e8m0 byte 0 (2^-127, what quantizers write for an all-zero block) is an fp32 subnormal: every product
// with it costs a microcode assist on Intel cores (session 27: 4.3x slower decode with all scales at byte 0). Such
// a group becomes codes 0 with scale 1.0: exact for an all-zero block, and at most 6 x 2^-127 per weight otherwise.
void pack_fp4(const uint8_t* src, int c, const uint8_t* scale, int cs, const int* rows, int k, int kp, int grp,
              uint8_t one, bool e8m0, uint8_t* dst, uint8_t* sd) {
  for (int n = 0; n < kBlockN; ++n) {
    const uint8_t* row = rows[n] >= 0 ? src + size_t(rows[n]) * c : nullptr;
    for (int q = 0; q < kp / 4; ++q) {
      uint8_t b0 = 0, b1 = 0;  // source bytes 2q (elements 4q, 4q+1) and 2q+1 (4q+2, 4q+3)
      if (row) {
        if (4 * q + 3 < k) {
          b0 = row[2 * q];
          b1 = row[2 * q + 1];
        } else {
          auto code = [&](int kk) { return kk < k ? (row[kk / 2] >> (4 * (kk & 1))) & 15 : 0; };
          b0 = uint8_t(code(4 * q) | (code(4 * q + 1) << 4));
          b1 = uint8_t(code(4 * q + 2) | (code(4 * q + 3) << 4));
        }
      }
      dst[size_t(q) * 32 + 2 * n] = uint8_t((b0 & 15) | (b1 << 4));
      dst[size_t(q) * 32 + 2 * n + 1] = uint8_t((b0 >> 4) | (b1 & 0xF0));
    }
    for (int g = 0; g < kp / grp; ++g) {
      uint8_t sb = row && g < cs ? scale[size_t(rows[n]) * cs + g] : one;
      if (e8m0 && sb == 0) {
        for (int q = g * grp / 4; q < (g + 1) * grp / 4; ++q) {
          dst[size_t(q) * 32 + 2 * n] = 0;
          dst[size_t(q) * 32 + 2 * n + 1] = 0;
        }
        sb = one;
      }
      sd[g * kBlockN + n] = sb;
    }
  }
}

uint8_t scale_one(const MoEShape& sh) { return sh.format->nv ? 0x38 : 127; }  // 1.0 (fp8 e4m3fn / e8m0)

void repack13(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const Fp4Blocks& f = u.src.as<Fp4Blocks>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, grp = group_of(sh);
  const int ng1 = sh.kp1 / grp;
  const size_t bb1 = size_t(sh.kp1) * kBlockN / 2;  // block bytes
  const uint8_t* w13 = static_cast<const uint8_t*>(u.src.w13);
  const int half = f.r13 / 2;
  for (int h = 0; h < 2; ++h) {
    int rows[kBlockN];  // checkpoint row of each block row (-1: padding)
    for (int n = 0; n < kBlockN; ++n) {
      const int i = u.r0 + n;
      rows[n] = i >= I ? -1 : f.interleaved ? 2 * i + h : h * half + i;
    }
    const size_t b = u.blk + h;
    pack_fp4(w13 + size_t(e) * f.r13 * f.c13, f.c13, f.s13 + size_t(e) * f.r13 * f.cs13, f.cs13, rows, H,
             sh.kp1, grp, scale_one(sh), !sh.format->nv, u.sl.w13.as<uint8_t>() + b * bb1,
             u.sl.s13.as<uint8_t>() + b * ng1 * kBlockN);
    if (sh.bias) {
      uint16_t* bd = u.sl.b13.as<uint16_t>() + b * kBlockN;
      for (int n = 0; n < kBlockN; ++n) bd[n] = rows[n] >= 0 && f.b13 ? f.b13[size_t(e) * f.r13 + rows[n]] : 0;
    }
  }
}

void repack2(const RepackUnit& u) {
  const MoEShape& sh = u.sh;
  const Fp4Blocks& f = u.src.as<Fp4Blocks>();
  const int I = sh.intermediate, H = sh.hidden, e = u.e, grp = group_of(sh);
  const int ng2 = sh.kp2 / grp;
  const size_t bb2 = size_t(sh.kp2) * kBlockN / 2;
  const uint8_t* w2 = static_cast<const uint8_t*>(u.src.w2);
  const size_t b = u.blk;
  int rows[kBlockN];
  for (int n = 0; n < kBlockN; ++n) rows[n] = u.r0 + n < H ? u.r0 + n : -1;
  pack_fp4(w2 + size_t(e) * f.r2 * f.c2, f.c2, f.s2 + size_t(e) * f.r2 * f.cs2, f.cs2, rows, I, sh.kp2,
           grp, scale_one(sh), !sh.format->nv, u.sl.w2.as<uint8_t>() + b * bb2,
           u.sl.s2.as<uint8_t>() + b * ng2 * kBlockN);
  if (sh.bias) {
    uint16_t* bd = u.sl.b2.as<uint16_t>() + b * kBlockN;
    for (int n = 0; n < kBlockN; ++n) bd[n] = rows[n] >= 0 && f.b2 ? f.b2[size_t(e) * f.r2 + rows[n]] : 0;
  }
}

void gate_up_task(const TaskBlocks& w, GateUpTask& t) {
  const MoEShape& sh = w.sh;
  const size_t b = w.b * 2;
  t.w13 = nullptr;
  Fp4Weights& q = t.quant.emplace<Fp4Weights>();
  q.w = w.sl.w13.as<uint8_t>() + b * sh.kp1 * kBlockN / 2;
  q.scale = w.sl.s13.as<uint8_t>() + b * (sh.kp1 / group_of(sh)) * kBlockN;
  if (sh.format->nv) {
    q.nv = true;
    q.gs[0] = w.layer.global_scales13()[2 * size_t(w.e)];
    q.gs[1] = w.layer.global_scales13()[2 * size_t(w.e) + 1];
  }
}

void down_task(const TaskBlocks& w, DownTask& t) {
  const MoEShape& sh = w.sh;
  t.w2 = nullptr;
  Fp4Weights& q = t.quant.emplace<Fp4Weights>();
  q.w = w.sl.w2.as<uint8_t>() + w.b * sh.kp2 * kBlockN / 2;
  q.scale = w.sl.s2.as<uint8_t>() + w.b * (sh.kp2 / group_of(sh)) * kBlockN;
  if (sh.format->nv) {
    q.nv = true;
    q.gs[0] = w.layer.global_scales2()[w.e];
  }
}

}  // namespace

const Format kMxfp4Format = {
    .name = "mxfp4", .family = Family::kFp4, .decode_wide = DecodeWide::kFourBit, .int8_act = true,
    .q15_decode = true, .configure = &configure, .allocate = &allocate, .repack13 = &repack13,
    .repack2 = &repack2, .gate_up_task = &gate_up_task, .down_task = &down_task};
const Format kNvfp4Format = {
    .name = "nvfp4", .family = Family::kFp4, .nv = true, .decode_wide = DecodeWide::kFourBit, .int8_act = true,
    .q15_decode = true, .configure = &configure, .allocate = &allocate, .repack13 = &repack13,
    .repack2 = &repack2, .gate_up_task = &gate_up_task, .down_task = &down_task};

}  // namespace lk
