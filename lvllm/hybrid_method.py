"""The hybrid MoE quant method: vLLM's own method for the layer, re-classed so that its experts
live in host RAM and run on lk_moe.

`hybrid_class_for(cls)` builds a direct subclass `type(cls.__name__, (cls,), <HybridMoEMixin's
members>)`: the class name stays (vLLM's loaders branch on it), isinstance stays true, and every
attribute the in-tree constructor set is kept, so weight creation and loading are vLLM's own code. The mixin changes
where the weights are created (CPU), replaces the post-load step (hand the tensors to the engine,
never the in-tree GPU conversion) and `apply` (the engine through `lk_moe.HybridMoE`).
"""
from __future__ import annotations

import functools
import time

import torch

from lk_moe import formats

from .padding import engine_ids
from .policy import LayerPlan, engine_activation, engine_tensor_names, interleaved_rows, situ_args


def _fixed(value):
    return property(lambda self: value)


class HybridMoEMixin:
    """Members copied into each hybrid class. Not a base class: CPython refuses `__class__`
    assignment to a class with a second base, even a slot-less one (measured, torch modules)."""

    # vLLM's post-load step runs on the host tensors as they are (the default, True, copies every
    # expert to the GPU and back around it).
    requires_device_loading = False

    def lk_setup(self, layer, plan: LayerPlan, cfg) -> None:
        self._lk_plan = plan
        self._lk_cfg = cfg
        self._lk_hybrid = None
        self._lk_runtime = None
        self._lk_dummy = False
        self._lk_index = 0  # among the model's hybrid layers (expert cache, routing replay)
        self._lk_cache = None  # lk_moe.expert_cache.LayerCache (LVLLM_GPU_EXPERT_CACHE)

    # -- what vLLM's runner and loaders ask the method (forced: no kernel of vLLM's own here).
    # Not monolithic (the router runs first), no EPLB, no modular kernel; shared experts then
    # run on vLLM's side stream while the CPU works; routing ids arrive as int32.
    is_monolithic = supports_eplb = supports_internal_mk = mk_can_overlap_shared_experts = _fixed(False)
    skip_forward_padding = has_unpadded_output = _fixed(False)
    topk_indices_dtype = _fixed(torch.int32)

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config):
        # The base rule only: vLLM's GPU backends pad H/I for their kernels (MXFP4 to 64..256);
        # host tensors in the checkpoint's own sizes cost no padding.
        from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
        return FusedMoEMethodBase.maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition,
                                                      act_dtype, moe_parallel_config)

    def get_fused_moe_quant_config(self, layer):
        return None

    def create_weights(self, layer, *args, **kwargs):
        from .dummy_weights import load_format_is_dummy

        # The innermost device context wins over the loader's `with torch.device("cuda")`.
        # Dummy weights: meta tensors, filled at hand-over (see dummy_weights: vLLM's filler
        # would take minutes on host tensors).
        self._lk_dummy = load_format_is_dummy()
        with torch.device("meta" if self._lk_dummy else "cpu"):
            self._lk_base.create_weights(self, layer, *args, **kwargs)

    # -- after loading: the tensors go to the engine; vLLM's copies are released
    def process_weights_after_loading(self, layer) -> None:
        import lk_moe
        from lk_moe.hybrid import HybridMoE, streamed_expert_bytes

        from .policy import gpu_prefill_min_batch
        from .runtime import get_runtime

        plan, cfg = self._lk_plan, self._lk_cfg
        rt = get_runtime(cfg)
        if self._lk_dummy:
            from .dummy_weights import materialize
            materialize(layer)
        params = dict(layer.named_parameters(recurse=False))
        required, optional = lk_moe.MoELayer.tensor_names(plan.format)
        held_as = engine_tensor_names(self)  # engine name -> this method's parameter, where they differ
        param_of = {n: held_as.get(n, n) for n in (*required, *optional)}
        # Optional tensors (zero points) exist only when the method created them; g_idx is never
        # passed (act-order checkpoints are refused by the policy; vLLM leaves it unset otherwise).
        needed = list(required) + [n for n in optional if param_of[n] in params]
        tensors = {}
        for name in needed:
            p = params.get(param_of[name])
            if p is None:
                raise ValueError(f"{plan.prefix}: vLLM's {type(self).__name__} holds no {param_of[name]}; "
                                 f"cannot build the lk_moe {plan.format} layer")
            if p.device.type != "cpu":
                raise RuntimeError(f"{plan.prefix}: {name} is on {p.device}, expected host memory "
                                   "(the lvllm loading hook is not active)")
            tensors[name] = p.data
        moe = layer.moe_config
        t0 = time.perf_counter()
        engine_layer = lk_moe.MoELayer.from_checkpoint(plan.format, _engine_layout(plan.format, tensors), pool=rt.pool,
                                                       block_size=plan.block_size, **_format_args(layer, plan))
        # The engine holds its own packed copy; drop vLLM's so host RAM holds the experts once.
        for name in needed:
            p = params[param_of[name]]
            p.data = torch.empty(0, dtype=p.dtype)
        # 0 for formats without a GPU path (CPU prefill; warned once per model by the runtime).
        gpu_min = gpu_prefill_min_batch(plan.format, cfg)
        max_tokens = int(moe.max_num_tokens)
        if gpu_min > 0:
            # Batches >= gpu_min stream to the GPU, except inside captured graphs (CPU path).
            max_tokens = min(max_tokens, max(gpu_min - 1, int(getattr(moe, "max_capture_size", 0) or 0), 1))
        dtype = moe.in_dtype
        top_k = int(layer.top_k)
        streamer = None
        if gpu_min > 0:
            # Bytes of one expert as it travels: the engine's packed (block-padded) copy; byte
            # formats: one-byte codes + fp32 scales; 4-bit formats: 4-bit codes + their scales.
            expert_bytes = streamed_expert_bytes(engine_layer)
            streamer = rt.staging_for(expert_bytes, engine_layer.num_experts)
        self._lk_hybrid = HybridMoE(None, None, layer=engine_layer, max_tokens=max_tokens, top_k=top_k,
                                    gpu_min_batch=gpu_min, streamer=streamer, dtype=dtype, signal=rt.cpu_signal,
                                    io=rt.io(max_tokens, engine_layer.hidden_size, top_k, dtype))
        self._lk_runtime = rt
        rt.add_layer(plan, self._lk_hybrid)
        self._lk_index, self._lk_cache = rt.attach_cache(self._lk_hybrid, int(moe.max_num_tokens))
        rt.layer_loaded(engine_layer.nbytes, time.perf_counter() - t0)

    # -- forward
    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        hybrid = self._lk_hybrid
        if hybrid is None:
            raise RuntimeError(f"{self._lk_plan.prefix}: lk_moe layer used before its weights were loaded")
        self._lk_runtime.log_summary_once()
        if x.shape[0] == 0:
            return torch.empty_like(x)
        if topk_ids.dtype != torch.int32:
            topk_ids = topk_ids.to(torch.int32)
        if topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.float()
        replay = self._lk_runtime.replay
        if replay is not None:  # benchmarks only (LVLLM_BENCH_ROUTING_REPLAY)
            topk_ids = replay.apply(self._lk_index, topk_ids)
        cache = self._lk_cache
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing or not hybrid.takes_gpu_path(x.shape[0]):
            # A captured graph replays exactly what was recorded: only the CPU path (copies and a
            # host-function node) is capturable; the streamed GPU path syncs to plan its copies.
            # Rows vLLM padded to a graph size, and the profile run's, cost no expert reads.
            ids = engine_ids(topk_ids)
            stats = self._lk_runtime.stats
            if stats is not None and not capturing:  # eager: the engine's count minus these replayed from graphs
                stats.cpu_eager(hybrid)
            if cache is not None:  # the cached experts on the GPU, the rest on the CPU, at once
                return cache.forward(x, ids, topk_weights, hybrid.cpu_path)
            return hybrid.cpu_path(x, ids, topk_weights)  # counted by the engine (lvllm.stats)
        stats = self._lk_runtime.stats
        if stats is None:
            return hybrid.forward(x, topk_ids, topk_weights, cache=cache)
        mark = stats.gpu_begin(hybrid, x.shape[0])
        out = hybrid.forward(x, topk_ids, topk_weights, cache=cache)
        stats.gpu_end(mark)
        return out


_MEMBERS = {k: v for k, v in vars(HybridMoEMixin).items() if not (k.startswith("__") and k.endswith("__"))}


# compressed-tensors WNA16: vLLM 0.33 holds the tensors as the checkpoint does, N-first (packed int32
# [E, 2I, H/8] / [E, H, I/8], scales [E, 2I, H/gs], zero points [E, 2I/8, H/gs]); the engine's
# wna16_int4 input is K-first. Every int32 word packs 8 values along one axis that a transpose of
# the last two dims keeps whole, so the transpose is exact.
_N_FIRST_FORMATS = ("wna16_int4",)


def _engine_layout(fmt: str, tensors: dict) -> dict:
    """The tensors as the engine format reads them (a transposed host copy of every tensor of a
    format vLLM holds N-first)."""
    if fmt not in _N_FIRST_FORMATS:
        return tensors
    row = formats.get(fmt)
    names = row.tensors + row.optional
    return {n: (t.transpose(1, 2).contiguous() if n in names else t) for n, t in tensors.items()}


def _format_args(layer, plan: LayerPlan) -> dict:
    """What the tensors cannot say: the activation and its constants, the real (unpadded) sizes."""
    act, limit = engine_activation(layer.activation, getattr(layer, "swiglu_limit", None))
    args = {} if act == "silu" else {"activation": act}
    # gpt-oss leaves them unset on the layer; its kernels take 1.702 and 7.0 (the engine's defaults).
    if limit is not None:
        args["swiglu_limit"] = limit
    if act == "situ":
        args.update(situ_args(layer.moe_config))
    if act == "swigluoai" and getattr(layer, "swiglu_alpha", None) is not None:
        args["swiglu_alpha"] = float(layer.swiglu_alpha)
    if plan.format != "mxfp4":
        return args
    args.update(activation=act, interleaved=interleaved_rows(layer.activation), hidden_size=int(layer.hidden_size),
                intermediate_size=int(layer.intermediate_size_per_partition))
    return args


@functools.lru_cache(maxsize=None)
def hybrid_class_for(base: type) -> type:
    return type(base.__name__, (base,), dict(_MEMBERS, _lk_base=base, __module__=base.__module__,
                                             __qualname__=base.__qualname__))


def make_hybrid(method, layer, plan: LayerPlan, cfg) -> None:
    """Re-class vLLM's method object in place (keeps its state) and attach the plan."""
    method.__class__ = hybrid_class_for(type(method))
    method.lk_setup(layer, plan, cfg)
