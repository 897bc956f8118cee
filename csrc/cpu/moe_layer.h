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
#include <string>
#include <variant>
#include <vector>

#include "cpu/host_memory.h"
#include "cpu/kernel_table.h"
#include "cpu/thread_pool.h"

namespace lk {

struct Format;  // format.h: what the layer's expert format owns (layout, checks, repacking, task weights)

struct MoEShape {
  int experts = 0;       // E
  int intermediate = 0;  // I
  int hidden = 0;        // H
  int kp1 = 0;           // H padded to kPadK (phase-1 reduction length)
  int kp2 = 0;           // I padded to kPadK (phase-2 reduction length, act row length)
  int i_blocks = 0;      // kp2 / 16: I-blocks (blocks past I hold zero weights)
  int h_blocks = 0;      // ceil(H / 16)
  const Format* format = nullptr;  // the expert format (format.h, formats/*.cpp)
  // The format's parameters for this layer (set by its configure):
  int seg1 = 0, seg2 = 0;     // inputs per packed scale of w13 (over H) and w2 (over I); 0: no scales. fp8_block:
                              // the checkpoint's block width; the per-row formats: the dequantization chunk;
                              // wna16_int4: the engine segment of its groups; mxfp4 32, nvfp4 16
  bool zero_points = false;   // wna16_int4: zero points stored (else the symmetric zero 8)
  bool fp16_scales = false;   // wna16_int4: 16-bit scales are fp16 (else bf16)
  bool bias = false;          // w13 / w2 biases held (bf16)
  float alpha = 1.702f, limit = 7.0f;  // swigluoai constants; limit: the clamped silu's too (kSiLUClamp);
                                       // kSitu: beta, linear_beta (0: up not clipped)
  bool int8_act = false;      // 4-bit formats on int8 activations (LK_INT8_ACT): decode chunks (<= kQ8MaxTokens),
                              // and prefill ones where the tier's int8 tiles are faster (KernelTable::q8_prefill)
};

// The checkpoint's tensors besides the codes, one struct per format family (vLLM layouts; each
// format's file in formats/ describes its layout and the vLLM sources it follows).
// One-byte codes (fp8_block, fp8_channel, int8_channel): fp32 scales.
struct ByteScales {
  const float* s13 = nullptr;  // block: [E, ceil(2I/bn), H/bk] (w13_weight_scale_inv); per row: [E, 2I]
  const float* s2 = nullptr;   // block: [E, ceil(H/bn), I/bk]; per row: [E, H]
  int bn = 0, bk = 0;          // block: scale block rows x cols; 0 x 0: one scale per row
};
// mxfp8 (OCP MX FP8: fp8 e4m3fn codes [E, 2I, H] / [E, H, I]): one e8m0 scale byte (2^(s - 127)) per output row
// and 32 inputs, [E, 2I, ceil(H/32)] / [E, H, ceil(I/32)].
struct E8m0Scales {
  const uint8_t* s13 = nullptr;
  const uint8_t* s2 = nullptr;
};
// wna16_int4 (codes: w13 int32 [E, H/8, 2I], w2 int32 [E, I/8, H], K-first): group scales and zero points.
struct Int4Groups {
  const uint16_t* s13 = nullptr;  // w13_weight_scale [E, H/gs1, 2I] (bf16 or fp16 bits)
  const uint16_t* s2 = nullptr;   // w2_weight_scale [E, I/gs2, H]
  const int32_t* z13 = nullptr;   // w13_weight_zero_point [E, H/gs1, ceil(2I/8)] or null (symmetric)
  const int32_t* z2 = nullptr;    // w2_weight_zero_point [E, I/gs2, ceil(H/8)]
  int gs1 = 0, gs2 = 0;           // group sizes along H (w13) and I (w2)
  bool fp16_scale = false;
};
// mxfp4 (codes: w13 uint8 [E, r13, c13] with r13 = 2 * I_pad >= 2I, c13 * 2 >= H; w2 uint8 [E, r2, c2] with
// r2 >= H, c2 * 2 >= I): e8m0 scales [E, r13, cs13] and [E, r2, cs2] (cs13 * 32 >= H, cs2 * 32 >= I).
// nvfp4: the same with fp8 e4m3fn scales, cs13 = H/16, cs2 = I/16, no padding, no biases, [gate; up]
// rows, and the fp32 global scales (weight_scale_2).
struct Fp4Blocks {
  const uint8_t* s13 = nullptr;
  const uint8_t* s2 = nullptr;
  const uint16_t* b13 = nullptr;  // w13_bias bf16 [E, r13] or null
  const uint16_t* b2 = nullptr;   // w2_bias bf16 [E, r2] or null
  int r13 = 0, c13 = 0, cs13 = 0, r2 = 0, c2 = 0, cs2 = 0;
  bool interleaved = false;       // w13 row 2j = gate_j, 2j + 1 = up_j (else gate rows [0, r13/2), up after)
  const float* g13 = nullptr;     // nvfp4: w13_weight_scale_2 [E, 2]: gate (w1) and up (w3) of each expert
  const float* g2 = nullptr;      // nvfp4: w2_weight_scale_2 [E]
};

// Expert weights as the checkpoint holds them, filled by the checkpoint adapters
// (bindings/checkpoints.cpp) and read by the layer's format (formats/*.cpp).
struct WeightSource {
  DType type = DType::kBF16;  // kBF16 / kFP16, or kFP8E4M3 / kINT8 with scales, or kINT4, kMXFP4, kNVFP4, kMXFP8
  const void* w13 = nullptr;  // the codes: [E, 2I, H] (bf16, fp16, one-byte codes; the 4-bit ones above)
  const void* w2 = nullptr;   // [E, H, I]
  std::variant<std::monostate, ByteScales, Int4Groups, Fp4Blocks, E8m0Scales> rest;  // none for bf16 / fp16
  float clamp_limit = 0;  // Activation::kSiLUClamp: the bound of gate (above) and up (both sides), > 0
  float situ_beta = 0, situ_linear_beta = 0;  // Activation::kSitu: beta > 0; linear_beta > 0, or 0 for none
  float oai_alpha = 1.702f, oai_limit = 7.0f;  // Activation::kSwigluOAI: alpha finite, limit > 0 (gpt-oss's)
  // The rest as the format expects it; std::invalid_argument when the adapter filled another kind.
  template <class T>
  const T& as() const {
    if (const T* p = std::get_if<T>(&rest)) return *p;
    throw std::invalid_argument("expert weights of dtype " + std::to_string(int(type)) +
                                " came without the tensors their format needs");
  }
};

struct NodeSlice {
  int ib0 = 0, ib1 = 0;  // I-blocks owned
  int hb0 = 0, hb1 = 0;  // H-blocks owned
  HostBuffer w13;        // [E][ib1-ib0][gate block, up block]
  HostBuffer w2;         // [E][hb1-hb0][block]
  HostBuffer s13, s2;    // scales, zero points and biases, laid out by the format (formats/*.cpp)
  HostBuffer z13, z2;
  HostBuffer b13, b2;    // biases, bf16: [E][ib1-ib0][2][16], [E][hb1-hb0][16]
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
  kInt8Act = 0,    // only int8-activation chunks (LK_INT8_ACT: the 4-bit formats, int8_channel)
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
// The most tokens a chunk of a 4-bit format may hold to run on integer activations (q15 rows, or q8 with
// LK_INT8_ACT): kQ8MaxTokens by default (decode); benchmark hook for the prefill A/B of issue 29 (the chunk
// budget does not count q15 rows: raised, a prefill chunk's scratch outgrows kChunkBudget).
void set_int_acts_max_tokens(int tokens);
int int_acts_max_tokens();
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
  // Per-expert fp32 global scales (nvfp4), [E][2] (gate, up) and [E]; empty otherwise.
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
  std::vector<float> gs13_, gs2_;  // per-expert global scales (nvfp4)
  std::mutex submit_mu_;  // callers may be Python threads and CUDA's callback/poller threads
  ForwardJob job_;
  bool submitted_ = false;
  std::vector<std::function<void()>> cleanup_;
};

}  // namespace lk
