#include "cpu/format.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace lk {

const Format& format_of(const WeightSource& src) {
  switch (src.type) {
    case DType::kBF16:
    case DType::kFP16: return kBf16Format;
    case DType::kFP8E4M3: {
      const ByteScales& sc = src.as<ByteScales>();
      return sc.bn == 0 && sc.bk == 0 ? kFp8ChannelFormat : kFp8BlockFormat;  // 0 x 0: one scale per row
    }
    case DType::kINT8: return kInt8ChannelFormat;
    case DType::kINT4: return kWna16Int4Format;
    case DType::kMXFP4: return kMxfp4Format;
    case DType::kNVFP4: return kNvfp4Format;
    case DType::kMXFP8: return kMxfp8Format;
    default: break;
  }
  throw std::invalid_argument("no expert format holds weights of dtype " + std::to_string(int(src.type)));
}

const std::vector<const Format*>& all_formats() {
  static const std::vector<const Format*> rows = {&kBf16Format,        &kFp8BlockFormat,  &kFp8ChannelFormat,
                                                  &kInt8ChannelFormat, &kMxfp8Format,     &kWna16Int4Format,
                                                  &kMxfp4Format,       &kNvfp4Format};
  return rows;
}

// Element (n, k) goes to (k/2)*32 + 2n + (k&1): a 16 x kp/2 transpose of element pairs.
void pack_block(const char* src, int r0, int rows, int k, int kp, size_t esz, DType type, const KernelTable* kt,
                char* tmp, char* dst) {
  const int pairs = kp / 2;
  if (esz == 1) {
    for (int n = 0; n < kBlockN; ++n) {
      char* t = tmp + size_t(n) * kp;
      if (r0 + n < rows) {
        memcpy(t, src + size_t(r0 + n) * k, k);
        memset(t + k, 0, kp - k);  // padding inputs: zero codes (zero weights)
      } else {
        memset(t, 0, kp);
      }
    }
    const uint16_t* t16 = reinterpret_cast<const uint16_t*>(tmp);
    uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
    for (int p = 0; p < pairs; ++p)
      for (int n = 0; n < kBlockN; ++n) d16[size_t(p) * kBlockN + n] = t16[size_t(n) * pairs + p];
    return;
  }
  for (int n = 0; n < kBlockN; ++n) {
    uint16_t* t = reinterpret_cast<uint16_t*>(tmp) + size_t(n) * kp;
    if (r0 + n < rows) kt->to_bf16(src + size_t(r0 + n) * k * 2, type, t, k, kp);
    else memset(t, 0, size_t(kp) * 2);
  }
  const uint32_t* t32 = reinterpret_cast<const uint32_t*>(tmp);
  uint32_t* d32 = reinterpret_cast<uint32_t*>(dst);
  for (int p = 0; p < pairs; ++p)
    for (int n = 0; n < kBlockN; ++n) d32[size_t(p) * kBlockN + n] = t32[size_t(n) * pairs + p];
}

}  // namespace lk
