// GPU fallback for quantized experts: the engine's packed byte blocks -> plain bf16 rows.
//
// The CPU engine keeps each expert once, in blocks of 16 output rows whose inputs are stored in
// pairs: byte (k/2)*32 + 2n + (k&1) of a block holds the code of row n, input k (kp inputs per
// row, zero codes past the real input count). The streamed GPU path copies those bytes as they
// are; where the GPU has no native kernel for the format (FP8 before sm_89) this kernel turns a
// chunk of blocks into bf16 rows [blocks*16, kp] for a bf16 GEMM. Scales are fp32: one per row
// (per-channel formats) or one per (block, segment of `seg` inputs) (block-quantized FP8).
//
// A C ABI (no torch headers): the Python side passes raw device pointers and the stream, so this
// library builds with nvcc alone and loads wherever a CUDA driver is present.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

enum Codes : int { kFP8E4M3 = 0, kINT8 = 1 };

__device__ __forceinline__ float decode(uint8_t c, int codes) {
  if (codes == kINT8) return float(int8_t(c));
  __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3);
  return __half2float(__half(h));
}

// One thread per (block, input pair, row): 2 codes in, 2 bf16 out.
__global__ void dequant_blocks_kernel(const uint16_t* __restrict__ packed, const float* __restrict__ scales,
                                      __nv_bfloat162* __restrict__ out, int64_t blocks, int kp, int seg,
                                      int codes) {
  const int pairs = kp / 2;
  const int64_t per_block = int64_t(pairs) * 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < blocks * per_block;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / per_block;
    const int rem = int(i - b * per_block);
    const int p = rem / 16, n = rem % 16;  // consecutive threads: consecutive rows of one pair
    const uint16_t two = packed[i];        // == packed[b * per_block + p * 16 + n]
    const float s = seg > 0 ? scales[b * (kp / seg) + (2 * p) / seg] : scales[b * 16 + n];
    const float lo = decode(uint8_t(two & 0xff), codes) * s;
    const float hi = decode(uint8_t(two >> 8), codes) * s;
    out[(b * 16 + n) * pairs + p] = __floats2bfloat162_rn(lo, hi);
  }
}

}  // namespace

#define LK_EXPORT __attribute__((visibility("default")))

extern "C" {

// Returns a cudaError_t (0 = success). `stream` is a cudaStream_t (e.g. torch's current stream).
LK_EXPORT int lk_dequant_blocks(const void* packed, const float* scales, void* out, int64_t blocks, int kp, int seg,
                      int codes, void* stream) {
  if (blocks <= 0) return 0;
  if (kp <= 0 || kp % 2 || (seg > 0 && (seg % 2 || kp % seg)) || (codes != kFP8E4M3 && codes != kINT8))
    return int(cudaErrorInvalidValue);
  const int64_t work = blocks * (kp / 2) * 16;
  const int threads = 256;
  const int64_t want = (work + threads - 1) / threads;
  const int grid = int(want < 65535 * 8 ? want : 65535 * 8);
  dequant_blocks_kernel<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint16_t*>(packed), scales, static_cast<__nv_bfloat162*>(out), blocks, kp, seg, codes);
  return int(cudaGetLastError());
}

// The architectures this library was compiled for, as nvcc saw them (for `lvllm doctor`).
LK_EXPORT const char* lk_cuda_archs() { return LK_CUDA_ARCHS; }

}  // extern "C"
