#include "cpu/numa_topology.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace lk {
namespace {

bool read_first_line(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::getline(f, *out);
  return true;
}

int read_int(const std::string& path, int fallback) {
  std::string s;
  if (!read_first_line(path, &s)) return fallback;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  return end == s.c_str() ? fallback : int(v);
}

std::vector<int> sysfs_node_ids(const std::string& root) {
  std::vector<int> ids;
  DIR* d = opendir((root + "/devices/system/node").c_str());
  if (!d) return ids;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 4 && n.compare(0, 4, "node") == 0 &&
        n.find_first_not_of("0123456789", 4) == std::string::npos)
      ids.push_back(std::atoi(n.c_str() + 4));
  }
  closedir(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Group CPUs into physical cores by (package, core_id); unknown -> each CPU its own core.
std::vector<std::vector<int>> group_cores(const std::string& root, const std::vector<int>& cpus) {
  std::map<std::pair<int, int>, std::vector<int>> by_core;
  for (int cpu : cpus) {
    const std::string base = root + "/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int pkg = read_int(base + "physical_package_id", 0);
    int core = read_int(base + "core_id", -1 - cpu);
    by_core[{pkg, core}].push_back(cpu);
  }
  std::vector<std::vector<int>> cores;
  for (auto& kv : by_core) cores.push_back(kv.second);
  std::sort(cores.begin(), cores.end());  // by first CPU id
  return cores;
}

}  // namespace

int NumaNode::num_cpus() const {
  int n = 0;
  for (const auto& c : cores) n += int(c.size());
  return n;
}

int Topology::physical_cores() const {
  int n = 0;
  for (const auto& node : nodes) n += int(node.cores.size());
  return n;
}

int Topology::logical_cpus() const {
  int n = 0;
  for (const auto& node : nodes) n += node.num_cpus();
  return n;
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part.erase(std::remove_if(part.begin(), part.end(), [](char c) { return c == ' ' || c == '\n'; }), part.end());
    if (part.empty()) continue;
    size_t dash = part.find('-');
    char* end = nullptr;
    long lo = std::strtol(part.c_str(), &end, 10);
    if (end == part.c_str() || lo < 0) continue;
    long hi = lo;
    if (dash != std::string::npos) {
      hi = std::strtol(part.c_str() + dash + 1, &end, 10);
      if (hi < lo || hi - lo > 65536) continue;
    }
    for (long c = lo; c <= hi; ++c) out.push_back(int(c));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

Topology read_topology(const std::string& root, const std::vector<int>& allowed) {
  Topology topo;
  std::set<int> allowed_set(allowed.begin(), allowed.end());
  std::set<int> placed;
  for (int id : sysfs_node_ids(root)) {
    std::string list;
    if (!read_first_line(root + "/devices/system/node/node" + std::to_string(id) + "/cpulist", &list)) continue;
    std::vector<int> cpus;
    for (int c : parse_cpu_list(list))
      if (allowed_set.count(c) && !placed.count(c)) cpus.push_back(c);
    if (cpus.empty()) continue;  // memory-only node, or none of our CPUs
    placed.insert(cpus.begin(), cpus.end());
    NumaNode node;
    node.id = id;
    node.cores = group_cores(root, cpus);
    topo.nodes.push_back(std::move(node));
  }
  topo.numa_from_sysfs = !topo.nodes.empty();
  std::vector<int> rest;
  for (int c : allowed)
    if (!placed.count(c)) rest.push_back(c);
  if (!rest.empty()) {
    if (topo.nodes.empty()) {
      NumaNode node;
      node.id = 0;
      node.cores = group_cores(root, rest);
      topo.nodes.push_back(std::move(node));
    } else {  // CPUs sysfs did not place: give them to the first node rather than drop them
      auto extra = group_cores(root, rest);
      auto& cores = topo.nodes.front().cores;
      cores.insert(cores.end(), extra.begin(), extra.end());
    }
  }
  return topo;
}

}  // namespace lk
