// One MoE layer's routed experts on the CPU: packed weights split across NUMA
// nodes, and the forward that schedules the kernels on the thread pool.
//
// NUMA split (no replication, host bytes ~1.0x the experts): node slot s owns
// I-blocks [ib0, ib1) of every expert's gate and up projections and H-blocks
// [hb0, hb1) of every expert's down projection. A forward therefore runs in two
// phases with a barrier between them:
//   phase 1: each node computes act = silu(gate x) * (up x) for its I columns;
//   phase 2: each node computes its H columns of out = sum_k w_k * down_e(act),
//            reading all of act (the only cross-node traffic: K*I bf16 per token).
// Every output element is produced by exactly one work unit, which owns the
// fp32 accumulator of its columns: no atomics, no cross-thread reduction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <vector>

#include "cpu/host_memory.h"
#include "cpu/kernel_table.h"
#include "cpu/thread_pool.h"

namespace lk {

struct MoEShape {
  int experts = 0;       // E
  int intermediate = 0;  // I
  int hidden = 0;        // H
  int kp1 = 0;           // H padded to kPadK (phase-1 reduction length)
  int kp2 = 0;           // I padded to kPadK (phase-2 reduction length, act row length)
  int i_blocks = 0;      // kp2 / 16: I-blocks (blocks past I hold zero weights)
  int h_blocks = 0;      // ceil(H / 16)
  bool byte_weights = false;  // one byte per weight (fp8 or int8) + fp32 scales
  bool int8 = false;          // byte weights are int8 (else fp8 e4m3fn)
  bool per_row = false;       // one scale per output row (else per seg x block rows)
  int seg = 0;           // byte weights: inputs per segment (block mode: per scale)
  // wna16_int4 (see WeightSource): half a byte per weight, 16-bit scales per (row, seg inputs).
  bool int4 = false;
  bool int4_asym = false;     // zero points stored (else the symmetric zero 8)
  bool int4_fp16 = false;     // scales are fp16 (else bf16)
  int seg1 = 0, seg2 = 0;     // int4: inputs per scale in phase 1 (over H) and phase 2 (over I)
  // mxfp4 (see WeightSource): half a byte per weight, one e8m0 byte per (row, 32 inputs).
  bool fp4 = false;
  bool int8_act = false;      // int4 / fp4 decode (chunks <= kQ8MaxTokens) with int8 activations (LK_INT8_ACT)
  bool nv = false;            // fp4 is NVFP4: fp8 e4m3fn scale per (row, 16 inputs) + fp32 global scales
  bool bias = false;          // w13 / w2 biases held (bf16)
  float alpha = 1.702f, limit = 7.0f;  // swigluoai constants
};

// Expert weights as the checkpoint holds them (vLLM layouts).
//
// kINT4 (format "wna16_int4"): compressed-tensors "pack-quantized" int4 experts as vLLM 0.26.0's
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
//
// kMXFP4 (format "mxfp4"): OCP MX FP4 experts as vLLM 0.26.0's GptOssMxfp4MoEMethod / Mxfp4MoEMethod
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
// kNVFP4 (format "nvfp4"): ModelOpt NVFP4 experts as vLLM 0.26.0's ModelOptNvFp4FusedMoE holds them after
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
struct WeightSource {
  DType type = DType::kBF16;  // kBF16 / kFP16, or kFP8E4M3 / kINT8 with scales, or kINT4, kMXFP4, kNVFP4
  const void* w13 = nullptr;  // [E, 2I, H]
  const void* w2 = nullptr;   // [E, H, I]
  const float* s13 = nullptr; // block: [E, ceil(2I/bn), H/bk] (w13_weight_scale_inv); per row: [E, 2I]
  const float* s2 = nullptr;  // block: [E, ceil(H/bn), I/bk]; per row: [E, H]
  int bn = 0, bk = 0;         // block: scale block rows x cols; 0 x 0: one scale per row
  // kINT4: w13 int32 [E, H/8, 2I], w2 int32 [E, I/8, H] (K-first, see above), and:
  const uint16_t* q13s = nullptr;  // w13_weight_scale [E, H/gs1, 2I] (bf16 or fp16 bits)
  const uint16_t* q2s = nullptr;   // w2_weight_scale [E, I/gs2, H]
  const int32_t* z13 = nullptr;    // w13_weight_zero_point [E, H/gs1, ceil(2I/8)] or null (symmetric)
  const int32_t* z2 = nullptr;     // w2_weight_zero_point [E, I/gs2, ceil(H/8)]
  int gs1 = 0, gs2 = 0;            // group sizes along H (w13) and I (w2)
  bool fp16_scale = false;
  // kMXFP4: w13 uint8 [E, r13, c13] (r13 = 2 * I_pad >= 2I, c13 * 2 >= H), w2 uint8 [E, r2, c2]
  // (r2 >= H, c2 * 2 >= I); scales uint8 [E, r13, cs13] and [E, r2, cs2] (cs13 * 32 >= H, cs2 * 32 >= I).
  const uint8_t* e13 = nullptr;
  const uint8_t* e2 = nullptr;
  const uint16_t* b13 = nullptr;  // w13_bias bf16 [E, r13] or null
  const uint16_t* b2 = nullptr;   // w2_bias bf16 [E, r2] or null
  int r13 = 0, c13 = 0, cs13 = 0, r2 = 0, c2 = 0, cs2 = 0;
  bool interleaved = false;       // w13 row 2j = gate_j, 2j + 1 = up_j (else gate rows [0, r13/2), up after)
  float alpha = 1.702f, limit = 7.0f;
  // kNVFP4: the kMXFP4 fields with scales fp8 e4m3fn bytes, cs13 = H/16, cs2 = I/16, no padding, no
  // biases, [gate; up] rows; plus the fp32 global scales (weight_scale_2):
  const float* g13 = nullptr;     // w13_weight_scale_2 [E, 2]: gate (w1) and up (w3) of each expert
  const float* g2 = nullptr;      // w2_weight_scale_2 [E]
};

struct NodeSlice {
  int ib0 = 0, ib1 = 0;  // I-blocks owned
  int hb0 = 0, hb1 = 0;  // H-blocks owned
  HostBuffer w13;        // [E][ib1-ib0][gate block, up block]
  HostBuffer w2;         // [E][hb1-hb0][block]
  HostBuffer s13, s2;    // fp8 scales: [E][ib1-ib0][2][kp1/seg], [E][hb1-hb0][kp2/seg]
                         // int4: 16-bit [E][ib1-ib0][2][kp1/seg1][16], [E][hb1-hb0][kp2/seg2][16]
  HostBuffer z13, z2;    // int4 asymmetric zero points, 4 bits each, laid out as the int4 scales
                         // mxfp4: s13 / s2 hold e8m0 bytes [E][ib1-ib0][2][kp1/32][16], [E][hb1-hb0][kp2/32][16]
  HostBuffer b13, b2;    // mxfp4 biases, bf16: [E][ib1-ib0][2][16], [E][hb1-hb0][16]
};

struct ForwardArgs {
  const void* x = nullptr;  // [M, H] contiguous
  DType x_type = DType::kBF16;
  int64_t tokens = 0;       // M
  int top_k = 0;            // K
  const int32_t* ids = nullptr;      // [M, K], -1 = unused slot
  const float* weights = nullptr;    // [M, K]
  void* out = nullptr;               // [M, H] contiguous, type out_type
  DType out_type = DType::kBF16;
};

// Decode work units (chunks of < 16 slots per active expert). Which decode chunks start with wide
// units (several consecutive blocks of one expert per unit: longer weight streams), and how many
// units per thread decode keeps for balance. Process-wide; the setter is for benchmarks' A/Bs: the
// grouping changes which thread computes a block, never a result's summation order.
enum class DecodeWide {  // each covers the ones before it
  kInt8Act = 0,    // only int8-activation chunks (4-bit formats with LK_INT8_ACT)
  kFourBit = 1,    // every 4-bit format (wna16_int4, mxfp4, nvfp4): the default
  kQuantized = 2,  // every quantized format (the 8-bit ones too)
  kAll = 3,        // bf16 too
};
struct DecodeUnits {
  DecodeWide wide;
  int units_per_thread;
};
void set_decode_units(DecodeUnits u);
DecodeUnits decode_units();
// How decode chunks hand out their units: fixed ones (DecodeUnits), or guided self-scheduling (the
// default; each claim takes a shrinking share of the blocks left: long streams first, short claims at
// the end so the threads finish together; DecodeUnits then shapes prefill-sized chunks only).
// Process-wide, for benchmarks' A/Bs; results are bit-identical either way.
enum class DecodeSchedule { kUnits = 0, kGuided = 1 };
void set_decode_schedule(DecodeSchedule s);
DecodeSchedule decode_schedule();
// Activations of the fp4 formats' decode chunks (<= kQ8MaxTokens tokens, AVX-512 tiers, LK_INT8_ACT
// not set for them): q15 rows (the default; integer dot products on 15-bit activations, see
// kernels/fp4.cpp, dot_tile_fp4_int) or the bf16 rows of the vdpbf16ps tile. Process-wide, for
// benchmarks' A/Bs; the results differ by the activations' 15-bit rounding.
enum class Fp4DecodeActs { kQ15 = 0, kBf16 = 1 };
void set_fp4_decode_acts(Fp4DecodeActs a);
Fp4DecodeActs fp4_decode_acts();
// The quantized decode tiles' far prefetch distance in bytes (g_decode_far_prefetch, kernel_table.h):
// 0 (off) or a multiple of 64 up to 64 KiB; default kDefaultDecodePrefetch.
constexpr int kDefaultDecodePrefetch = 8192;
void set_decode_prefetch(int bytes);
int decode_prefetch();
// Test hook: the most tokens an activation chunk may hold (0, the default: as many as kChunkBudget
// allows, ~21.7k at the Qwen3-30B shape). Only lowers the computed size, so tests can reach the
// multi-chunk path and its last partial chunk at small M; a setting > 0 never raises it.
void set_chunk_tokens(int tokens);
int chunk_tokens();

class MoELayer;

class ForwardJob : public Job {
 public:
  void prepare(const MoELayer* layer, const ForwardArgs& args, const KernelTable* kernels);
  void run(WorkerCtx& ctx) override;
  // Wall time of the last forward inside the pool (first worker in to last worker out), us.
  double compute_us() const {
    return double(end_ns_.load(std::memory_order_relaxed) - start_ns_.load(std::memory_order_relaxed)) * 1e-3;
  }
  // Where the last chunk of the last forward spent its time, us: each phase from the first worker in
  // to the last worker out of its work, and the spread between the first and the last worker out
  // (the tail that the barrier after it waits out).
  struct PhaseTimes {
    double gate_up_us, down_us, gate_up_spread_us, down_spread_us;
  };
  PhaseTimes phase_times() const;

 private:
  static constexpr int kMaxNodes = 64;
  void plan_chunk(WorkerCtx& ctx, int64_t t0, int tc);
  static KernelScratch scratch(WorkerCtx& ctx, const MoEShape& sh);
  void convert_inputs(WorkerCtx& ctx, int64_t t0, int tc);
  void phase_gate_up(WorkerCtx& ctx);
  void phase_down(WorkerCtx& ctx, int64_t t0, int tc);
  void quantize_act(WorkerCtx& ctx);

  const MoELayer* layer_ = nullptr;
  const KernelTable* kt_ = nullptr;
  ForwardArgs a_;
  int chunk_tokens_ = 0;
  bool copy_x_ = false;

  // Plan of the current chunk (written by worker 0 before a barrier).
  const uint16_t* x_rows_base_ = nullptr;  // token row t at x_rows_base_ + t * x_ld_
  size_t x_ld_ = 0;
  int num_active_ = 0;
  int32_t* active_expert_ = nullptr;  // [A]
  int32_t* active_begin_ = nullptr;   // [A+1] slot offsets
  int32_t* slot_token_ = nullptr;     // [S] chunk-local token of each slot, grouped by expert
  float* slot_weight_ = nullptr;      // [S]
  int32_t* pieces_ = nullptr;         // [P][3]: active index, first slot, end slot
  int num_pieces_ = 0;
  int group1_ = 1;                    // I-blocks per phase-1 unit
  int group2_ = 1;                    // H-blocks per phase-2 unit
  int token_ranges_ = 1;              // phase-2 token ranges
  bool guided_ = false;               // decode chunk under DecodeSchedule::kGuided
  uint16_t* act_ = nullptr;           // [S + 32][kp2]
  bool q15_ = false;                  // ... and its integer rows are q15 rows (fp4 formats, Fp4DecodeActs)
  size_t int_row_bytes(int kp) const { return q15_ ? q15_row_bytes(kp) : q8_row_bytes(kp); }
  auto int_row_fn() const { return q15_ ? kt_->q15_row : kt_->q8_row; }  // bf16 row -> that integer row
  bool q8_ = false;                   // 4-bit decode chunk with int8 activations:
  int8_t* xq_ = nullptr;              // [tc] q8 rows of x (q8_row_bytes(kp1) each)
  int8_t* aq_ = nullptr;              // [S] q8 rows of act (q8_row_bytes(kp2) each)
  std::atomic<int> next1_[kMaxNodes];
  std::atomic<int> next2_[kMaxNodes];
  std::atomic<int64_t> start_ns_{0}, end_ns_{0};
  struct PhaseClock {  // of the current chunk: the first worker into a phase, the first and last out
    std::atomic<int64_t> first_in{0}, first_out{0}, last_out{0};
  };
  static void phase_out(PhaseClock& c, int64_t t);
  PhaseClock gate_up_times_, down_times_;
};

class MoELayer {
 public:
  // Contiguous checkpoint tensors (see WeightSource); validated by the caller.
  MoELayer(std::shared_ptr<ThreadPool> pool, const WeightSource& src, int experts, int intermediate, int hidden,
           Activation act);
  ~MoELayer();

  const MoEShape& shape() const { return shape_; }
  Activation activation() const { return act_; }
  size_t nbytes() const;
  ThreadPool& pool() const { return *pool_; }
  const std::vector<NodeSlice>& slices() const { return slices_; }
  // nvfp4: fp32 global scales, [E][2] (gate, up) and [E]; empty otherwise.
  const float* global_scales13() const { return gs13_.data(); }
  const float* global_scales2() const { return gs2_.data(); }

  // Throws std::invalid_argument for an expert id outside [-1, E).
  void check_ids(const int32_t* ids, int64_t count) const;
  // Starts a forward and returns its pool sequence number (wait with pool().wait_for(seq)).
  // Waits first for this layer's previous forward: one in flight per layer; thread-safe.
  uint32_t submit(const ForwardArgs& args);
  double last_compute_us() const { return job_.compute_us(); }
  ForwardJob::PhaseTimes last_phase_times() const { return job_.phase_times(); }
  // Runs before the weights are freed (e.g. to unregister them from CUDA).
  void on_destroy(std::function<void()> fn) { cleanup_.push_back(std::move(fn)); }
  bool pinned = false;  // weights page-locked for GPU streaming

 private:
  std::shared_ptr<ThreadPool> pool_;
  MoEShape shape_;
  Activation act_;
  std::vector<NodeSlice> slices_;
  std::vector<float> gs13_, gs2_;  // nvfp4 global scales
  std::mutex submit_mu_;  // callers may be Python threads and CUDA's callback/poller threads
  ForwardJob job_;
  bool submitted_ = false;
  std::vector<std::function<void()>> cleanup_;
};

}  // namespace lk
