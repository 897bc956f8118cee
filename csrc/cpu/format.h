// An expert format as the engine sees it: one row of a table (formats/*.cpp), the way ggml describes
// its block types (ggml-cpu.c type_traits_cpu). A row owns what is particular to its format: the
// checks of the checkpoint tensors against the layer's shape, the per-layer parameters (MoEShape),
// the packed buffers' sizes, the repacking of checkpoint rows into packed blocks, and the weights part
// of the kernel tasks. moe_layer.cpp schedules and never asks which format it runs.
//
// Adding a format: its row in a new formats/<name>.cpp (declared below, chosen in format_of and
// listed in all_formats, format.cpp) and its row in lk_moe/formats.py; its checkpoint adapter in
// bindings/checkpoints.cpp and its tests. A new layout family also needs its checkpoint struct
// (WeightSource::rest, moe_layer.h), its task weights struct (QuantWeights, kernel_table.h), a Family
// value, and its kernels in kernels/<family>.cpp (dispatched in kernels/table.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/moe_layer.h"
#include "cpu/thread_pool.h"

namespace lk {

// One repack unit (Format::repack13 / repack2): expert e's gate+up block pair lb of the node
// slice (phase 1: packed blocks blk (gate) and blk + 1 (up)) or its down block lb (phase 2: block blk), whose
// first output row is r0 (an I row of gate and of up, or an H row of w2).
struct RepackUnit {
  const MoEShape& sh;
  const WeightSource& src;
  NodeSlice& sl;
  const KernelTable* kt;  // the active tier's row conversions (bf16 / fp16 -> bf16)
  WorkerCtx& ctx;         // the repacking worker: its scratch (ctx.buffer(row_slot, ...))
  int row_slot;
  int e, lb, r0;
  size_t blk;
};

// The weights of one kernel task (Format::gate_up_task / down_task): expert e's blocks from the node
// slice's block b on (phase 1: block pairs, b = e * nbi + lb0; phase 2: b = e * nbh + lb0).
struct TaskBlocks {
  const MoEShape& sh;
  const NodeSlice& sl;
  const MoELayer& layer;  // the per-expert global scales
  int e;
  size_t b;
};

struct Format {
  const char* name;  // the format's name in lk_moe ("fp8_block", ...)
  Family family;  // the packed layout family: which kernels run its tasks (kernel_table.h)
  bool int8_codes = false;  // kByteCodes: int8 codes (else fp8 e4m3fn)
  bool per_row = false;     // kByteCodes: one scale per output row (else one per block of the checkpoint)
  bool mx = false;          // kByteCodes: one e8m0 scale byte per output row and 32 inputs (mxfp8)
  bool nv = false;          // kFp4: NVFP4 (fp8 e4m3fn scales per 16 inputs, fp32 global scales); else MXFP4
  // Decode chunks: the least DecodeWide policy that starts them with wide units; whether LK_INT8_ACT
  // applies (int8 activations, off unless asked for: the 4-bit formats and int8_channel); whether they take 15-bit activations otherwise
  // (q15_decode, Fp4DecodeActs: every 4-bit format). int8 activations (~0.01 relative RMS against 0.002)
  // moved gpt-oss's greedy logprobs past the e2e bound (mxfp4, 2026-12-01) and Kimi-K2.5's int4 decode away
  // from its own bf16 prefill (wna16_int4, H200, 2026-12-04), so 15-bit activations (bf16's error) are the
  // default for all three; int8 was 0.354 -> 0.245 ms a layer at M=1 for wna16_int4 on the 16-core AMX host.
  DecodeWide decode_wide = DecodeWide::kAll;
  bool int8_act = false, q15_decode = false;
  // Checks the checkpoint tensors (src) against the layer's E, I, H (set in sh, as kp1 and kp2) and sets
  // the format's parameters in sh; per-expert global scales into gs13 ([E][2]) and gs2 ([E]). A layer
  // the format cannot hold: std::invalid_argument naming what is wrong.
  void (*configure)(const WeightSource& src, MoEShape& sh, std::vector<float>& gs13, std::vector<float>& gs2);
  // The packed buffers of a node slice (its block ranges set), on NUMA node `node` (-1: anywhere).
  void (*allocate)(const MoEShape& sh, NodeSlice& sl, int node);
  void (*repack13)(const RepackUnit& u);
  void (*repack2)(const RepackUnit& u);
  // The weights part of a task: w13 / w2 and the format's weight struct (the rest is the engine's).
  void (*gate_up_task)(const TaskBlocks& w, GateUpTask& t);
  void (*down_task)(const TaskBlocks& w, DownTask& t);
};

// The format of a checkpoint: its type, and for one-byte codes its scales (bn == bk == 0: per row).
const Format& format_of(const WeightSource& src);

// The table's rows (formats/*.cpp).
extern const Format kBf16Format, kFp8BlockFormat, kFp8ChannelFormat, kInt8ChannelFormat, kWna16Int4Format,
    kMxfp4Format, kNvfp4Format, kMxfp8Format;

// Every row, in lk_moe.formats' order (its tests compare the two tables).
const std::vector<const Format*>& all_formats();

// Shared by the formats' repacking (format.cpp): 16 rows [r0, r0+16) of a row-major [rows, k] matrix of
// `esz`-byte elements (1: codes, copied; 2: bf16 or fp16, converted to bf16 by kt) -> one packed block
// of kp inputs (the bf16 block layout, kernel_table.h; byte codes in the same element order); rows past
// `rows` and inputs past k are zero.
void pack_block(const char* src, int r0, int rows, int k, int kp, size_t esz, DType type, const KernelTable* kt,
                char* tmp, char* dst);

}  // namespace lk
