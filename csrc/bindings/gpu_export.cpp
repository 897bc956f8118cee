// Views of the packed weights for the GPU paths (lk_moe.gpu_dequant, the expert streamer): zero-copy
// tensors over the engine's host buffers, each keeping the layer alive, and their page-locking.
#include "bindings/common.h"
#include "cpu/cuda_host_call.h"
#include "cpu/host_memory.h"

namespace lk_bind {

void def_gpu_export(py::class_<Layer>& layer) {
  layer.def("packed_slices",
           [](const Layer& l) {
             // Views of the packed weights (bf16), for streaming them to a GPU. Each view keeps
             // the layer's memory alive. w13: [E, nbi, 2, kp1/2, 16, 2]; w2: [E, nbh, kp2/2, 16, 2].
             const auto& sh = l.impl->shape();
             if (sh.format->family != lk::Family::kBf16)
               throw py::value_error(sh.format->family == lk::Family::kByteCodes
                                         ? "packed_slices() gives bf16/fp16 experts; this layer has byte weights "
                                           "(fp8/int8 codes + fp32 scales): use quant_slices()"
                                         : "packed_slices() gives bf16/fp16 experts; this layer has 4-bit weights "
                                           "(wna16_int4 / mxfp4 / nvfp4): use quant4_slices()");
             py::list out;
             auto keep = l.impl;
             auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               at::Tensor w13 = torch::from_blob(sl.w13.data(), {sh.experts, nbi, 2, sh.kp1 / 2, 16, 2},
                                                 [keep](void*) {}, opts);
               at::Tensor w2 = torch::from_blob(sl.w2.data(), {sh.experts, nbh, sh.kp2 / 2, 16, 2},
                                                [keep](void*) {}, opts);
               out.append(py::make_tuple(w13, w2, sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN,
                                         sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN));
             }
             return out;
           })
      .def_property_readonly("byte_codes",
           [](const Layer& l) -> py::object {
             // Byte-weight layers: (codes, seg) for lk_moe.gpu_dequant: "fp8_e4m3" or "int8", and
             // the inputs per scale (0: one scale per row) for both projections; None otherwise.
             const auto& sh = l.impl->shape();
             if (sh.format->family != lk::Family::kByteCodes || sh.format->mx) return py::none();
             return py::make_tuple(sh.format->int8_codes ? "int8" : "fp8_e4m3", sh.format->per_row ? 0 : sh.seg1);
           })
      .def("quant_slices",
           [](const Layer& l) {
             // Byte-weight layers (fp8_block / fp8_channel / int8_channel / mxfp8): per NUMA slice, views
             // of the packed codes and their scales, for streaming them to a GPU (each view keeps the
             // layer's memory alive). (w13 uint8 [E, nbi, 2, kp1/2, 16, 2], s13, w2 uint8
             // [E, nbh, kp2/2, 16, 2], s2, i0, i1, h0, h1): the codes in the bf16 block layout of
             // packed_slices (one byte per weight); scales fp32 s13 [E, nbi, 2, P1], s2 [E, nbh, P2] with
             // P = 16 (one scale per row) or kp/seg (one per segment of seg inputs, shared by the block's
             // rows); mxfp8: uint8 e8m0 s13 [E, nbi, 2, kp1/32, 16], s2 [E, nbh, kp2/32, 16], one per row
             // and 32 inputs.
             const auto& sh = l.impl->shape();
             if (sh.format->family != lk::Family::kByteCodes)
               throw py::value_error(std::string("quant_slices() is for byte-weight layers (fp8_block, fp8_channel, "
                                                 "int8_channel, mxfp8); this layer is ") +
                                     sh.format->name +
                                     (sh.format->family == lk::Family::kBf16 ? " (use packed_slices)" : " (use quant4_slices)"));
             const bool mx = sh.format->mx;
             // a block's scales after the leading dims: mxfp8 [kp/seg, 16], else [16] or [kp/seg]
             auto scale_dims = [&](std::vector<int64_t> dims, int64_t kp, int seg) {
               if (mx) dims.insert(dims.end(), {kp / seg, lk::kBlockN});
               else dims.push_back(sh.format->per_row ? lk::kBlockN : kp / seg);
               return dims;
             };
             py::list out;
             auto keep = l.impl;
             auto u8 = at::TensorOptions().dtype(at::kByte).device(at::kCPU);
             auto scale_opts = mx ? u8 : at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               auto view = [&](const lk::HostBuffer& b, at::IntArrayRef shape, const at::TensorOptions& o) {
                 return torch::from_blob(b.data(), shape, [keep](void*) {}, o);
               };
               at::Tensor w13 = view(sl.w13, {sh.experts, nbi, 2, sh.kp1 / 2, 16, 2}, u8);
               at::Tensor s13 = view(sl.s13, scale_dims({sh.experts, nbi, 2}, sh.kp1, sh.seg1), scale_opts);
               at::Tensor w2 = view(sl.w2, {sh.experts, nbh, sh.kp2 / 2, 16, 2}, u8);
               at::Tensor s2 = view(sl.s2, scale_dims({sh.experts, nbh}, sh.kp2, sh.seg2), scale_opts);
               out.append(py::make_tuple(w13, s13, w2, s2, sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN,
                                         sl.hb0 * lk::kBlockN, sl.hb1 * lk::kBlockN));
             }
             return out;
           })
      .def("quant4_slices",
           [](const Layer& l) {
             // 4-bit layers (wna16_int4, mxfp4, nvfp4): per NUMA slice, a dict of zero-copy views of the
             // packed buffers (each keeps the layer's memory alive), shaped for plain-torch
             // dequantization (lk_moe.gpu_dequant.dequant4_blocks). A block is 16 output rows x kp
             // inputs in kp/4 quads of 32 bytes; byte (q, n, j) holds element (n, 4q + j) in its low
             // nibble and (n, 4q + 2 + j) in its high one (moe_layer.cpp pack_int4 / pack_fp4).
             //   w13 uint8 [E, nbi, 2, kp1/4, 16, 2] (gate block, then up), w2 uint8 [E, nbh, kp2/4, 16, 2];
             //   s13 [E, nbi, 2, kp1/G, 16], s2 [E, nbh, kp2/G, 16]: one scale per row and G inputs;
             //     int4 bf16/fp16 (G = the engine segment), mxfp4 uint8 e8m0 (G = 32), nvfp4 float8_e4m3fn
             //     (G = 16); nvfp4 global scales: global_scales();
             //   int4 with zero points: z13 uint8 [E, nbi, 2, kp1/G, 8], z2 [E, nbh, kp2/G, 8], row n's
             //     zero point in nibble n % 2 of byte n / 2 (low first);
             //   mxfp4 with biases: b13 bf16 [E, nbi, 2, 16], b2 bf16 [E, nbh, 16];
             //   bounds: (i0, i1, h0, h1).
             const auto& sh = l.impl->shape();
             if (sh.format->family != lk::Family::kInt4 && sh.format->family != lk::Family::kFp4)
               throw py::value_error(std::string("quant4_slices() is for 4-bit layers (wna16_int4, mxfp4, nvfp4); "
                                                 "this layer is ") +
                                     (sh.format->family == lk::Family::kByteCodes ? "byte-weight (use quant_slices)" : "bf16 (use packed_slices)"));
             const int64_t g1 = sh.seg1, g2 = sh.seg2;  // inputs per scale
             const auto scale_type = sh.format->family == lk::Family::kInt4 ? (sh.fp16_scales ? at::kHalf : at::kBFloat16)
                                             : sh.format->nv ? at::kFloat8_e4m3fn : at::kByte;
             const int64_t E = sh.experts, kp1 = sh.kp1, kp2 = sh.kp2;
             py::list out;
             auto keep = l.impl;
             auto opts = at::TensorOptions().device(at::kCPU);
             for (const auto& sl : l.impl->slices()) {
               const int64_t nbi = sl.ib1 - sl.ib0, nbh = sl.hb1 - sl.hb0;
               auto view = [&](const lk::HostBuffer& b, at::IntArrayRef shape, at::ScalarType t) {
                 return torch::from_blob(b.data(), shape, [keep](void*) {}, opts.dtype(t));
               };
               py::dict d;
               d["w13"] = view(sl.w13, {E, nbi, 2, kp1 / 4, 16, 2}, at::kByte);
               d["s13"] = view(sl.s13, {E, nbi, 2, kp1 / g1, 16}, scale_type);
               d["w2"] = view(sl.w2, {E, nbh, kp2 / 4, 16, 2}, at::kByte);
               d["s2"] = view(sl.s2, {E, nbh, kp2 / g2, 16}, scale_type);
               if (sh.zero_points) {
                 d["z13"] = view(sl.z13, {E, nbi, 2, kp1 / g1, 8}, at::kByte);
                 d["z2"] = view(sl.z2, {E, nbh, kp2 / g2, 8}, at::kByte);
               }
               if (sh.bias) {
                 d["b13"] = view(sl.b13, {E, nbi, 2, 16}, at::kBFloat16);
                 d["b2"] = view(sl.b2, {E, nbh, 16}, at::kBFloat16);
               }
               d["bounds"] = py::make_tuple(sl.ib0 * lk::kBlockN, sl.ib1 * lk::kBlockN, sl.hb0 * lk::kBlockN,
                                            sl.hb1 * lk::kBlockN);
               out.append(d);
             }
             return out;
           })
      .def("global_scales",
           [](const Layer& l) -> py::object {
             // nvfp4: views of the per-expert fp32 global scales (w13 [E, 2]: gate, up; w2 [E]); None otherwise.
             const auto& sh = l.impl->shape();
             if (!sh.format->nv) return py::none();
             auto keep = l.impl;
             auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
             // from_blob wants a mutable pointer; the views are read by the GPU copy only.
             at::Tensor g13 = torch::from_blob(const_cast<float*>(l.impl->global_scales13()), {sh.experts, 2},
                                               [keep](void*) {}, f32);
             at::Tensor g2 = torch::from_blob(const_cast<float*>(l.impl->global_scales2()), {sh.experts},
                                              [keep](void*) {}, f32);
             return py::make_tuple(g13, g2);
           })
      .def_property_readonly("swiglu", [](const Layer& l) {
        // The activation's two constants: swigluoai's (alpha, limit) (fp4 layers), silu_clamp's limit, situ's
        // (beta, linear_beta) (any format).
        return py::make_tuple(l.impl->shape().alpha, l.impl->shape().limit);
      })
      .def("pin_for_gpu",
           [](Layer& l) {
             // Page-lock the packed weights once (unregistered when the layer is freed); quantized
             // layers: their scales, zero points and biases too (separate host buffers, streamed with
             // the codes). The nvfp4 global scales (12 bytes per expert) stay pageable.
             if (l.impl->pinned) return;
             std::vector<std::pair<void*, size_t>> done;
             try {
               for (const auto& sl : l.impl->slices()) {
                 for (const lk::HostBuffer* b : {&sl.w13, &sl.w2, &sl.s13, &sl.s2, &sl.z13, &sl.z2, &sl.b13, &sl.b2}) {
                   if (!b->size()) continue;
                   lk::register_host_memory(b->data(), b->size());
                   done.emplace_back(b->data(), b->size());
                 }
               }
             } catch (const std::runtime_error& e) {
               for (const auto& [p, n] : done) lk::unregister_host_memory(p, n);
               throw;
             }
             l.impl->pinned = true;
             l.impl->on_destroy([done] {
               for (const auto& [p, n] : done) lk::unregister_host_memory(p, n);
             });
           });
}

}  // namespace lk_bind
