// bf16 / fp16 experts as vLLM's unquantized fused MoE holds them: w13 [E, 2I, H] (rows [gate; up]),
// w2 [E, H, I], converted once to bf16 blocks (kernel_table.h: the packed layout of every tier).
#include <algorithm>

#include "cpu/format.h"

namespace lk {
namespace {

void configure(const WeightSource&, MoEShape&, std::vector<float>&, std::vector<float>&) {}

void allocate(const MoEShape& sh, NodeSlice& sl, int node) {
  sl.w13 = HostBuffer(size_t(sh.experts) * (sl.ib1 - sl.ib0) * 2 * sh.kp1 * kBlockN * 2, node);
  sl.w2 = HostBuffer(size_t(sh.experts) * (sl.hb1 - sl.hb0) * sh.kp2 * kBlockN * 2, node);
}

char* row_buffer(const RepackUnit& u) {
  return static_cast<char*>(u.ctx.buffer(u.row_slot, size_t(16) * std::max(u.sh.kp1, u.sh.kp2) * 2));
}

void repack13(const RepackUnit& u) {
  const int I = u.sh.intermediate, H = u.sh.hidden;
  char* row = row_buffer(u);
  char* dst = u.sl.w13.as<char>() + u.blk * u.sh.kp1 * kBlockN * 2;
  const char* base = static_cast<const char*>(u.src.w13) + size_t(u.e) * 2 * I * H * 2;
  pack_block(base, u.r0, I, H, u.sh.kp1, 2, u.src.type, u.kt, row, dst);  // gate
  pack_block(base + size_t(I) * H * 2, u.r0, I, H, u.sh.kp1, 2, u.src.type, u.kt, row,
             dst + size_t(u.sh.kp1) * kBlockN * 2);  // up
}

void repack2(const RepackUnit& u) {
  const int I = u.sh.intermediate, H = u.sh.hidden;
  pack_block(static_cast<const char*>(u.src.w2) + size_t(u.e) * H * I * 2, u.r0, H, I, u.sh.kp2, 2, u.src.type, u.kt,
             row_buffer(u), u.sl.w2.as<char>() + u.blk * u.sh.kp2 * kBlockN * 2);
}

void gate_up_task(const TaskBlocks& w, GateUpTask& t) {
  t.w13 = w.sl.w13.as<uint16_t>() + w.b * 2 * w.sh.kp1 * kBlockN;
}

void down_task(const TaskBlocks& w, DownTask& t) { t.w2 = w.sl.w2.as<uint16_t>() + w.b * w.sh.kp2 * kBlockN; }

}  // namespace

const Format kBf16Format = {
    .name = "bf16", .family = Family::kBf16, .decode_wide = DecodeWide::kAll, .configure = &configure,
    .allocate = &allocate, .repack13 = &repack13, .repack2 = &repack2, .gate_up_task = &gate_up_task,
    .down_task = &down_task};

}  // namespace lk
