#include "cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace lk {
namespace {

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

// Linux gates AMX tile data per process (arch_prctl ARCH_REQ_XCOMP_PERM, kernel >= 5.16).
bool request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12);
  const bool f16c = c & (1u << 29);
  const bool avx = c & (1u << 28);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  const bool tile_os = (xcr0 & (3ull << 17)) == (3ull << 17);

  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7)) {
    unsigned bb, cc, dd;
    __get_cpuid_count(7, 1, &a71, &bb, &cc, &dd);
  }
  const bool avx2 = b7 & (1u << 5);
  const bool avx512f = b7 & (1u << 16), avx512dq = b7 & (1u << 17);
  const bool avx512bw = b7 & (1u << 30), avx512vl = b7 & (1u << 31);
  const bool vnni = c7 & (1u << 11), vbmi = c7 & (1u << 1);
  const bool bf16 = a71 & (1u << 5);
  const bool amx_bf16 = d7 & (1u << 22), amx_tile = d7 & (1u << 24), amx_int8 = d7 & (1u << 25);

  f.avx2 = avx && avx2 && fma && f16c && ymm_os;
  f.avx512 = f.avx2 && avx512f && avx512dq && avx512bw && avx512vl && zmm_os;
  f.avx512_bf16 = f.avx512 && bf16 && vnni && vbmi;  // (VBMI: the fp8 tables; Cooper Lake lacks it: avx512)
  f.amx = f.avx512_bf16 && amx_tile && amx_bf16 && amx_int8 && tile_os && request_amx_permission();

  char brand[49] = {0};
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4];
      __get_cpuid(0x80000002 + i, &r[0], &r[1], &r[2], &r[3]);
      memcpy(brand + 16 * i, r, 16);
    }
  }
  f.brand = brand;
  while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace lk
