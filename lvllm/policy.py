"""Which MoE layers go to lk_moe, and in which engine format.

Decided once per layer, when vLLM builds the layer's quant method: a layer listed in
LVLLM_GPU_RESIDENT_MOE_LAYERS keeps vLLM's own method (weights on the GPU, vLLM's kernels);
every other layer becomes hybrid (routed experts in host RAM on the lk_moe engine). A layer
whose method or features the engine cannot run stops startup with the reason; it is never
quietly left to stock vLLM, which would put its experts on the GPU and likely run out of memory.

Pure Python over duck-typed vLLM objects (class names, attributes) and lk_moe's format table, so
it is unit-tested without vLLM.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from lk_moe import formats

from .config import LvllmConfig


class UnsupportedMoELayer(ValueError):
    """A MoE layer uses a method or feature the lk_moe engine does not run (yet)."""


@dataclass(frozen=True)
class LayerPlan:
    prefix: str
    layer_index: Optional[int]
    kind: str  # "hybrid" | "gpu_resident"
    format: Optional[str] = None  # engine format id for hybrid layers
    block_size: Optional[tuple] = None  # fp8_block: (rows, cols) of a scale block
    draft: bool = False  # a layer of a speculative draft model (MTP / NextN)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_index_of(prefix: str) -> Optional[int]:
    """The decoder-layer index in a module prefix ("model.layers.7.mlp.experts" -> 7)."""
    m = _LAYER_INDEX.search(prefix)
    return int(m.group(1)) if m else None


def enum_value(x) -> str:
    return str(getattr(x, "value", x)).lower()


def _strategy(method, attr: str) -> str:
    q = getattr(method, attr, None)
    return enum_value(getattr(q, "strategy", "")) if q is not None else ""


# compressed-tensors methods whose per-channel variant the engine reads
_CHANNEL_FORMATS = {"CompressedTensorsW8A8Fp8MoEMethod": "fp8_channel",
                    "CompressedTensorsW8A8Int8MoEMethod": "int8_channel"}


# MXFP8 MoE methods holding w13_weight / w2_weight float8_e4m3fn and w13_weight_scale / w2_weight_scale uint8 e8m0
# [E, N, K/32] (vLLM 0.33.0's modelopt.py and compressed_tensors_moe_w8a8_mxfp8.py create_weights)
_MXFP8 = ("ModelOptMxFp8FusedMoE", "CompressedTensorsW8A8Mxfp8MoEMethod")
# compressed-tensors' MXFP4 MoE methods (weights as gpt-oss's, under `_packed` names until vLLM's own processing)
_CT_MXFP4 = ("CompressedTensorsW4A4Mxfp4MoEMethod", "CompressedTensorsW4A8Mxfp4MoEMethod")


def engine_format(method) -> tuple:
    """(format id, block_size) of the engine format that reads this vLLM MoE method's tensors."""
    name = type(method).__name__
    if name == "UnquantizedFusedMoEMethod":
        return "bf16", None
    if name == "Fp8MoEMethod":
        if getattr(method, "block_quant", False):
            # The grid of the scale tensors vLLM created: the checkpoint's block, or, where TP cuts
            # a block, the refined grid its loader upsamples the scales to.
            block = getattr(method, "moe_block_shape", None) or getattr(method, "weight_block_size", None)
            return "fp8_block", (tuple(int(v) for v in block) if block else None)
        raise UnsupportedMoELayer(
            "Fp8MoEMethod with per-tensor weight scales is not supported by lk_moe yet "
            "(block-quantized FP8, as in DeepSeek-V3/Qwen3-FP8 checkpoints, is)")
    if name in _CHANNEL_FORMATS:
        if _strategy(method, "weight_quant") == "channel":
            return _CHANNEL_FORMATS[name], None
        raise UnsupportedMoELayer(
            f"{name} with weight strategy {_strategy(method, 'weight_quant')!r} is not supported by "
            "lk_moe yet (per-channel is)")
    if name == "CompressedTensorsWNA16MoEMethod":
        bits = getattr(method, "num_bits", None)
        if bits != 4:
            raise UnsupportedMoELayer(f"{name} with {bits}-bit weights is not supported by lk_moe yet (4-bit is)")
        if enum_value(getattr(getattr(method, "weight_quant", None), "actorder", None) or "") == "group":
            raise UnsupportedMoELayer(f"{name} with act order (actorder='group') is not supported by lk_moe yet")
        if "flashinfer" in enum_value(getattr(method, "wna16_backend", "")):
            raise UnsupportedMoELayer(f"{name} on the FlashInfer-TRTLLM backend keeps N-first tensors, which "
                                      "lk_moe does not read yet")
        return "wna16_int4", None
    if name in ("GptOssMxfp4MoEMethod", "Mxfp4MoEMethod"):
        return "mxfp4", None
    if name in _CT_MXFP4:
        # compressed-tensors MXFP4 (Kimi-K3 as released): gpt-oss's tensors under `_packed` names
        # (engine_tensor_names); W4A4 (MXFP4 activations on GPUs with CUTLASS MXFP4) or W4A8 (FP8
        # activations): the engine computes W4A16-style either way, as vLLM's own Marlin fallback does.
        return "mxfp4", None
    if name in _MXFP8:
        # OCP MX FP8 (MiniMax-M3's release): the codes and e8m0 scales as the method creates them (its
        # post-load conversion to Marlin / Humming / TRT-LLM layouts never runs: lvllm takes them first). The engine
        # computes with bf16 activations, as vLLM's Marlin path on Hopper does; streamed GPU prefill and resident
        # layers dequantize the codes to bf16 on the GPU (lk_moe.gpu_dequant.dequant_mx_blocks).
        return "mxfp8", None
    if name == "ModelOptNvFp4FusedMoE":
        # quant_algo NVFP4 (W4A4 on GPUs) and W4A16_NVFP4 hold the same weight tensors; the engine
        # computes W4A16-style either way (the activation scales are ignored).
        return "nvfp4", None
    raise UnsupportedMoELayer(
        f"the MoE quantization method {name} is not supported by lk_moe yet; supported: unquantized "
        "bf16/fp16, FP8 block (Fp8MoEMethod), compressed-tensors FP8 and INT8 per-channel, "
        "compressed-tensors W4A16 int4 (pack-quantized), MXFP4 (gpt-oss, DeepSeek-V4, compressed-tensors), "
        "ModelOpt NVFP4, MXFP8 (ModelOpt, compressed-tensors). "
        "Run this model with LVLLM_MOE_NUMA_ENABLED=0, or list its MoE layers in "
        "LVLLM_GPU_RESIDENT_MOE_LAYERS")


# vLLM methods that hold an engine format's tensors under other names: {engine name: the method's}
_TENSOR_NAMES = {m: {"w13_weight": "w13_weight_packed", "w2_weight": "w2_weight_packed"} for m in _CT_MXFP4}


def engine_tensor_names(method) -> dict:
    """{the engine format's tensor name: the parameter of `method`'s layer that holds it}, for the names
    that differ (the rest are the same)."""
    return _TENSOR_NAMES.get(type(method).__name__, {})


# What the hybrid layer does not do yet: (object, attribute, refused when, what to say).
_REFUSALS = (
    ("config", "is_act_and_mul", lambda v: not v, "non-gated experts"),
    ("layer", "apply_router_weight_on_input", bool, "apply_router_weight_on_input (router weights on the input)"),
    ("config", "is_lora_enabled", bool, "LoRA on MoE layers"),
    ("parallel", "use_ep", bool, "expert parallelism (--enable-expert-parallel); use tensor parallelism"),
    ("parallel", "dp_size", lambda v: v > 1, "data parallelism (--data-parallel-size > 1)"),
    ("parallel", "enable_eplb", bool, "EPLB (--enable-eplb)"),
    ("parallel", "use_all2all_kernels", bool, "all2all MoE backends"),
    ("parallel", "pcp_size", lambda v: v > 1, "prefill context parallelism"),
    ("parallel", "is_sequence_parallel", bool, "sequence-parallel MoE"),
)


def engine_activation(activation, swiglu_limit) -> tuple:
    """(the engine's activation name, its limit or None) for vLLM's (MoEActivation, layer.swiglu_limit):
    silu with a swiglu_limit is the engine's "silu_clamp" (DeepSeek-V4); swigluoai keeps its limit
    (None: gpt-oss's 7.0), and so does swigluoai_uninterleave (MiniMax-M3: the same math on gate rows then up
    rows, the engine's own layout: `interleaved_rows` tells them apart); situ (Kimi-K3) takes its constants
    from the layer's moe_config (situ_args)."""
    name = enum_value(activation)
    limit = None if swiglu_limit is None else float(swiglu_limit)
    if name == "silu" and limit is not None:
        return "silu_clamp", limit
    if name == "swigluoai_uninterleave":
        return "swigluoai", limit
    return name, limit


def interleaved_rows(activation) -> bool:
    """vLLM's swigluoai reads w13 as gate_0, up_0, gate_1, ... (gpt-oss's checkpoints); every other activation,
    swigluoai_uninterleave included, as all gate rows then all up rows."""
    return enum_value(activation) == "swigluoai"


def situ_args(moe_config) -> dict:
    """The engine's situ constants from vLLM's FusedMoEConfig (activation_situ_beta, _linear_beta: None = the
    up projection is not clipped)."""
    beta = getattr(moe_config, "activation_situ_beta", None)
    linear_beta = getattr(moe_config, "activation_situ_linear_beta", None)
    if beta is None:
        raise UnsupportedMoELayer("a situ MoE layer came without activation_situ_beta in its FusedMoEConfig")
    return {"situ_beta": float(beta), "situ_linear_beta": float(linear_beta or 0.0)}


def _check_features(layer, moe_config, prefix: str, fmt: str) -> None:
    """Refuse what the engine or the hybrid method does not do, with the way out."""
    objs = {"config": moe_config, "layer": layer, "parallel": getattr(moe_config, "moe_parallel_config", None)}
    problems = []
    row = formats.get(fmt)
    activation, _ = engine_activation(getattr(moe_config, "activation", "silu"), getattr(layer, "swiglu_limit", None))
    if activation not in row.activations:
        problems.append(f"activation {activation!r} with {fmt} experts (the engine runs {', '.join(row.activations)})")
    if getattr(moe_config, "has_bias", False) and not row.biases:
        problems.append(f"expert biases with {fmt} experts")
    beta = getattr(layer, "swiglu_beta", None)
    if activation == "swigluoai" and beta is not None and float(beta) != 1.0:
        problems.append(f"swigluoai with swiglu_beta={beta} (the engine computes (up + 1), beta 1.0)")
    for where, attr, refused, what in _REFUSALS:
        obj = objs[where]
        if obj is not None and hasattr(obj, attr) and refused(getattr(obj, attr)):
            problems.append(what)
    if problems:
        raise UnsupportedMoELayer(f"{prefix}: lk_moe cannot run this MoE layer: {'; '.join(problems)}")


# vLLM's compilation model tag while it builds a speculative draft model (vllm.compilation.backends.set_model_tag,
# around the proposers' get_model in both model runners: EAGLE / MTP heads, DSpark, DFlash, a separate draft model);
# the target is built under "backbone".
DRAFT_MODEL_TAGS = frozenset({"eagle_head", "dspark_head", "dflash_head", "draft_model"})


def is_draft_layer(prefix: str, target_layers: Optional[int], model_tag: Optional[str] = None) -> bool:
    """A MoE layer of the draft model vLLM builds for speculation: built under a draft model tag, or (the same
    layers, told by their names) under an `mtp.` prefix (Qwen3-Next, Qwen3.5) or numbered past the target's decoder
    layers (DeepSeek, GLM: the MTP layer of a 61-layer model is model.layers.61). The tag also catches a draft whose
    own layers are numbered from 0 (a DSpark or separate draft model)."""
    if model_tag in DRAFT_MODEL_TAGS or prefix.startswith("mtp.") or ".mtp." in prefix:
        return True
    idx = layer_index_of(prefix)
    return idx is not None and target_layers is not None and idx >= target_layers


def plan_for(prefix: str, method, layer, moe_config, cfg: LvllmConfig, target_layers: Optional[int] = None,
             model_tag: Optional[str] = None) -> LayerPlan:
    """target_layers: the target model's decoder-layer count (vLLM's hf_config.num_hidden_layers) and model_tag:
    vLLM's model tag at construction, which tell draft layers apart (LVLLM_DRAFT_MOE: GPU-resident by default)."""
    idx = layer_index_of(prefix)
    draft = is_draft_layer(prefix, target_layers, model_tag)
    if draft and cfg.draft_moe == "gpu":
        return LayerPlan(prefix, idx, "gpu_resident", draft=True)
    if idx is not None and not draft and cfg.is_resident(idx):
        return LayerPlan(prefix, idx, "gpu_resident")
    try:
        fmt, block = engine_format(method)
    except UnsupportedMoELayer as e:
        raise UnsupportedMoELayer(f"{prefix}: {e}") from None
    _check_features(layer, moe_config, prefix, fmt)
    return LayerPlan(prefix, idx, "hybrid", fmt, block, draft=draft)


# Engine formats whose routed experts can be streamed to the GPU for prefill (every engine format today: the
# byte formats travel as one-byte codes + their scales, the 4-bit formats as the engine's 4-bit blocks, both
# dequantized to bf16 on the GPU where vLLM has no kernel for them).
GPU_PREFILL_FORMATS = formats.GPU


def gpu_prefill_min_batch(fmt: Optional[str], cfg: LvllmConfig) -> int:
    """LVLLM_GPU_PREFILL_MIN_BATCH_SIZE for a hybrid layer of engine format `fmt`: 0 (prefill on the
    CPU) for a format without a GPU path (none today). lvllm.runtime logs that once per model and format
    (`WorkerRuntime.note_planned`): the model still runs, with CPU prefill there."""
    return cfg.gpu_prefill_min_batch if fmt in GPU_PREFILL_FORMATS else 0
