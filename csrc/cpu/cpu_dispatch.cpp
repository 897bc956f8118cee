#include "cpu/cpu_dispatch.h"

#include <atomic>
#include <stdexcept>

#include "cpu/cpu_features.h"

namespace lk {
namespace {

struct Tier {
  const char* name;
  const KernelTable* (*table)();
  bool (*supported)(const CpuFeatures&);
};

const Tier kTiers[] = {
    {"generic", &tier_generic::kernel_table, [](const CpuFeatures&) { return true; }},
    {"avx2", &tier_avx2::kernel_table, [](const CpuFeatures& f) { return f.avx2; }},
    {"avx512", &tier_avx512::kernel_table, [](const CpuFeatures& f) { return f.avx512; }},
    {"avx512_bf16", &tier_avx512_bf16::kernel_table, [](const CpuFeatures& f) { return f.avx512_bf16; }},
    {"amx", &tier_amx::kernel_table, [](const CpuFeatures& f) { return f.amx; }},
};

const KernelTable* best_table() {
  const KernelTable* best = nullptr;
  for (const Tier& t : kTiers)
    if (t.supported(cpu_features())) best = t.table();
  return best;
}

std::atomic<const KernelTable*>& active() {
  static std::atomic<const KernelTable*> table{best_table()};
  return table;
}

}  // namespace

const std::vector<std::string>& all_isas() {
  static const std::vector<std::string> names = {"generic", "avx2", "avx512", "avx512_bf16", "amx"};
  return names;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  for (const Tier& t : kTiers)
    if (t.supported(cpu_features())) out.push_back(t.name);
  return out;
}

std::string best_isa() { return best_table()->name; }

const KernelTable* active_kernels() { return active().load(std::memory_order_acquire); }

void set_isa(const std::string& name) {
  std::string have;
  for (const std::string& s : supported_isas()) have += (have.empty() ? "" : ", ") + s;
  for (const Tier& t : kTiers) {
    if (name != t.name) continue;
    if (!t.supported(cpu_features()))
      throw std::invalid_argument("ISA tier '" + name + "' is not supported by this CPU (" + cpu_features().brand +
                                  "); supported: " + have);
    active().store(t.table(), std::memory_order_release);
    return;
  }
  throw std::invalid_argument("unknown ISA tier '" + name + "'; expected one of generic, avx2, avx512, avx512_bf16, amx");
}

}  // namespace lk
