// lk_moe._C.Layer: bf16 / fp16 experts, the forward (submit and its Handle) and the layer's properties.
#include "bindings/common.h"

namespace lk_bind {

Layer::Layer(std::shared_ptr<lk::ThreadPool> pool, const at::Tensor& w13, const at::Tensor& w2,
             const std::string& activation, double swiglu_limit, double situ_beta, double situ_linear_beta,
             double swiglu_alpha) {
  const ActivationArg act = parse_activation(activation, swiglu_limit, situ_beta, situ_linear_beta, "bf16", swiglu_alpha);
  const DType t13 = half_type(w13, "w13"), t2 = half_type(w2, "w2");
  if (t13 != t2) throw py::type_error("w13 and w2 must have the same dtype, got " + dtype_name(w13) + " and " + dtype_name(w2));
  if (w13.dim() != 3) throw py::value_error("w13 must have shape [E, 2*I, H], got " + shape_str(w13));
  const int64_t E = w13.size(0), I2 = w13.size(1), H = w13.size(2);
  if (E < 1 || I2 < 2 || I2 % 2 || H < 1)
    throw py::value_error("w13 must have shape [E, 2*I, H] with E >= 1, I >= 1, H >= 1, got " + shape_str(w13));
  const int64_t I = I2 / 2;
  const std::string want2 = "[E, H, I] = [" + std::to_string(E) + ", " + std::to_string(H) + ", " + std::to_string(I) + "]";
  require_shape(w2, "w2", {E, H, I}, want2.c_str());
  require_cpu_contiguous(w13, "w13");
  require_cpu_contiguous(w2, "w2");
  if (E > (1 << 20) || H > (1 << 20) || I > (1 << 20)) throw py::value_error("expert dimensions are implausibly large: " + shape_str(w13));
  lk::WeightSource src;
  src.type = t13;
  src.w13 = w13.data_ptr();
  src.w2 = w2.data_ptr();
  impl = build(std::move(pool), src, E, I, H, act).impl;
}

// Builds the engine layer without the GIL; a shape the engine cannot take is a ValueError.
Layer Layer::build(std::shared_ptr<lk::ThreadPool> pool, lk::WeightSource src, int64_t E, int64_t I,
                   int64_t H, ActivationArg act) {
  Layer l;
  src.clamp_limit = act.clamp_limit;
  src.situ_beta = act.situ_beta;
  src.situ_linear_beta = act.situ_linear_beta;
  src.oai_alpha = act.oai_alpha;
  src.oai_limit = act.oai_limit;
  try {
    py::gil_scoped_release nogil;
    l.impl = std::make_shared<lk::MoELayer>(std::move(pool), src, int(E), int(I), int(H), act.act);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return l;
}

Handle Layer::submit(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights, const at::Tensor& out) {
  const auto& sh = impl->shape();
  const DType xt = half_type(x, "x");
  if (x.dim() != 2 || x.size(1) != sh.hidden)
    throw py::value_error("x must have shape [M, H] with H = " + std::to_string(sh.hidden) + ", got " + shape_str(x));
  const int64_t M = x.size(0);
  if (ids.scalar_type() != at::kInt) throw py::type_error("topk_ids must be int32, got " + dtype_name(ids));
  if (ids.dim() != 2 || ids.size(0) != M || ids.size(1) < 1 || ids.size(1) > 64)
    throw py::value_error("topk_ids must have shape [M, K] with M = " + std::to_string(M) + " and 1 <= K <= 64, got " +
                          shape_str(ids));
  const int64_t K = ids.size(1);
  if (weights.scalar_type() != at::kFloat) throw py::type_error("topk_weights must be float32, got " + dtype_name(weights));
  const std::string wshape = "[M, K] = [" + std::to_string(M) + ", " + std::to_string(K) + "]";
  require_shape(weights, "topk_weights", {M, K}, wshape.c_str());
  if (out.scalar_type() != x.scalar_type())
    throw py::type_error("out must have x's dtype " + dtype_name(x) + ", got " + dtype_name(out));
  const std::string oshape = "[M, H] = [" + std::to_string(M) + ", " + std::to_string(sh.hidden) + "]";
  require_shape(out, "out", {M, int64_t(sh.hidden)}, oshape.c_str());
  require_cpu_contiguous(x, "x");
  require_cpu_contiguous(ids, "topk_ids");
  require_cpu_contiguous(weights, "topk_weights");
  require_cpu_contiguous(out, "out");
  impl->check_ids(ids.data_ptr<int32_t>(), M * K);

  Handle h;
  h.layer = impl;
  h.x = x;
  h.ids = ids;
  h.weights = weights;
  h.out = out;
  if (M == 0) return h;
  lk::ForwardArgs a;
  a.x = x.data_ptr();
  a.x_type = xt;
  a.tokens = M;
  a.top_k = int(K);
  a.ids = ids.data_ptr<int32_t>();
  a.weights = weights.data_ptr<float>();
  a.out = out.data_ptr();
  a.out_type = xt;
  {
    py::gil_scoped_release nogil;  // may wait for this layer's previous forward
    h.seq = impl->submit(a);
  }
  h.pending = true;
  return h;
}

void def_layer(py::module_& m) {
  py::class_<Handle>(m, "Handle").def("wait", &Handle::wait).def("done", &Handle::done);

  py::class_<Layer> layer(m, "Layer");
  layer
      .def(py::init<std::shared_ptr<lk::ThreadPool>, const at::Tensor&, const at::Tensor&, const std::string&, double,
                    double, double, double>(),
           py::arg("pool"), py::arg("w13"), py::arg("w2"), py::arg("activation") = "silu", py::arg("swiglu_limit") = 0.0,
           py::arg("situ_beta") = 0.0, py::arg("situ_linear_beta") = 0.0, py::arg("swiglu_alpha") = 1.702);
  def_checkpoints(layer);
  def_dequantized(layer);
  layer
      .def_property_readonly("format", [](const Layer& l) {
        const auto& sh = l.impl->shape();
        return sh.format->name;
      })
      .def("submit", &Layer::submit, py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"), py::arg("out"))
      .def_property_readonly("nbytes", [](const Layer& l) { return l.impl->nbytes(); })
      .def_property_readonly("num_experts", [](const Layer& l) { return l.impl->shape().experts; })
      .def_property_readonly("hidden_size", [](const Layer& l) { return l.impl->shape().hidden; })
      .def_property_readonly("intermediate_size", [](const Layer& l) { return l.impl->shape().intermediate; })
      .def_property_readonly("last_compute_us", [](const Layer& l) { return l.impl->last_compute_us(); })
      .def_property_readonly("last_phase_us",
                             [](const Layer& l) {
                               const auto p = l.impl->last_phase_times();
                               py::dict d;
                               d["gate_up"] = p.gate_up_us;
                               d["down"] = p.down_us;
                               d["gate_up_spread"] = p.gate_up_spread_us;
                               d["down_spread"] = p.down_spread_us;
                               return d;
                             })
      .def_property_readonly("num_slices", [](const Layer& l) { return int(l.impl->slices().size()); });
  def_gpu_export(layer);
  layer      .def_property_readonly("padded_dims", [](const Layer& l) {
        const auto& sh = l.impl->shape();
        return py::make_tuple(sh.kp1, sh.kp2, sh.h_blocks * lk::kBlockN);
      })
      .def("slice_bounds", [](const Layer& l, int s) {
        const auto& sl = l.impl->slices().at(s);
        return py::make_tuple(sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN, sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN);
      });
}

}  // namespace lk_bind
