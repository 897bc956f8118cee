// lk_moe._C: the module. The engine's process-wide parts (ISA tiers, CPU facts, thread pools, the
// benchmark and test hooks) here; the layers in the other files of this folder (common.h).
#include <algorithm>
#include <array>

#include "bindings/common.h"
#include "cpu/cpu_dispatch.h"
#include "cpu/cpu_features.h"
#include "cpu/format.h"
#include "cpu/cuda_host_call.h"
#include "cpu/host_memory.h"
#include "cpu/numa_topology.h"
#include "cpu/read_bandwidth.h"

using namespace lk_bind;

namespace {

// A two-valued process-wide hook: _set_<name>(value name) and _<name>() (the value's name).
template <typename E>
void def_switch(py::module_& m, const std::string& name, const std::string& what,
                const std::array<std::pair<const char*, E>, 2>& values, void (*set)(E), E (*get)(), const char* doc) {
  m.def(
      ("_set_" + name).c_str(),
      [=](const std::string& v) {
        for (const auto& [n, e] : values)
          if (v == n) return set(e);
        throw py::value_error(what + ": " + values[0].first + " or " + values[1].first + ", not '" + v + "'");
      },
      py::arg("name"), doc);
  m.def(("_" + name).c_str(), [=] { return std::string(get() == values[0].second ? values[0].first : values[1].first); });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lk_moe CPU engine";
  m.def("isa", [] { return std::string(lk::active_kernels()->name); }, "ISA tier in use");
  m.def("best_isa", &lk::best_isa);
  m.def("supported_isas", &lk::supported_isas);
  m.def("all_isas", &lk::all_isas);
  m.def("formats", [] {  // the names of the engine's format table, in its order
    std::vector<std::string> out;
    for (const lk::Format* f : lk::all_formats()) out.emplace_back(f->name);
    return out;
  });
  m.def("set_isa", [](const std::string& name) {
    try {
      lk::set_isa(name);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("cpu_brand", [] { return lk::cpu_features().brand; });
  m.def("alloc_count", &lk::alloc_count, "host buffers allocated so far by the engine");
  m.def("live_bytes", &lk::live_bytes, "host bytes held by the engine now");
  m.def("registered_host_bytes", &lk::registered_host_bytes,
        "host bytes the engine has page-locked for the GPU (cudaHostRegister) and not released");
  m.def("parse_cpu_list", &lk::parse_cpu_list);
  m.def("allowed_cpus", &lk::allowed_cpus);
  m.def(
      "read_topology",
      [](const std::string& root, std::vector<int> allowed) {
        if (allowed.empty()) allowed = lk::allowed_cpus();
        lk::Topology t = lk::read_topology(root, allowed);
        py::list nodes;
        for (const auto& n : t.nodes) {
          py::dict d;
          d["id"] = n.id;
          d["cores"] = n.cores;
          nodes.append(d);
        }
        py::dict out;
        out["nodes"] = nodes;
        out["numa_from_sysfs"] = t.numa_from_sysfs;
        out["physical_cores"] = t.physical_cores();
        out["logical_cpus"] = t.logical_cpus();
        return out;
      },
      py::arg("root") = "/sys", py::arg("allowed") = std::vector<int>{});

  py::class_<lk::ThreadPool, std::shared_ptr<lk::ThreadPool>>(m, "ThreadPool")
      .def(py::init([](int threads, const std::string& binding, int spin_us, const std::string& sysfs_root,
                       std::vector<int> allowed) {
             if (threads < 0 || threads > 4096) throw py::value_error("threads must be in 0..4096 (0 = physical cores)");
             if (spin_us < 0 || spin_us > 1000000) throw py::value_error("spin_us must be in 0..1000000");
             lk::PoolConfig c;
             c.threads = threads;
             c.binding = parse_binding(binding);
             c.spin_us = spin_us;
             c.sysfs_root = sysfs_root;
             c.allowed = std::move(allowed);
             return std::make_shared<lk::ThreadPool>(c);
           }),
           py::arg("threads") = 0, py::arg("binding") = "CPU_CORE", py::arg("spin_us") = 1000,
           py::arg("sysfs_root") = "/sys", py::arg("allowed") = std::vector<int>{})
      .def_property_readonly("num_threads", &lk::ThreadPool::num_threads)
      .def_property_readonly("num_nodes", &lk::ThreadPool::num_nodes)
      .def_property_readonly("numa_placement", &lk::ThreadPool::numa_placement)
      .def_property_readonly("spin_us", &lk::ThreadPool::spin_us)
      .def_property_readonly("jobs_run", &lk::ThreadPool::jobs_run)
      .def_property_readonly("futex_wakes", &lk::ThreadPool::futex_wakes)
      .def("wake", &lk::ThreadPool::wake, "bring parked workers back to spinning (a job is coming)")
      .def("node_id", &lk::ThreadPool::node_id)
      .def("threads_on_node", &lk::ThreadPool::threads_on_node)
      .def("cpus_of_thread", &lk::ThreadPool::cpus_of_thread)
      .def(
          "round_trip_us",
          [](lk::ThreadPool& p, int iters, int idle_us, int prewake_us) {
            if (iters < 1 || idle_us < 0) throw py::value_error("need iters >= 1 and idle_us >= 0");
            py::gil_scoped_release nogil;
            return p.round_trip_us(iters, idle_us, prewake_us);
          },
          py::arg("iters") = 50, py::arg("idle_us") = 0, py::arg("prewake_us") = -1,
          "submit-to-done time of an empty job (us); idle_us > spin_us measures wake-up from parked")
      .def(
          "measure_read_bandwidth",
          [](lk::ThreadPool& p, size_t bytes, int iters) {
            if (bytes < (size_t(1) << 20) || iters < 1) throw py::value_error("need bytes >= 1 MiB and iters >= 1");
            py::gil_scoped_release nogil;
            return lk::measure_read_bandwidth(p, bytes, iters);
          },
          py::arg("bytes"), py::arg("iters") = 5);

  m.def("cuda_runtime_available", [] {
    std::string why;
    bool ok = lk::cuda_runtime_available(&why);
    return py::make_tuple(ok, why);
  });
  // lk::DecodeWide by value, in its order
  static const std::array<std::string, 4> kDecodeWideNames = {"int8_act", "4bit", "quantized", "all"};
  m.def(
      "_set_decode_units",
      [](const std::string& wide, int units_per_thread) {
        const auto it = std::find(kDecodeWideNames.begin(), kDecodeWideNames.end(), wide);
        if (it == kDecodeWideNames.end())
          throw py::value_error("wide: int8_act, 4bit, quantized or all, not '" + wide + "'");
        lk::set_decode_units({lk::DecodeWide(it - kDecodeWideNames.begin()), units_per_thread});
      },
      py::arg("wide"), py::arg("units_per_thread"),
      "benchmark hook: which decode chunks start with wide work units, and the units per thread kept for "
      "balance (results are bit-identical under every setting)");
  m.def("_decode_units", [] {
    const lk::DecodeUnits u = lk::decode_units();
    return py::make_tuple(kDecodeWideNames[int(u.wide)], u.units_per_thread);
  });
  def_switch<lk::DecodeSchedule>(m, "decode_schedule", "schedule", {{{"units", lk::DecodeSchedule::kUnits},
                                                                     {"guided", lk::DecodeSchedule::kGuided}}},
                                 &lk::set_decode_schedule, &lk::decode_schedule,
                                 "benchmark hook: how decode chunks hand out their work, fixed units ('units') or "
                                 "guided self-scheduling ('guided'); results are bit-identical under both");
  def_switch<lk::Fp4DecodeActs>(m, "fp4_decode_acts", "fp4 decode acts", {{{"q15", lk::Fp4DecodeActs::kQ15},
                                                                          {"bf16", lk::Fp4DecodeActs::kBf16}}},
                                &lk::set_fp4_decode_acts, &lk::fp4_decode_acts,
                                "benchmark hook: the activations of mxfp4/nvfp4 decode chunks, 15-bit integer rows "
                                "('q15', the default) or bf16 ('bf16', the vdpbf16ps tile)");
  m.def(
      "_set_decode_prefetch", [](int bytes) { lk::set_decode_prefetch(bytes); }, py::arg("bytes"),
      "benchmark hook: how far ahead (bytes, 0 = off) the quantized decode tiles prefetch each weight "
      "stream into L2 (results are bit-identical under every setting)");
  m.def("_decode_prefetch", &lk::decode_prefetch);
  m.def("_set_chunk_tokens", &lk::set_chunk_tokens, py::arg("tokens"),
        "test hook: cap the tokens of an activation chunk (0, the default: from the scratch budget) so "
        "small forwards take the multi-chunk path");
  m.def("_chunk_tokens", &lk::chunk_tokens);
  m.def("_set_int_acts_max_tokens", &lk::set_int_acts_max_tokens, py::arg("tokens"),
        "benchmark hook: the most tokens a 4-bit format's chunk may hold to run on integer activations "
        "(q15 rows, q8 with LK_INT8_ACT; default 16: decode only)");
  m.def("_int_acts_max_tokens", &lk::int_acts_max_tokens);
  m.def("_kernel_poller_pause", &lk::kernel_poller_pause, py::arg("paused"),
        "test hook: while paused, the kernel signal's poller answers nothing (the GPU side times out)");
  def_host_call(m);
  def_layer(m);
}
