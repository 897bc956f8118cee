"""What lvllm.autofit plans from: this machine (measured) and a checkpoint (read or estimated by
lvllm.cli.checkpoint_info), for `lvllm doctor --model` and the LVLLM_AUTO_FIT=1 startup."""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from lk_moe import formats

from .autofit import Machine, Model, Request, plan, slot_bytes
from .cli.checkpoint_info import (deepseek_v4_experts, expert_shape, experts_per_token, info_from_config,
                                  moe_layer_indices, read_checkpoint)
from .cli.doctor import _meminfo
from .config import LvllmConfig
from .fit import kv_bytes_per_token
from .threads import physical_cores

GiB = 1 << 30


# quantization method -> lk_moe engine format (the checkpoint's experts as the engine holds them)
ENGINE_FORMATS = {None: "bf16", "": "bf16", "fp8": "fp8_block", "modelopt/FP8": "fp8_channel",
                  "compressed-tensors": "wna16_int4", "compressed-tensors/mxfp4": "mxfp4", "mxfp4": "mxfp4",
                  "modelopt_fp4": "nvfp4", "modelopt/NVFP4": "nvfp4", "modelopt/MXFP8": "mxfp8", "mxfp8": "mxfp8"}


def describe_model(info, tp: int, max_model_len: int, kv_dtype_bytes: int = 2):
    """lvllm.autofit's description of a checkpoint (doctor's reading of its files or config)."""
    cfg = info.config
    experts, H, I = expert_shape(cfg)
    # DeepSeek-V4: its experts' format by their own fields, under an FP8 config for the other projections
    v4 = deepseek_v4_experts(cfg)
    fmt = v4[0] if v4 else ENGINE_FORMATS.get(info.quant_method, "wna16_int4")
    # gpt-oss (no hidden_act for its experts) and MiniMax-M3 (hidden_act swigluoai, with a swiglu_limit) are swigluoai
    activation = ("swigluoai" if info.model_type == "gpt_oss" or cfg.get("hidden_act") == "swigluoai"
                  else "silu_clamp" if cfg.get("swiglu_limit") else "situ" if cfg.get("hidden_act") == "situ" else "silu")
    layer = info.expert_bytes_per_layer
    return Model(name=info.architecture, moe_layers=info.moe_layers, experts=experts,
                 top_k=experts_per_token(cfg, 8), hidden=H,
                 expert_intermediate=I, layer_expert_bytes=layer, other_bytes=info.other_bytes,
                 kv_bytes_per_token=kv_bytes_per_token(cfg, max_model_len, tp, kv_dtype_bytes), fmt=fmt,
                 # a format without a GPU path (none today): prefill on the CPU, no cache slots
                 slot_bytes=slot_bytes(fmt, layer // max(1, experts), H, I, activation) if fmt in formats.GPU else 0,
                 gpu_prefill=fmt in formats.GPU, host_table_bytes=info.host_table_bytes)


def describe_machine(gpu_gib: float, util: float, host_gib: float = 0, probe: bool = True):
    """lvllm.autofit's description of this machine: GPU memory (or --gpu-gib), host RAM available (or
    --host-gib), physical cores, and the two bandwidths measured here (the engine's read probe, a pinned
    host-to-device copy). probe=False leaves the bandwidths at their typical figures: only the GPU-prefill
    threshold reads them, and a plan that holds the threshold as set need not spend seconds measuring."""
    cpus = sorted(os.sched_getaffinity(0))
    gpu_bytes, h2d, isa, read = int(gpu_gib * GiB), 25.0, "avx512_bf16", 60.0
    try:
        import torch
        if torch.cuda.is_available():
            gpu_bytes = gpu_bytes or min(torch.cuda.mem_get_info(i)[1] for i in range(torch.cuda.device_count()))
        if probe and torch.cuda.is_available():
            src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
            dst = torch.empty_like(src, device="cuda")
            dst.copy_(src)
            torch.cuda.synchronize()
            t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t[0].record()
            for _ in range(4):
                dst.copy_(src, non_blocking=True)
            t[1].record()
            torch.cuda.synchronize()
            h2d = 4 * src.numel() / (t[0].elapsed_time(t[1]) * 1e6)
    except Exception:  # no torch or no GPU: the given --gpu-gib and a PCIe 4 x16 figure
        pass
    try:
        import lk_moe
        isa = lk_moe.isa()
        if probe:
            pool = lk_moe.make_pool(threads=0)  # every physical core, as the read bound of decode is measured
            read = sorted(pool.measure_read_bandwidth(1 << 30, 3))[1]
    except Exception:  # the engine not built here: a typical two-channel-per-socket figure
        pass
    host = int(host_gib * GiB) or _meminfo().get("MemAvailable", 0)
    return Machine(gpu_bytes=gpu_bytes, host_bytes=host, cores=physical_cores(cpus),
                   read_gbps=read, h2d_gbps=h2d, isa=isa, gpu_memory_utilization=util)


def explicit_settings(env: Mapping[str, str], cfg: LvllmConfig) -> dict:
    """The plan's settings the user gave (they win): LVLLM_GPU_RESIDENT_MOE_LAYERS (as a count),
    LVLLM_GPU_EXPERT_CACHE (GiB; `auto` leaves it to the plan), LVLLM_GPU_PREFILL_MIN_BATCH_SIZE, LK_THREADS."""
    out = {}
    if env.get("LVLLM_GPU_RESIDENT_MOE_LAYERS", "").strip():
        out["resident_layers"] = len(cfg.resident_layers)
    if env.get("LVLLM_GPU_EXPERT_CACHE", "").strip() and not cfg.expert_cache_auto:
        out["cache_bytes"] = int(cfg.expert_cache_gib * GiB)
    if env.get("LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", "").strip():
        out["gpu_prefill_min_batch"] = cfg.gpu_prefill_min_batch
    if env.get("LK_THREADS", "").strip():
        out["threads"] = int(env["LK_THREADS"])
    return out


def applied(cfg: LvllmConfig, p, moe_layers: list) -> LvllmConfig:
    """`cfg` with the plan's decisions (resident layers: the first MoE layers unless the user listed them)."""
    import dataclasses
    resident = cfg.resident_layers if len(cfg.resident_layers) == p.resident_layers else \
        frozenset(moe_layers[:p.resident_layers])
    return dataclasses.replace(cfg, resident_layers=resident, gpu_prefill_min_batch=p.gpu_prefill_min_batch,
                               expert_cache_gib=p.cache_bytes / GiB, expert_cache_auto=False)


def plan_at_startup(cfg: LvllmConfig, env: Mapping[str, str],
                    cache_only: bool = False) -> Tuple[LvllmConfig, Optional[int], list]:
    """LVLLM_AUTO_FIT=1, when the first MoE layer is built (before any weight loads): the plan for the model
    vLLM is building on this machine. Returns (the config with the plan applied, engine threads unless
    LK_THREADS is set, the plan's lines); raises lvllm.fit.FitError when the model does not fit.
    cache_only (LVLLM_GPU_EXPERT_CACHE=auto without LVLLM_AUTO_FIT): the same plan with every other setting
    held where the user's settings and the defaults put it (resident layers, GPU-prefill threshold, threads):
    it sizes the GPU expert cache alone."""
    from vllm.config import get_current_vllm_config
    vc = get_current_vllm_config()
    mc = vc.model_config
    tp = vc.parallel_config.tensor_parallel_size
    text = mc.hf_text_config.to_dict()
    quant = getattr(mc.hf_config, "quantization_config", None)
    if quant is not None and "quantization_config" not in text:
        text["quantization_config"] = quant if isinstance(quant, dict) else quant.to_dict()
    # a local checkpoint: its weight files' exact sizes; a Hub name: its config's shapes
    info = read_checkpoint(mc.model) if os.path.isdir(mc.model) else info_from_config(text, mc.model, estimate=True)
    kv_dtype = str(vc.cache_config.cache_dtype)
    model = describe_model(info, tp, mc.max_model_len, 1 if kv_dtype.startswith("fp8") else mc.dtype.itemsize)
    machine = describe_machine(0, vc.cache_config.gpu_memory_utilization, probe=not cache_only)
    explicit = explicit_settings(env, cfg)
    if cache_only:
        explicit.update(resident_layers=len(cfg.resident_layers), gpu_prefill_min_batch=cfg.gpu_prefill_min_batch)
    p = plan(machine, model, Request(max_model_len=mc.max_model_len, tp=tp, explicit=explicit))
    threads = None if "threads" in explicit or cache_only else p.threads
    return applied(cfg, p, moe_layer_indices(info.config)), threads, p.lines
