// The entry points of the kernel files of one tier (each file compiled once per tier, see simd.h):
// what table.cpp dispatches to. In lk::tier_<name>, not in an anonymous namespace, so that the files
// of one tier link to each other; the tier's name in the namespace keeps the tiers apart.
#pragma once

#include "cpu/kernel_table.h"

#ifndef LK_CAT
#define LK_CAT2(a, b) a##b
#define LK_CAT(a, b) LK_CAT2(a, b)
#endif

namespace lk {
namespace LK_CAT(tier_, LK_TIER) {

void gate_up_bf16(const GateUpTask& t);  // bf16.cpp
void down_bf16(const DownTask& t);
void gate_up_fp8(const GateUpTask& t);   // fp8.cpp: fp8_block, fp8_channel, int8_channel
void down_fp8(const DownTask& t);
void gate_up_q4(const GateUpTask& t);    // int4.cpp: wna16_int4
void down_q4(const DownTask& t);
void gate_up_fp4(const GateUpTask& t);   // fp4.cpp: mxfp4, nvfp4
void down_fp4(const DownTask& t);
// act_quant.cpp, the AVX-512 tiers and avx2 (KernelTable::q8_row / q15_row)
void q8_row(const uint16_t* src, int kp, int8_t* dst);
void q15_row(const uint16_t* src, int kp, int8_t* dst);

}  // namespace LK_CAT(tier_, LK_TIER)
}  // namespace lk
