// What the CPU (and the OS) let us use, read once with cpuid/xgetbv.
#pragma once

#include <string>

namespace lk {

struct CpuFeatures {
  bool generic = true;       // every x86-64 CPU (the baseline tier; isa_tiers.h)
  bool avx2 = false;         // AVX2 + FMA + F16C, OS saves YMM
  bool avx512 = false;       // AVX-512 F/BW/VL/DQ, OS saves ZMM
  bool avx512_bf16 = false;  // + AVX512_BF16 + AVX512_VNNI + AVX512_VBMI
  bool amx = false;          // AMX-TILE + AMX-BF16 + AMX-INT8, kernel granted XTILEDATA
  std::string brand;
};

// Detected once (thread-safe); asks the kernel for AMX tile permission when the CPU has AMX.
const CpuFeatures& cpu_features();

}  // namespace lk
