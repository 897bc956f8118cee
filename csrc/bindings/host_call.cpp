// CUDA-stream calls of a layer (lk_moe.cpu_path): a HostForward and the pinned tensors it reads and writes.
#include "bindings/common.h"
#include "cpu/cuda_host_call.h"

namespace lk_bind {

namespace {

// A HostForward plus the pinned tensors it reads and writes (kept alive with it).
struct HostCall {
  std::unique_ptr<lk::HostForward> impl;
  at::Tensor x, ids, weights, out;

  HostCall(const Layer& layer, const at::Tensor& x_h, const at::Tensor& ids_h, const at::Tensor& w_h,
           const at::Tensor& out_h, int64_t tokens, std::shared_ptr<lk::HostCallCounters> counters) {
    const auto& sh = layer.impl->shape();
    const DType xt = half_type(x_h, "x_host");
    if (out_h.scalar_type() != x_h.scalar_type()) throw py::type_error("out_host must have x_host's dtype");
    if (ids_h.scalar_type() != at::kInt) throw py::type_error("ids_host must be int32");
    if (w_h.scalar_type() != at::kFloat) throw py::type_error("weights_host must be float32");
    for (auto* t : {&x_h, &ids_h, &w_h, &out_h}) {
      if (!t->device().is_cpu() || !t->is_contiguous() || !t->is_pinned())
        throw py::value_error("host buffers must be contiguous pinned CPU tensors");
    }
    if (x_h.dim() != 2 || x_h.size(1) != sh.hidden || out_h.dim() != 2 || out_h.size(1) != sh.hidden)
      throw py::value_error("x_host/out_host must be [max_tokens, H]");
    if (ids_h.dim() != 2 || w_h.sizes() != ids_h.sizes() || ids_h.size(0) != x_h.size(0))
      throw py::value_error("ids_host/weights_host must be [max_tokens, K]");
    if (tokens < 1 || tokens > x_h.size(0)) throw py::value_error("tokens must be in 1..max_tokens");
    if (ids_h.size(1) < 1 || ids_h.size(1) > 64)
      throw py::value_error("ids_host must be [max_tokens, K] with 1 <= K <= 64, got " + shape_str(ids_h));
    lk::ForwardArgs a;
    a.x = x_h.data_ptr();
    a.x_type = xt;
    a.tokens = tokens;
    a.top_k = int(ids_h.size(1));
    a.ids = ids_h.data_ptr<int32_t>();
    a.weights = w_h.data_ptr<float>();
    a.out = out_h.data_ptr();
    a.out_type = xt;
    impl = std::make_unique<lk::HostForward>(layer.impl, a, std::move(counters));
    x = x_h;
    ids = ids_h;
    weights = w_h;
    out = out_h;
  }
};

}  // namespace

void def_host_call(py::module_& m) {
  py::class_<lk::HostCallCounters, std::shared_ptr<lk::HostCallCounters>>(
      m, "HostCallCounters", "running totals of the host-node runs of the HostCalls given this object")
      .def(py::init<>())
      .def("read", [](const lk::HostCallCounters& c) {
        // Relaxed loads: a run finishing in between may show in one total and not yet in another.
        const auto sum = [&](auto member) {
          return (c.decode.*member).load(std::memory_order_relaxed) + (c.prefill.*member).load(std::memory_order_relaxed);
        };
        return py::make_tuple(sum(&lk::PathCounters::calls), sum(&lk::PathCounters::rows), sum(&lk::PathCounters::ns));
      }, "(calls, rows with an expert id, nanoseconds), both paths")
      .def("read_paths", [](const lk::HostCallCounters& c) {
        const auto path = [](const lk::PathCounters& p) {
          return py::make_tuple(p.calls.load(std::memory_order_relaxed), p.rows.load(std::memory_order_relaxed),
                                p.ns.load(std::memory_order_relaxed));
        };
        return py::make_tuple(path(c.decode), path(c.prefill), c.queue_ns.load(std::memory_order_relaxed));
      }, "((calls, rows, ns) of decode-sized calls, the same of prefill-sized ones, queue-wait ns); "
         "decode-sized: fewer than decode_slots slots per active expert")
      .def_property_readonly_static("decode_slots", [](py::object) { return lk::HostCallCounters::kDecodeSlots; });
  py::class_<HostCall>(m, "HostCall")
      .def(py::init<const Layer&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                    std::shared_ptr<lk::HostCallCounters>>(),
           py::arg("layer"), py::arg("x_host"), py::arg("ids_host"), py::arg("weights_host"), py::arg("out_host"),
           py::arg("tokens"), py::arg("counters") = py::none())
      .def("enqueue", [](HostCall& h, uintptr_t stream) { h.impl->enqueue(stream); }, py::arg("stream"),
           "add the engine call to a CUDA stream (host-function node when capturing)")
      .def("enqueue_mailbox", [](HostCall& h, uintptr_t stream) { h.impl->enqueue_mailbox(stream); },
           py::arg("stream"), "the same through a mapped-memory mailbox (stream memory operations)")
      .def("kernel_args", [](HostCall& h) {
        const auto k = h.impl->kernel_args();
        return py::make_tuple(k.req, k.done, k.timeouts, k.call_id, k.x, k.ids, k.weights, k.out);
      }, "device addresses for the single-kernel signal (lk_cpu_call_kernel in lk_moe/_lk_cuda.so): "
         "(req, done, timeouts, call_id, x, ids, weights, out); registers the call with the kernel poller")
      .def("take_errors", [](HostCall& h) { return h.impl->take_errors(); })
      .def_property_readonly("last_host_us", [](const HostCall& h) { return h.impl->last_host_us(); });

}

}  // namespace lk_bind
