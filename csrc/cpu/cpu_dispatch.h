// Which kernel tier runs: the best the CPU has, or the one LK_ISA / set_isa() asks for.
#pragma once

#include <string>
#include <vector>

#include "cpu/kernel_table.h"

namespace lk {

// Tier names, lowest first (isa_tiers.h).
const std::vector<std::string>& all_isas();
std::vector<std::string> supported_isas();
std::string best_isa();

// The active table (never null). Reads are lock-free; a forward reads it once.
const KernelTable* active_kernels();

// Force a tier. Throws std::invalid_argument naming the tier and what the CPU has.
void set_isa(const std::string& name);

}  // namespace lk
