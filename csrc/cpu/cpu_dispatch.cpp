#include "cpu/cpu_dispatch.h"

#include <atomic>
#include <stdexcept>

#include "cpu/cpu_features.h"
#include "cpu/isa_tiers.h"

namespace lk {
namespace {

struct Tier {
  const char* name;
  const KernelTable* (*table)();
  bool (*supported)(const CpuFeatures&);
};

const Tier kTiers[] = {
#define LK_TIER_ROW(name, feature, flags) {#name, &tier_##name::kernel_table, [](const CpuFeatures& f) { return f.feature; }},
    LK_ISA_TIERS(LK_TIER_ROW)
#undef LK_TIER_ROW
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& s : names) out += (out.empty() ? "" : ", ") + s;
  return out;
}

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
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Tier& t : kTiers) v.push_back(t.name);
    return v;
  }();
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
  const std::string have = joined(supported_isas());
  for (const Tier& t : kTiers) {
    if (name != t.name) continue;
    if (!t.supported(cpu_features()))
      throw std::invalid_argument("ISA tier '" + name + "' is not supported by this CPU (" + cpu_features().brand +
                                  "); supported: " + have);
    active().store(t.table(), std::memory_order_release);
    return;
  }
  throw std::invalid_argument("unknown ISA tier '" + name + "'; expected one of " + joined(all_isas()));
}

}  // namespace lk
