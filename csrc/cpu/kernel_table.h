// The boundary between the ISA-independent engine and the per-tier kernels.
//
// The kernel sources (csrc/cpu/kernels/) are compiled once per tier (isa_tiers.h) into namespace
// lk::tier_<name>; each build exports one KernelTable. The
// engine (moe_layer.cpp) only sees this table, so adding a tier or changing a
// kernel never touches the scheduling code.
//
// Packed weight layout (shared by all tiers, built once by moe_layer.cpp):
// a "block" is 16 output rows x Kp inputs (Kp a multiple of 32), stored as Kp/2
// rows of 32 bf16: element (n, k) at (k/2)*32 + n*2 + (k&1). This is the AMX B
// tile layout and the operand of AVX512-BF16 `vdpbf16ps` (one 64-byte load
// holds 16 outputs x 2 inputs); the non-BF16 tiers split it into even/odd
// lanes with a shift and a mask.
#pragma once

#include <cstddef>
#include <cstdint>
#include <variant>

#include "cpu/isa_tiers.h"

namespace lk {

constexpr int kBlockN = 16;  // outputs per packed block
constexpr int kPadK = 32;    // input dimension padding (one AMX tile row)

enum class DType : int { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8E4M3 = 3, kINT8 = 4, kINT4 = 5, kMXFP4 = 6, kNVFP4 = 7,
                        kMXFP8 = 8 };
// The packed layout family of a layer's experts (a Format row's), i.e. which kernels run its tasks:
// bf16 blocks (kernels/bf16.cpp), one-byte codes with fp32 scales (Fp8Weights, kernels/fp8.cpp), 4-bit
// integer codes (Int4Weights, kernels/int4.cpp), 4-bit float codes (Fp4Weights, kernels/fp4.cpp). A
// task carries its family as the QuantWeights alternative it holds.
enum class Family : int { kBf16 = 0, kByteCodes = 1, kInt4 = 2, kFp4 = 3 };
// kSiLU: silu(gate) * up. kSwigluOAI (gpt-oss): g = min(gate, limit), u = clamp(up, -limit, limit),
// (u + 1) * g * sigmoid(alpha * g) (see moe_layer.h for the sources). kSiLUClamp (vLLM's silu with
// swiglu_limit, DeepSeek-V4): silu(min(gate, limit)) * clamp(up, -limit, limit)
// (fused_moe/activation.py silu_and_mul_with_clamp). kSitu (Kimi's SituGLU, activation.py SituAndMul):
// beta * tanh(gate / beta) * sigmoid(gate) * up', up' = linear_beta * tanh(up / linear_beta), or up where
// linear_beta is unset (0); beta and linear_beta travel as the constants (alpha, limit). Every format computes
// kSiLUClamp and kSitu (kernels/simd.h gate_act_16).
enum class Activation : int { kSiLU = 0, kSwigluOAI = 1, kSiLUClamp = 2, kSitu = 3 };

// Per-worker scratch owned by the thread pool; sizes are guaranteed by the caller.
struct KernelScratch {
  float* c;            // >= 32 x 64 floats: one micro-tile of results
  uint16_t* panel;     // >= round_up(m, 32) x Kp1 bf16: AMX A panel (gathered token rows)
  uint16_t* deq;       // >= 2 x 16 x max(Kp1, Kp2, kMaxSeg) fp32: dequantized weight segments, or two
                       // whole blocks: bf16 and their fp32 group scales (AVX-512), or fp32 (avx2)
  float* acc;          // >= kMaxRowsPerTask x 32 floats: per-row sums across segments
  float* f32;          // >= (2 x 16 + kF32PanelRows) x max(Kp1, Kp2) floats: the avx512 tier's fp32 panels of
                       // two blocks and a row tile's fp32 activations (quantized formats; others: null)
};

constexpr int kF32PanelRows = 12;       // rows of the avx512 tier's fp32 panel tile

constexpr int kMaxSeg = 256;            // largest quantization block along the input dimension
constexpr int kMaxRowsPerTask = 128;    // rows of one gate/up task (the engine's piece size)

// Block-quantized FP8 (e4m3fn) weights, as DeepSeek-V3 / Qwen3-FP8 checkpoints ship them: the
// same block layout with one byte per element, and one fp32 scale per `seg` inputs of each
// 16-row block (the checkpoint's 128x128 scale blocks, repeated per 16 rows). Null `w`: bf16.
//
// per_row (compressed-tensors channel quantization, fp8 or int8): one scale per output row
// instead, stored as 16 floats per block; `seg` is then only the dequantization chunk.
struct Fp8Weights {
  const uint8_t* w = nullptr;
  const float* scale = nullptr;
  int seg = 0;
  bool per_row = false;
  bool int8 = false;  // codes are int8 (exact in bf16) instead of fp8 e4m3fn
  // mxfp8: one e8m0 scale byte per output row and `seg` (32) inputs instead of `scale`, [kp/32][16] per block
  const uint8_t* mx_scale = nullptr;
};

// 4-bit integer weights (compressed-tensors WNA16 int4; conventions in moe_layer.h). A block is 16
// output rows x kp inputs in kp/8 "octets" of 64 bytes (one cache line): byte 4n + j of octet o
// holds element (n, 8o + j) in its low nibble and element (n, 8o + 4 + j) in its high nibble, so
// one and/shift gives a dword per output row of 4 consecutive inputs: the u8 operand of VNNI
// vpdpbusd (see kernels/int4.cpp). Nibbles u are unsigned; weight =
// (u - zero) * scale with one scale (and zero) per output row and `group` inputs. Half a byte per
// weight in memory.
struct Int4Weights {
  const uint8_t* w = nullptr;
  const uint16_t* scale = nullptr;  // per block: [kp/group][16] bf16 or fp16 bits
  const uint8_t* zero = nullptr;    // per block: [kp/group][8] bytes, zero point of row n in nibble n%2 of
                                    // byte n/2 (low first); null: symmetric (8)
  int group = 0;                    // inputs per scale: a multiple of 32, <= kMaxSeg
  bool fp16_scale = false;          // scales are fp16 (else bf16)
};

// MXFP4 weights (OCP microscaling FP4, gpt-oss; conventions in moe_layer.h): a block is kp/4 quads
// of 32 bytes (the bf16 pair-row order, byte 2n + j of quad q: element (n, 4q + j) in the low nibble,
// (n, 4q + 2 + j) in the high nibble), each nibble an e2m1 code (sign bit 3, exponent bits 2-1,
// mantissa bit 0: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}); one e8m0 scale byte s (2^(s - 127)) per output row
// and 32 inputs. Half a byte per weight plus 1/32 byte of scale: the checkpoint's bytes.
//
// NVFP4 (ModelOpt, `nv`): the same code blocks; one fp8 e4m3fn scale byte per output row and 16
// inputs ([kp/16][16] per block), and one fp32 global scale per expert projection (gate, up, down),
// applied in fp32 to the block's dot products: weight = e2m1(code) * fp8(scale) * gs.
struct Fp4Weights {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;  // per block: [kp/32][16] e8m0 bytes (nv: [kp/16][16] fp8 e4m3fn bytes)
  bool nv = false;                 // NVFP4: fp8 scales per 16 inputs and global scales
  float gs[2] = {1.0f, 1.0f};      // nv: global scale of the gate and up blocks (gate_up) / of w2 (down: gs[0])
};

// The quantized weights of a task (Format::gate_up_task / down_task fill them): the alternative held
// says which kernels run the task (kernels/table.cpp); none (monostate): bf16 blocks at w13 / w2.
using QuantWeights = std::variant<std::monostate, Fp8Weights, Int4Weights, Fp4Weights>;

// Decode input of the 4-bit kernels with int8 activations (wna16_int4, mxfp4, nvfp4;
// KernelTable::q8_row): one activation row of kp inputs quantized per 32 inputs, symmetric int8: kp
// codes q (int8), then kp/32 fp32 scales d (x ~ d * q), then kp/32 fp32 d * sum(q) (int4 zero
// points), then kp/16 int32 sums of q per 16 inputs (the fp4 kernels' code offset, exact in integers).
constexpr int kQ8Group = 32;
// The fp4 formats' decode input (KernelTable::q15_row): one activation row as 15-bit integers per 32
// inputs, q = 128 hi + lo with a power-of-two scale d (x ~ d * q, exact for the group's top 2^6 range):
// kp int8 hi, kp int8 lo, kp/32 fp32 d, kp/16 int32 sums of q per 16 inputs.
// Where those parts start, in bytes from the row's start (the q8 / q15 codes at 0): the writer (act_quant.cpp)
// and every integer tile read it from here. lo: q15 only, ds (d x sum q): q8 only; 0 where absent.
struct IntRowLayout {
  size_t lo, d, ds, s16, bytes;
};
inline IntRowLayout int_row_layout(int kp, bool q15) {
  const size_t n = size_t(kp), nb = n / kQ8Group, sums = (n / 16) * 4;
  if (q15) return {n, 2 * n, 0, 2 * n + 4 * nb, 2 * n + 4 * nb + sums};
  return {0, n, n + 4 * nb, n + 8 * nb, n + 8 * nb + sums};
}
inline size_t q8_row_bytes(int kp) { return int_row_layout(kp, false).bytes; }
inline size_t q15_row_bytes(int kp) { return int_row_layout(kp, true).bytes; }
constexpr int kQ8MaxTokens = 16;  // the engine quantizes activations for chunks of at most this many tokens

// Phase 1: act[r, j*16 + n] = act_fn(gate_j[n] . x_r) * (up_j[n] . x_r) for the
// nblk I-blocks starting at w13 (layout [nblk][gate block][up block]).
struct GateUpTask {
  const uint16_t* const* x_rows;  // m rows of kp bf16 (zero padded)
  int m;
  const uint16_t* w13;
  int nblk;
  int kp;
  uint16_t* act;  // row r at act + r * act_ld, first column of the group
  size_t act_ld;
  Activation act_fn;
  KernelScratch* scratch;
  // Quantized weights instead of w13. Fp8Weights: [nblk][gate, up][kp*16 bytes], scales [nblk][2][kp/seg]
  // (per_row: [nblk][2][16]); Int4Weights: [nblk][gate, up][kp*8 bytes], scales [nblk][gate, up][kp/group][16],
  // zeros [..][8]; Fp4Weights: [nblk][gate, up][kp*8 bytes], scales [nblk][gate, up][kp/G][16] (G = 32, nv: 16).
  QuantWeights quant;
  const uint16_t* bias = nullptr;  // bf16 [nblk][gate, up][16] added to the pre-activations, or null
  const int8_t* const* q8_rows = nullptr;  // int4 / fp4 decode: the m rows as q8 rows (q8_row_bytes(kp)), or null
  bool q15 = false;                        // fp4 decode: q8_rows are q15 rows (q15_row_bytes(kp))
  float alpha = 1.702f, limit = 7.0f;  // kSwigluOAI constants; limit: kSiLUClamp's too; kSitu: beta, linear_beta
};

// Phase 2: out_acc[out_row[r], j*16 + n] += row_weight[r] * (w2_j[n] . act_r)
// for the nblk H-blocks starting at w2 (layout [nblk][block]).
struct DownTask {
  const uint16_t* act;  // m contiguous rows of kp bf16 (ld act_ld); rows past m readable
  size_t act_ld;
  int m;
  const uint16_t* w2;
  int nblk;
  int kp;
  const float* row_weight;
  const int32_t* out_row;
  float* out_acc;
  size_t out_ld;
  KernelScratch* scratch;
  // Quantized weights instead of w2. Fp8Weights: [nblk][kp*16 bytes], scales [nblk][kp/seg] (per_row:
  // [nblk][16]); Int4Weights: [nblk][kp*8 bytes], scales [nblk][kp/group][16], zeros [nblk][kp/group][8];
  // Fp4Weights: [nblk][kp*8 bytes], scales [nblk][kp/G][16] (the w2 bias is added by the engine).
  QuantWeights quant;
  const int8_t* q8_act = nullptr;  // int4 / fp4 decode: the m act rows as q8 rows (ld q8_ld bytes), or null
  size_t q8_ld = 0;
  bool q15 = false;  // fp4 decode: q8_act holds q15 rows
};

struct KernelTable {
  const char* name;
  void (*gate_up)(const GateUpTask&);
  void (*down)(const DownTask&);
  // n values of src (bf16 or fp16) to bf16, zero-filling up to n_padded.
  void (*to_bf16)(const void* src, DType src_type, uint16_t* dst, int n, int n_padded);
  // n fp32 values to dst (bf16 or fp16, round to nearest even).
  void (*store_row)(const float* src, void* dst, DType dst_type, int n);
  // Sum of n bytes (multiple of 64) read as int64 lanes; used by the read-bandwidth probe.
  uint64_t (*read_sum)(const void* src, size_t n);
  // One bf16 row of kp inputs (kp a multiple of 32) -> a q8 row (see q8_row_bytes). Null on the tier
  // without int8-activation kernels (generic): it takes the exact bf16 path.
  void (*q8_row)(const uint16_t* src, int kp, int8_t* dst);
  // One bf16 row -> a q15 row (see q15_row_bytes); null where q8_row is.
  void (*q15_row)(const uint16_t* src, int kp, int8_t* dst);
  // With int8 activations chosen (LK_INT8_ACT), prefill-sized chunks take the int8 tiles too: where they
  // outrun this tier's bf16 panels (2 Zen4 cores, Qwen3-30B-A3B and DeepSeek-V3 shapes, M 64-1024: avx512 and
  // avx512_bf16 0.60-0.96x of bf16's time for every format with an integer route, avx2 0.73-0.95x;
  // docs/results/2026-12-04_dev2c_int8_prefill_panels.log, 2026-12-05_dev2c_avx2_decode.log); not on amx, whose
  // AMX-BF16 panels do more multiply-adds per cycle than the VNNI tile.
  bool q8_prefill;
};

// Bytes ahead in each block stream that the quantized decode tiles prefetch into L2 (0: off; see
// kernels/simd.h, kPrefetchNearBytes). Process-wide, read with a relaxed atomic load; set through
// set_decode_prefetch (moe_layer.h), a benchmark hook: prefetching never changes a result.
extern int g_decode_far_prefetch;

#define LK_TIER_TABLE(name, feature, flags) namespace tier_##name { const KernelTable* kernel_table(); }
LK_ISA_TIERS(LK_TIER_TABLE)
#undef LK_TIER_TABLE

}  // namespace lk
