// NUMA nodes and physical cores of the CPUs this process may run on, read from sysfs.
//
// Works without any NUMA information (desktop, VM, container): everything then
// forms one node. Nodes without allowed CPUs (memory-only, or outside our
// cpuset) are left out. Never aborts: unreadable files degrade to simpler answers.
#pragma once

#include <string>
#include <vector>

namespace lk {

struct NumaNode {
  int id = 0;                           // kernel node id (may be sparse)
  std::vector<std::vector<int>> cores;  // physical cores, each its allowed logical CPUs (siblings)
  int num_cpus() const;
};

struct Topology {
  std::vector<NumaNode> nodes;
  bool numa_from_sysfs = false;  // false: one synthetic node (no NUMA info)
  int physical_cores() const;
  int logical_cpus() const;
};

std::vector<int> parse_cpu_list(const std::string& text);  // "0-3,8,10-11" -> {0,1,2,3,8,10,11}
std::vector<int> allowed_cpus();                           // sched_getaffinity of this process

// sysfs_root is normally "/sys"; tests point it at a synthetic tree.
Topology read_topology(const std::string& sysfs_root, const std::vector<int>& allowed);

}  // namespace lk
