// The forward's process-wide settings (moe_layer.h): how decode chunks hand out their work, the fp4
// formats' decode activations, the quantized decode tiles' far prefetch, the chunk cap of the tests;
// set by benchmark and test hooks (lk_moe._C._set_*), and the measurements behind their defaults.
#include <atomic>
#include <stdexcept>

#include "cpu/moe_layer.h"

namespace lk {
namespace {
// Default: 4-bit decode starts wide. Measured on the 16-core AMX host of the H200 machine, 2026-12-01
// (docs/results/2026-12-01_h200_session7.log: benchmarks/moe_layer.py --shapes qwen3-30b-a3b --threads all
// --decode-units, two runs, M=1 of the read bandwidth measured in the same run, int8_act:4 -> quantized:4):
// nvfp4 0.74 -> 0.78 and 0.80 -> 0.83, mxfp4 0.76 -> 0.78 and 0.78 -> 0.82 (M=4: 0.84 -> 0.88, 0.81 -> 0.88);
// the 8-bit formats did not gain (fp8_block 0.82 -> 0.82 / 0.80, fp8_channel 0.75 -> 0.73, 0.81 -> 0.79,
// int8_channel 0.76 -> 0.77 / 0.73): a block of 8-bit weights is already a 2x longer stream. Two units
// per thread instead of four cost the 8-bit formats 0.05-0.10. On the 2-core Zen4 VM (2 threads,
// docs/results/2026-12-01_epyc2c_decode_units.log) wide units also lifted fp8_block (0.67 -> 0.82).
std::atomic<int> g_decode_wide{int(DecodeWide::kFourBit)};
std::atomic<int> g_decode_units_per_thread{4};
// Default: guided. Measured on the 16-core AMX host of the H200 machine, 2026-12-01, tenth session
// (docs/results/2026-12-01_h200_session10.log: benchmarks/moe_layer.py --shapes qwen3-30b-a3b --tokens 1
// --threads all --decode-prefetch 0,8192 --decode-schedule units,guided, 5 rounds per format, 3-5 of them
// without CPU contention): M=1 time guided / units (far prefetch 8192) median 0.96, 0.88-1.02, 25 of 28
// pairs faster; medians of the read-bandwidth ratio units -> guided: mxfp4 0.71 -> 0.74, nvfp4 0.73 -> 0.76,
// wna16_int4 0.80 -> 0.81, fp8_block 0.78 -> 0.86, fp8_channel 0.83 -> 0.89, int8_channel 0.93 -> 1.00,
// bf16 0.98 -> 1.03. On the 2-core dev VM: no change at M=1, M=4 2-4% faster.
std::atomic<int> g_decode_schedule{int(DecodeSchedule::kGuided)};
// Default: q15. The 16-core AMX host (dev/decode_ops_micro.cpp, 2026-12-01, eleventh session): the
// vdpbf16ps tile costs ~15 cycles per quad of two blocks there (~11 GB/s of codes per core, L1-resident),
// its conversion and its dot products contending for the same ports; the q15 tile's two vpdpbusd per
// block and quad take ~6.
std::atomic<int> g_fp4_decode_acts{int(Fp4DecodeActs::kQ15)};
std::atomic<int> g_chunk_tokens{0};
std::atomic<int> g_int_acts_max_tokens{kQ8MaxTokens};
}  // namespace

void set_decode_units(DecodeUnits u) {
  if (int(u.wide) < 0 || int(u.wide) > int(DecodeWide::kAll) || u.units_per_thread < 1 || u.units_per_thread > 64)
    throw std::invalid_argument("decode units: wide must be a DecodeWide and units_per_thread in 1..64");
  g_decode_wide.store(int(u.wide), std::memory_order_relaxed);
  g_decode_units_per_thread.store(u.units_per_thread, std::memory_order_relaxed);
}

DecodeUnits decode_units() {
  return DecodeUnits{DecodeWide(g_decode_wide.load(std::memory_order_relaxed)),
                     g_decode_units_per_thread.load(std::memory_order_relaxed)};
}

void set_decode_schedule(DecodeSchedule s) {
  if (s != DecodeSchedule::kUnits && s != DecodeSchedule::kGuided)
    throw std::invalid_argument("decode schedule: units or guided");
  g_decode_schedule.store(int(s), std::memory_order_relaxed);
}

void set_fp4_decode_acts(Fp4DecodeActs a) {
  if (a != Fp4DecodeActs::kQ15 && a != Fp4DecodeActs::kBf16) throw std::invalid_argument("fp4 decode acts: q15 or bf16");
  g_fp4_decode_acts.store(int(a), std::memory_order_relaxed);
}

Fp4DecodeActs fp4_decode_acts() { return Fp4DecodeActs(g_fp4_decode_acts.load(std::memory_order_relaxed)); }

DecodeSchedule decode_schedule() { return DecodeSchedule(g_decode_schedule.load(std::memory_order_relaxed)); }

int g_decode_far_prefetch = kDefaultDecodePrefetch;

void set_decode_prefetch(int bytes) {
  if (bytes < 0 || bytes > 65536 || bytes % 64 != 0)
    throw std::invalid_argument("decode prefetch: bytes must be 0 (off) or a multiple of 64 up to 65536");
  __atomic_store_n(&g_decode_far_prefetch, bytes, __ATOMIC_RELAXED);
}

int decode_prefetch() { return __atomic_load_n(&g_decode_far_prefetch, __ATOMIC_RELAXED); }

void set_chunk_tokens(int tokens) {
  if (tokens < 0) throw std::invalid_argument("chunk tokens: 0 (computed from the scratch budget) or a positive cap");
  g_chunk_tokens.store(tokens, std::memory_order_relaxed);
}

int chunk_tokens() { return g_chunk_tokens.load(std::memory_order_relaxed); }

void set_int_acts_max_tokens(int tokens) {
  if (tokens < 1 || tokens > (1 << 20)) throw std::invalid_argument("int acts max tokens: 1..1048576");
  g_int_acts_max_tokens.store(tokens, std::memory_order_relaxed);
}

int int_acts_max_tokens() { return g_int_acts_max_tokens.load(std::memory_order_relaxed); }

}  // namespace lk
