#include "cpu/moe_layer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/cpu_dispatch.h"
#include "cpu/format.h"

namespace lk {
namespace {

constexpr int kPieceRows = kMaxRowsPerTask;  // phase-1 token rows per unit (bounds per-task scratch)
constexpr int kRangeTokensMax = 1024;  // phase-2 tokens per unit (bounds the fp32 accumulator)
constexpr size_t kChunkBudget = size_t(256) << 20;  // activation scratch per chunk of tokens
constexpr int kSlack = 32;
constexpr int kWideGroup = 8;          // blocks per unit for prefill-sized chunks             // readable rows past the last slot (AMX reads 32-row tiles)

// Pool shared-buffer slots (one job runs at a time, so they are reused by every layer).
enum SharedSlot { kCounts, kActiveExpert, kActiveBegin, kSlotToken, kSlotWeight, kPieces, kAct, kXbf16, kXq8, kActq8 };
// Per-worker buffer slots.
enum WorkerSlot { kTileC, kPanel, kOutAcc, kRowPtrs, kRepackRow, kDequant, kRowSums, kQ8RowPtrs, kF32Panels };
static_assert(kF32Panels < kWorkerBufferSlots && kActq8 < kSharedBufferSlots, "buffer slots");

int round_up(int v, int a) { return (v + a - 1) / a * a; }

// LK_INT8_ACT: int8 activations in the decode of the formats that have it (Format::int8_act), and in their
// prefill on the tiers where the int8 tiles outrun the bf16 panels (KernelTable::q8_prefill). auto
// (default) and 0/false/no/off: none (the 4-bit formats take 15-bit activations; format.h says why);
// 1/true/yes/on: all of them. LK_WNA16_INT8_ACT, its first name (it only ever switched wna16_int4, and
// knows no "auto"), is read when it is unset or empty. Empty (or blank) means unset, as for every LK_*
// variable; lk_moe.config validates both names (ConfigError) before any layer is built, so the throw below is a
// backstop for callers of the engine that bypass it.
struct Int8ActVariable {
  const char* name;
  bool all_formats;  // false for the first name
};

// first_name_applies: the format is the one LK_WNA16_INT8_ACT switches (wna16_int4).
bool int8_act_from_env(bool first_name_applies) {
  for (const Int8ActVariable var : {Int8ActVariable{"LK_INT8_ACT", true}, Int8ActVariable{"LK_WNA16_INT8_ACT", false}}) {
    const char* v = std::getenv(var.name);
    if (!v) continue;
    std::string s(v);
    const auto blank = [](unsigned char ch) { return std::isspace(ch) != 0; };
    s.erase(std::find_if_not(s.rbegin(), s.rend(), blank).base(), s.end());  // trimmed, as lk_moe.config does
    s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), blank));
    if (s.empty()) continue;
    for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (s == "auto" && var.all_formats) return false;
    if (s == "1" || s == "true" || s == "yes" || s == "on") return var.all_formats || first_name_applies;
    if (s == "0" || s == "false" || s == "no" || s == "off") return false;
    throw std::invalid_argument(std::string(var.name) + "=" + v + " is not a switch: use " +
                                (var.all_formats ? "auto, " : "") + "1/0, true/false, yes/no or on/off");
  }
  return false;
}
size_t elem_size(DType t) { return t == DType::kFP32 ? 4 : 2; }

// Split `blocks` among node slots in proportion to their threads.
std::vector<int> split_blocks(int blocks, const ThreadPool& pool) {
  std::vector<int> bounds(pool.num_nodes() + 1, 0);
  const int total = pool.num_threads();
  int cum = 0;
  for (int s = 0; s < pool.num_nodes(); ++s) {
    cum += pool.threads_on_node(s);
    bounds[s + 1] = int(int64_t(blocks) * cum / total);
  }
  return bounds;
}

// Repack: checkpoint rows -> packed blocks (the format's repack13 / repack2 per unit), run by the
// threads of the node that owns each slice so first touch places the pages there even without mbind.
class RepackJob : public Job {
 public:
  RepackJob(const MoEShape& sh, std::vector<NodeSlice>& slices, const WeightSource& src, const KernelTable* kt)
      : sh_(sh), slices_(slices), src_(src), kt_(kt), next_(slices.size()) {
    for (auto& n : next_) n.store(0);
  }

  // One unit = one expert's gate+up block pair or down block.
  void run(WorkerCtx& ctx) override {
    NodeSlice& sl = slices_[ctx.node];
    const int nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
    const int64_t units = int64_t(sh_.experts) * (nbi + nbh);
    for (int64_t u; (u = next_[ctx.node].fetch_add(1)) < units;) {
      if (u < int64_t(sh_.experts) * nbi) {
        const int e = int(u / nbi), lb = int(u % nbi);
        sh_.format->repack13({sh_, src_, sl, kt_, ctx, kRepackRow, e, lb, (sl.ib0 + lb) * kBlockN,
                              (size_t(e) * nbi + lb) * 2});
      } else {
        u -= int64_t(sh_.experts) * nbi;
        const int e = int(u / nbh), lb = int(u % nbh);
        sh_.format->repack2({sh_, src_, sl, kt_, ctx, kRepackRow, e, lb, (sl.hb0 + lb) * kBlockN, size_t(e) * nbh + lb});
      }
    }
  }

 private:
  const MoEShape& sh_;
  std::vector<NodeSlice>& slices_;
  WeightSource src_;
  const KernelTable* kt_;
  std::vector<std::atomic<int64_t>> next_;
};

}  // namespace

// ------------------------------------------------------------------ MoELayer

MoELayer::MoELayer(std::shared_ptr<ThreadPool> pool, const WeightSource& src, int experts, int intermediate,
                   int hidden, Activation act)
    : pool_(std::move(pool)), act_(act) {
  const Format& fmt = format_of(src);
  shape_.format = &fmt;
  shape_.experts = experts;
  shape_.intermediate = intermediate;
  shape_.hidden = hidden;
  shape_.kp1 = round_up(hidden, kPadK);
  shape_.kp2 = round_up(intermediate, kPadK);
  shape_.i_blocks = shape_.kp2 / kBlockN;
  shape_.h_blocks = (hidden + kBlockN - 1) / kBlockN;
  fmt.configure(src, shape_, gs13_, gs2_);
  shape_.int8_act = fmt.int8_act && int8_act_from_env(fmt.family == Family::kInt4);
  if (act == Activation::kSwigluOAI) {  // every format (gate_act_16)
    if (!std::isfinite(src.oai_alpha) || !(src.oai_limit > 0) || !std::isfinite(src.oai_limit))
      throw std::invalid_argument("swigluoai needs a finite swiglu_alpha and a finite swiglu_limit > 0, got " +
                                  std::to_string(src.oai_alpha) + " and " + std::to_string(src.oai_limit));
    shape_.alpha = src.oai_alpha;
    shape_.limit = src.oai_limit;
  }
  if (act == Activation::kSiLUClamp) {
    if (!(src.clamp_limit > 0) || !std::isfinite(src.clamp_limit))
      throw std::invalid_argument("the clamped silu needs a finite swiglu_limit > 0, got " + std::to_string(src.clamp_limit));
    shape_.limit = src.clamp_limit;
  }
  if (act == Activation::kSitu) {
    if (!(src.situ_beta > 0) || !std::isfinite(src.situ_beta) || !(src.situ_linear_beta >= 0) ||
        !std::isfinite(src.situ_linear_beta))
      throw std::invalid_argument("the situ activation needs a finite beta > 0 and a finite linear_beta >= 0 "
                                  "(0: none), got " + std::to_string(src.situ_beta) + " and " +
                                  std::to_string(src.situ_linear_beta));
    shape_.alpha = src.situ_beta;
    shape_.limit = src.situ_linear_beta;
  }
  if (pool_->num_nodes() > 64) throw std::invalid_argument("more than 64 NUMA nodes with threads are not supported");

  const std::vector<int> ib = split_blocks(shape_.i_blocks, *pool_);
  const std::vector<int> hb = split_blocks(shape_.h_blocks, *pool_);
  slices_.resize(pool_->num_nodes());
  for (int s = 0; s < pool_->num_nodes(); ++s) {
    NodeSlice& sl = slices_[s];
    sl.ib0 = ib[s];
    sl.ib1 = ib[s + 1];
    sl.hb0 = hb[s];
    sl.hb1 = hb[s + 1];
    fmt.allocate(shape_, sl, pool_->numa_placement() ? pool_->node_id(s) : -1);
  }
  RepackJob repack(shape_, slices_, src, active_kernels());
  pool_->submit(&repack);
  repack.wait();
}

MoELayer::~MoELayer() {
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (submitted_) job_.wait();
  for (auto& fn : cleanup_) fn();
}

size_t MoELayer::nbytes() const {
  size_t n = 0;
  for (const auto& s : slices_) n += s.w13.size() + s.w2.size() + s.s13.size() + s.s2.size() + s.z13.size() + s.z2.size() +
                                   s.b13.size() + s.b2.size();
  return n + (gs13_.size() + gs2_.size()) * sizeof(float);
}

void MoELayer::check_ids(const int32_t* ids, int64_t count) const {
  const int E = shape_.experts;
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < -1 || ids[i] >= E)
      throw std::invalid_argument("topk_ids holds expert id " + std::to_string(ids[i]) + " at flat index " +
                                  std::to_string(i) + "; valid ids are 0.." + std::to_string(E - 1) +
                                  " (or -1 for an unused slot)");
  }
}

uint32_t MoELayer::submit(const ForwardArgs& args) {
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (submitted_) job_.wait();
  job_.prepare(this, args, active_kernels());
  submitted_ = true;
  return pool_->submit(&job_);
}

// ------------------------------------------------------------------ ForwardJob

void ForwardJob::prepare(const MoELayer* layer, const ForwardArgs& args, const KernelTable* kernels) {
  layer_ = layer;
  a_ = args;
  kt_ = kernels;
  start_ns_.store(INT64_MAX, std::memory_order_relaxed);
  end_ns_.store(0, std::memory_order_relaxed);
  const MoEShape& sh = layer->shape();
  copy_x_ = args.x_type != DType::kBF16 || sh.kp1 != sh.hidden;
  size_t per_token = size_t(args.top_k) * (sh.kp2 * 2 + 8) + (copy_x_ ? size_t(sh.kp1) * 2 : 0);
  if (sh.int8_act && kernels->q8_prefill)  // prefill chunks quantize x and act too (plan_chunk: xq_, aq_)
    per_token += size_t(args.top_k) * q8_row_bytes(sh.kp2) + q8_row_bytes(sh.kp1);
  int64_t chunk = int64_t(kChunkBudget / per_token);
  if (const int cap = chunk_tokens(); cap > 0) chunk = std::min<int64_t>(chunk, cap);
  chunk_tokens_ = int(std::max<int64_t>(1, std::min<int64_t>(args.tokens, chunk)));
}

namespace {

// Hands out one phase's work: (major, block range) units over majors x nb blocks (major: a phase-1
// piece, or a phase-2 token range). Fixed units: `group` blocks per fetch. Guided self-scheduling
// (decode chunks, DecodeSchedule::kGuided): each claim takes 1/(2 x threads) of the blocks left, 1 to
// kWideGroup blocks of one major, so the weight streams start long and the phase ends on short claims
// that even out when the threads finish. False once the phase's work is all handed out.
bool claim_unit(std::atomic<int>& next, int majors, int nb, int group, bool guided, int threads, int* major,
                int* lb0, int* lb1) {
  if (!guided) {
    const int ngroups = (nb + group - 1) / group;
    const int u = next.fetch_add(1, std::memory_order_relaxed);
    if (u >= majors * ngroups) return false;
    *major = u / ngroups;
    *lb0 = (u % ngroups) * group;
    *lb1 = std::min(nb, *lb0 + group);
    return true;
  }
  const int total = majors * nb;
  int cur = next.load(std::memory_order_relaxed);
  int n;
  do {
    if (cur >= total) return false;
    n = std::max(1, std::min(kWideGroup, (total - cur) / (2 * threads)));
    n = std::min(n, nb - cur % nb);  // within one major
  } while (!next.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  *major = cur / nb;
  *lb0 = cur % nb;
  *lb1 = *lb0 + n;
  return true;
}

void store_min(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t cur = a.load(std::memory_order_relaxed);
       v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed);) {
  }
}

void store_max(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t cur = a.load(std::memory_order_relaxed);
       v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed);) {
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void ForwardJob::phase_out(PhaseClock& c, int64_t t) {
  store_min(c.first_out, t);
  store_max(c.last_out, t);
}

ForwardJob::PhaseTimes ForwardJob::phase_times() const {
  auto us = [](const std::atomic<int64_t>& a, const std::atomic<int64_t>& b) {
    return double(b.load(std::memory_order_relaxed) - a.load(std::memory_order_relaxed)) * 1e-3;
  };
  const PhaseClock &g = gate_up_times_, &d = down_times_;
  return PhaseTimes{us(g.first_in, g.last_out), us(d.first_in, d.last_out), us(g.first_out, g.last_out),
                    us(d.first_out, d.last_out)};
}

void ForwardJob::run(WorkerCtx& ctx) {
  // Timed from the first worker in to the last worker out, without an extra barrier.
  store_min(start_ns_, now_ns());
  for (int64_t t0 = 0; t0 < a_.tokens; t0 += chunk_tokens_) {
    const int tc = int(std::min<int64_t>(chunk_tokens_, a_.tokens - t0));
    if (ctx.tid == 0) plan_chunk(ctx, t0, tc);
    ctx.barrier();
    if (copy_x_ || q8_) {
      convert_inputs(ctx, t0, tc);
      ctx.barrier();
    }
    store_min(gate_up_times_.first_in, now_ns());
    phase_gate_up(ctx);
    phase_out(gate_up_times_, now_ns());
    ctx.barrier();
    if (q8_) {
      quantize_act(ctx);
      ctx.barrier();
    }
    store_min(down_times_.first_in, now_ns());
    phase_down(ctx, t0, tc);
    phase_out(down_times_, now_ns());
    if (t0 + tc < a_.tokens) ctx.barrier();  // the next plan overwrites this chunk's scratch
  }
  store_max(end_ns_, now_ns());
}

// Group the chunk's (token, k) slots by expert (counting sort keeps tokens ascending
// within an expert) and size the work units. Runs on worker 0 only.
void ForwardJob::plan_chunk(WorkerCtx& ctx, int64_t t0, int tc) {
  const MoEShape& sh = layer_->shape();
  ThreadPool& pool = *ctx.pool;
  const int E = sh.experts, K = a_.top_k;
  const size_t S = size_t(tc) * K;
  auto buf = [&](int slot, size_t bytes) {
    HostBuffer& b = pool.shared_buffer(slot);
    b.ensure(bytes);
    return b.data();
  };
  int32_t* cursor = static_cast<int32_t*>(buf(kCounts, size_t(E) * 4));
  active_expert_ = static_cast<int32_t*>(buf(kActiveExpert, size_t(E) * 4));
  active_begin_ = static_cast<int32_t*>(buf(kActiveBegin, size_t(E + 1) * 4));
  slot_token_ = static_cast<int32_t*>(buf(kSlotToken, S * 4));
  slot_weight_ = static_cast<float*>(buf(kSlotWeight, S * 4));
  pieces_ = static_cast<int32_t*>(buf(kPieces, (S / kPieceRows + E + 1) * 3 * 4));
  act_ = static_cast<uint16_t*>(buf(kAct, (S + kSlack) * sh.kp2 * 2));
  const int int_max = int_acts_max_tokens();
  q15_ = sh.format->q15_decode && !sh.int8_act && kt_->q15_row && tc <= int_max &&
         fp4_decode_acts() == Fp4DecodeActs::kQ15;
  q8_ = (sh.int8_act && kt_->q8_row && (tc <= int_max || kt_->q8_prefill)) || q15_;
  if (q8_) {
    xq_ = static_cast<int8_t*>(buf(kXq8, size_t(tc) * int_row_bytes(sh.kp1)));
    aq_ = static_cast<int8_t*>(buf(kActq8, S * int_row_bytes(sh.kp2)));
  }
  if (copy_x_) {
    x_rows_base_ = static_cast<uint16_t*>(buf(kXbf16, size_t(tc) * sh.kp1 * 2));
    x_ld_ = sh.kp1;
  } else {
    x_rows_base_ = static_cast<const uint16_t*>(a_.x) + size_t(t0) * sh.hidden;
    x_ld_ = sh.hidden;
  }

  for (PhaseClock* c : {&gate_up_times_, &down_times_}) {
    c->first_in.store(INT64_MAX, std::memory_order_relaxed);
    c->first_out.store(INT64_MAX, std::memory_order_relaxed);
    c->last_out.store(0, std::memory_order_relaxed);
  }
  const int32_t* ids = a_.ids + t0 * K;
  const float* w = a_.weights + t0 * K;
  memset(cursor, 0, size_t(E) * 4);
  for (size_t i = 0; i < S; ++i)
    if (ids[i] >= 0) ++cursor[ids[i]];
  int A = 0, pos = 0;
  for (int e = 0; e < E; ++e) {
    const int n = cursor[e];
    cursor[e] = pos;
    if (n == 0) continue;
    active_expert_[A] = e;
    active_begin_[A] = pos;
    ++A;
    pos += n;
  }
  active_begin_[A] = pos;
  num_active_ = A;
  for (size_t i = 0; i < S; ++i) {
    const int e = ids[i];
    if (e < 0) continue;
    const int p = cursor[e]++;
    slot_token_[p] = int32_t(i / K);
    slot_weight_[p] = w[i];
  }

  num_pieces_ = 0;
  for (int a = 0; a < A; ++a)
    for (int r = active_begin_[a]; r < active_begin_[a + 1]; r += kPieceRows) {
      int32_t* pc = pieces_ + 3 * num_pieces_++;
      pc[0] = a;
      pc[1] = r;
      pc[2] = std::min(r + kPieceRows, active_begin_[a + 1]);
    }

  // Prefill-sized chunks: wide units amortise the A panel and the accumulator over more columns;
  // keep >= 4 units per thread for balance. Decode-sized chunks (see DecodeUnits): one block per unit
  // spreads few experts' weights over all threads, but a block is a short stream (quantized: 6-32 KiB)
  // that pays DRAM latency, so the policy may start them wide as well.
  const bool wide = A > 0 && pos / A >= 16;
  token_ranges_ = (tc + kRangeTokensMax - 1) / kRangeTokensMax;
  guided_ = !wide && decode_schedule() == DecodeSchedule::kGuided;
  if (guided_) {  // claims size themselves, up to kWideGroup blocks (the phase-2 accumulator's width)
    group1_ = group2_ = kWideGroup;
  } else {
    const DecodeUnits du = decode_units();
    // The policies nest (DecodeWide's order): the least one that covers this layer's format.
    const DecodeWide covers = sh.format->decode_wide;
    const bool start_wide = wide || q8_ || du.wide >= covers;
    int max_threads = 1;
    for (int s = 0; s < pool.num_nodes(); ++s) max_threads = std::max(max_threads, pool.threads_on_node(s));
    const int min_units = (wide ? 4 : du.units_per_thread) * max_threads;
    const auto& sl0 = layer_->slices()[0];
    const int nbi0 = sl0.ib1 - sl0.ib0, nbh0 = sl0.hb1 - sl0.hb0;
    group1_ = start_wide ? kWideGroup : 1;
    while (group1_ > 1 && num_pieces_ * ((nbi0 + group1_ - 1) / group1_) < min_units) group1_ /= 2;
    group2_ = start_wide ? kWideGroup : 1;
    while (group2_ > 1 && token_ranges_ * ((nbh0 + group2_ - 1) / group2_) < min_units) group2_ /= 2;
    while (token_ranges_ * ((nbh0 + group2_ - 1) / group2_) < min_units && tc / (token_ranges_ * 2) >= 16)
      token_ranges_ *= 2;
  }

  for (int s = 0; s < pool.num_nodes(); ++s) {
    next1_[s].store(0, std::memory_order_relaxed);
    next2_[s].store(0, std::memory_order_relaxed);
  }
}

void ForwardJob::convert_inputs(WorkerCtx& ctx, int64_t t0, int tc) {
  const MoEShape& sh = layer_->shape();
  const size_t esz = elem_size(a_.x_type);
  uint16_t* xb = const_cast<uint16_t*>(x_rows_base_);
  for (int r = ctx.tid; r < tc; r += ctx.num_threads) {
    if (copy_x_)
      kt_->to_bf16(static_cast<const char*>(a_.x) + (size_t(t0) + r) * sh.hidden * esz, a_.x_type,
                   xb + size_t(r) * sh.kp1, sh.hidden, sh.kp1);
    if (q8_) int_row_fn()(x_rows_base_ + size_t(r) * x_ld_, sh.kp1, xq_ + size_t(r) * int_row_bytes(sh.kp1));
  }
}

// The act rows of every slot as q8 rows (4-bit decode), before phase 2.
void ForwardJob::quantize_act(WorkerCtx& ctx) {
  const MoEShape& sh = layer_->shape();
  const int S = active_begin_[num_active_];
  for (int p = ctx.tid; p < S; p += ctx.num_threads)
    int_row_fn()(act_ + size_t(p) * sh.kp2, sh.kp2, aq_ + size_t(p) * int_row_bytes(sh.kp2));
}

KernelScratch ForwardJob::scratch(WorkerCtx& ctx, const MoEShape& sh) {
  KernelScratch ks;
  ks.c = static_cast<float*>(ctx.buffer(kTileC, 32 * 64 * 4));
  ks.panel = nullptr;
  const bool quant = sh.format->family != Family::kBf16;
  // two whole blocks: bf16 and their fp32 group scales (the prefill panels of the AVX-512 tiers; the one-byte
  // formats: two sets of two bf16 panels, the next pair dequantized while the tiles run over this one) or
  // fp32 (the avx2 tier's), and at least the two kMaxSeg segments of the generic tier's prefill
  const size_t kp = size_t(std::max({sh.kp1, sh.kp2, kMaxSeg}));
  ks.deq = quant ? static_cast<uint16_t*>(ctx.buffer(kDequant, size_t(2) * kBlockN * kp * 4 + 64)) : nullptr;
  ks.acc = quant ? static_cast<float*>(ctx.buffer(kRowSums, size_t(kMaxRowsPerTask) * 32 * 4)) : nullptr;
  // (reserved on every tier: pages no tier touches are never committed)
  ks.f32 = quant ? static_cast<float*>(ctx.buffer(kF32Panels, size_t(2 * kBlockN + kF32PanelRows) * kp * 4)) : nullptr;
  return ks;
}

void ForwardJob::phase_gate_up(WorkerCtx& ctx) {
  const MoEShape& sh = layer_->shape();
  const NodeSlice& sl = layer_->slices()[ctx.node];
  const int nbi = sl.ib1 - sl.ib0;
  if (nbi == 0) return;
  const int threads = ctx.pool->threads_on_node(ctx.node);
  KernelScratch ks = scratch(ctx, sh);
  ks.panel = static_cast<uint16_t*>(ctx.buffer(kPanel, size_t(kPieceRows + 32) * sh.kp1 * 2));
  auto rows = static_cast<const uint16_t**>(ctx.buffer(kRowPtrs, kPieceRows * sizeof(void*)));
  auto rows8 = q8_ ? static_cast<const int8_t**>(ctx.buffer(kQ8RowPtrs, kPieceRows * sizeof(void*))) : nullptr;
  const size_t q8_ld1 = int_row_bytes(sh.kp1);
  for (int piece, lb0, lb1;
       claim_unit(next1_[ctx.node], num_pieces_, nbi, group1_, guided_, threads, &piece, &lb0, &lb1);) {
    const int32_t* pc = pieces_ + 3 * piece;
    const int e = active_expert_[pc[0]];
    for (int p = pc[1]; p < pc[2]; ++p) rows[p - pc[1]] = x_rows_base_ + size_t(slot_token_[p]) * x_ld_;
    if (q8_)
      for (int p = pc[1]; p < pc[2]; ++p) rows8[p - pc[1]] = xq_ + size_t(slot_token_[p]) * q8_ld1;
    GateUpTask t;
    t.x_rows = rows;
    t.m = pc[2] - pc[1];
    t.nblk = lb1 - lb0;
    t.kp = sh.kp1;
    t.act = act_ + size_t(pc[1]) * sh.kp2 + size_t(sl.ib0 + lb0) * kBlockN;
    t.act_ld = sh.kp2;
    t.act_fn = layer_->activation();
    t.scratch = &ks;
    sh.format->gate_up_task({sh, sl, *layer_, e, size_t(e) * nbi + lb0}, t);
    t.q8_rows = rows8;  // null unless a 4-bit decode chunk with int8 activations
    t.q15 = q15_;
    t.bias = sh.bias ? sl.b13.as<uint16_t>() + (size_t(e) * nbi + lb0) * 2 * kBlockN : nullptr;
    t.alpha = sh.alpha;
    t.limit = sh.limit;
    kt_->gate_up(t);
  }
}

void ForwardJob::phase_down(WorkerCtx& ctx, int64_t t0, int tc) {
  const MoEShape& sh = layer_->shape();
  const NodeSlice& sl = layer_->slices()[ctx.node];
  const int nbh = sl.hb1 - sl.hb0;
  if (nbh == 0) return;
  const int threads = ctx.pool->threads_on_node(ctx.node);
  const int range = (tc + token_ranges_ - 1) / token_ranges_;
  const size_t out_ld = size_t(group2_) * kBlockN;
  KernelScratch ks = scratch(ctx, sh);
  float* acc = static_cast<float*>(ctx.buffer(kOutAcc, size_t(range) * out_ld * 4));
  const size_t osz = elem_size(a_.out_type);
  for (int rg, lb0, lb1;
       claim_unit(next2_[ctx.node], token_ranges_, nbh, group2_, guided_, threads, &rg, &lb0, &lb1);) {
    const int tr0 = rg * range, tr1 = std::min(tc, tr0 + range);
    if (tr0 >= tr1) continue;
    memset(acc, 0, size_t(tr1 - tr0) * out_ld * 4);
    for (int a = 0; a < num_active_; ++a) {
      // This expert's slots whose token lies in [tr0, tr1): a contiguous run (tokens ascend).
      const int32_t* b = slot_token_ + active_begin_[a];
      const int32_t* e_ = slot_token_ + active_begin_[a + 1];
      const int32_t* p0 = std::lower_bound(b, e_, tr0);
      const int32_t* p1 = std::lower_bound(p0, e_, tr1);
      if (p0 == p1) continue;
      const size_t s0 = size_t(p0 - slot_token_);
      DownTask t;
      t.act = act_ + s0 * sh.kp2;
      t.act_ld = sh.kp2;
      t.m = int(p1 - p0);
      t.nblk = lb1 - lb0;
      t.kp = sh.kp2;
      t.row_weight = slot_weight_ + s0;
      t.out_row = p0;              // chunk-local token ...
      t.out_acc = acc - size_t(tr0) * out_ld;  // ... so shift the accumulator's origin by tr0 rows
      t.out_ld = out_ld;
      t.scratch = &ks;
      sh.format->down_task({sh, sl, *layer_, active_expert_[a], size_t(active_expert_[a]) * nbh + lb0}, t);
      if (q8_) {  // 4-bit decode chunk with int8 activations
        t.q8_ld = int_row_bytes(sh.kp2);
        t.q8_act = aq_ + s0 * t.q8_ld;
        t.q15 = q15_;
      }
      kt_->down(t);
      if (sh.bias) {  // out += w * b2 (the bias is part of the expert output the router weight scales)
        const uint16_t* bias = sl.b2.as<uint16_t>() + (size_t(active_expert_[a]) * nbh + lb0) * kBlockN;
        float bf[kWideGroup * kBlockN];
        const int nc = t.nblk * kBlockN;
        for (int n = 0; n < nc; ++n) {
          const uint32_t bits = uint32_t(bias[n]) << 16;
          memcpy(&bf[n], &bits, 4);
        }
        for (int r = 0; r < t.m; ++r) {
          float* o = t.out_acc + size_t(t.out_row[r]) * t.out_ld;
          const float w = t.row_weight[r];
          for (int n = 0; n < nc; ++n) o[n] += w * bf[n];
        }
      }
    }
    const int col0 = (sl.hb0 + lb0) * kBlockN;
    const int ncols = std::min(sh.hidden, (sl.hb0 + lb1) * kBlockN) - col0;
    for (int r = tr0; r < tr1; ++r)
      kt_->store_row(acc + size_t(r - tr0) * out_ld,
                     static_cast<char*>(a_.out) + ((size_t(t0) + r) * sh.hidden + col0) * osz, a_.out_type, ncols);
  }
}

}  // namespace lk
