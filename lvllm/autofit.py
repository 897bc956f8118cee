"""Auto-fit: one plan for a hybrid model on one machine, from what the machine has and what the model needs.

Decides, per rank, in this order (each decision one line of `Plan.lines`, for the startup summary and doctor):
  1. the KV cache for the requested context: max_model_len x the requested sequences (--max-num-seqs when
     given, else DEFAULT_KV_SEQUENCES full-context sequences), after the non-expert weights and lvllm's reserve
     (CUDA graphs, activations, the streamed-prefill staging ring); below one sequence the model does not fit;
  2. GPU-resident MoE layers: every layer when all the experts fit in what is left (the GPU alone is faster
     than any split), else only as many as host RAM needs to hold the rest;
  3. the GPU expert cache: the VRAM left after that (whole slots, at most one per expert), where the
     format's experts can live in slots; else more resident layers take that VRAM;
  4. the GPU-prefill threshold: the batch size from which streaming a layer's experts over PCIe beats the
     CPU computing them (read bandwidth, CPU GEMM rate of the ISA tier and format, H2D bandwidth);
  5. engine threads per rank: the rank's physical cores less the ones vLLM's own threads need.
Explicit settings (Request.explicit) always win over the plan's choice for that setting. Pure arithmetic on
described machines and models: `lvllm doctor --model` and the runtime describe theirs and call `plan`.
When the model cannot fit, `FitError` says what is short by how much and what would help.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .fit import DEFAULT_KV_SEQUENCES, RESERVE_BYTES, STAGING_BYTES, FitError
from .threads import reserved_cores

GiB = 1 << 30
# vLLM's API server and engine processes, torch and CUDA contexts, per rank (host RAM, measured 5-8 GiB).
PROCESS_HOST_BYTES = 8 * GiB
# The engine's packed copy of a layer's experts is at most this much larger than the checkpoint's bytes
# (block padding of the packed layouts; lk_moe's nbytes / expert bytes measured 1.000-1.003).
ENGINE_OVERHEAD = 1.05
# CPU expert-GEMM rate per physical core, TFLOP/s, with bf16 experts at prefill batch sizes (M >= 256):
# measured with benchmarks/moe_layer.py on the Qwen3-30B-A3B shape (amx: the H200 host's Xeon, 16 threads,
# 3.57 TFLOP/s at M=1024 with the reads overlapped; avx512_bf16: a 2-core Zen4, 0.83 TFLOP/s), the others
# scaled by their kernels' instruction throughput. Quantized experts dequantize on the fly: FORMAT_RATE.
CPU_TFLOPS_PER_CORE = {"amx": 0.45, "avx512_bf16": 0.42, "avx512": 0.2, "avx2": 0.1, "generic": 0.02}
FORMAT_RATE = {"bf16": 1.0, "fp8_block": 0.8, "fp8_channel": 0.8, "int8_channel": 0.8,
               "wna16_int4": 0.7, "nvfp4": 0.7, "mxfp4": 0.7}
PREFILL_MIN, PREFILL_MAX = 64, 16384  # the threshold's range (tokens in one forward pass)
# What the cache's routing-following is worth against fixed resident layers, per expert share held: the
# H200 runs of session 19 hit 0.465 with 25% of the experts in slots on the lru67 trace (1.9x the share).
# Whole layers win where they cover more than this times the cache's share (FP4 experts' bf16 slots).
CACHE_LOCALITY_GAIN = 2.0


@dataclass(frozen=True)
class Machine:
    gpu_bytes: int                     # VRAM of one GPU
    host_bytes: int                    # host RAM available to the model (MemAvailable)
    cores: int                         # physical cores usable by all ranks together
    read_gbps: float = 80.0            # host read bandwidth, all cores (the engine's probe)
    h2d_gbps: float = 25.0             # pinned host-to-device copies
    isa: str = "avx512_bf16"           # lk_moe's ISA tier
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True)
class Model:
    name: str
    moe_layers: int
    experts: int                       # routed experts per MoE layer
    top_k: int
    hidden: int
    expert_intermediate: int
    layer_expert_bytes: int            # one MoE layer's routed experts in the checkpoint's format, all ranks
    other_bytes: int                   # every other weight (attention, dense and shared MLPs, embeddings)
    kv_bytes_per_token: int            # per rank, at the requested context (lvllm.fit.kv_bytes_per_token)
    fmt: str = "bf16"                  # lk_moe's engine format
    slot_bytes: int = 0                # one expert in a cache slot, all ranks (0: no slots; see slot_bytes)
    gpu_prefill: bool = True           # the format has a GPU path for streamed prefill
    host_table_bytes: int = 0          # tables vLLM keeps in host RAM itself (V4.1's Engram, Qwen4Exp's PLE), all ranks


# Formats the cache holds dequantized to bf16 (lk_moe.expert_cache: vLLM's fused-MoE kernel has no FP4 or MXFP8
# path here); the other formats keep their codes and scales in the slots.
BF16_SLOT_FORMATS = ("nvfp4", "mxfp4", "mxfp8")


# The activations the cache's GPU kernel computes (lk_moe.expert_cache.KERNEL_ACTIVATIONS): vLLM's fused-MoE
# kernel passes no clamp (silu_clamp) and no SituGLU constants (situ)
CACHE_ACTIVATIONS = ("silu", "swigluoai")


def slot_bytes(fmt: str, expert_bytes: int, hidden: int, expert_intermediate: int, activation: str = "silu") -> int:
    """One expert's cache slot (lk_moe.expert_cache's rule), 0 where the cache cannot serve the layer."""
    if activation not in CACHE_ACTIVATIONS:
        return 0
    return 3 * hidden * expert_intermediate * 2 if fmt in BF16_SLOT_FORMATS else expert_bytes


@dataclass(frozen=True)
class Request:
    max_model_len: int
    tp: int = 1
    max_num_seqs: Optional[int] = None  # --max-num-seqs as given (None: not given)
    # settings the user gave (they win): "resident_layers" (a count of MoE layers), "cache_bytes",
    # "gpu_prefill_min_batch", "threads"
    explicit: Dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    kv_bytes: int
    kv_sequences: int
    reserve_bytes: int
    resident_layers: int               # how many MoE layers stay on the GPU (the first ones)
    cache_bytes: int
    gpu_prefill_min_batch: int         # 0: prefill on the CPU
    threads: int
    host_bytes_needed: int
    lines: List[str] = field(default_factory=list)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def cpu_prefill_seconds(model: Model, machine: Machine, tokens: int, threads: int, tp: int) -> float:
    """One rank's CPU time for one MoE layer over a batch of `tokens`: reading the distinct experts the
    batch routes to (uniform routing's expectation) plus their GEMMs, not overlapped (measured on the
    H200 host: 14.7 ms at 256 and 21.6 ms at 1024 tokens, where this gives 14.7 and 22.8)."""
    touched = model.experts * (1.0 - (1.0 - model.top_k / model.experts) ** tokens)
    read = touched / model.experts * model.layer_expert_bytes / tp / (machine.read_gbps * 1e9 / tp)
    flops = 2.0 * 3 * model.hidden * model.expert_intermediate * model.top_k * tokens / tp
    rate = CPU_TFLOPS_PER_CORE.get(machine.isa, 0.02) * FORMAT_RATE.get(model.fmt, 0.7) * threads * 1e12
    return read + flops / rate


def stream_seconds(model: Model, machine: Machine, tp: int) -> float:
    """One rank's time to stream one MoE layer's experts to its GPU (ranks copy in parallel)."""
    return model.layer_expert_bytes / tp / (machine.h2d_gbps * 1e9)


def prefill_threshold(model: Model, machine: Machine, threads: int, tp: int) -> int:
    """The smallest batch (a multiple of 64) at which streaming beats the CPU; PREFILL_MAX if it never does
    below that, so very long prompts still stream."""
    t_stream = stream_seconds(model, machine, tp)
    for tokens in range(PREFILL_MIN, PREFILL_MAX + 1, 64):
        if cpu_prefill_seconds(model, machine, tokens, threads, tp) >= t_stream:
            return tokens
    return PREFILL_MAX


def _threads(machine: Machine, req: Request, lines: List[str]) -> int:
    share = max(1, machine.cores // req.tp)
    auto = max(1, share - reserved_cores(share))
    if "threads" in req.explicit:
        lines.append(f"engine threads {req.explicit['threads']} per rank (set; the plan would take {auto})")
        return int(req.explicit["threads"])
    lines.append(f"engine threads {auto} per rank: {share} physical cores per rank, "
                 f"{share - auto} left to vLLM's own threads")
    return auto


def plan(machine: Machine, model: Model, req: Request) -> Plan:
    if req.tp < 1 or req.max_model_len < 1 or model.moe_layers < 1:
        raise ValueError("tp, max_model_len and moe_layers must be positive")
    lines: List[str] = []
    tp = req.tp
    usable = int(machine.gpu_bytes * machine.gpu_memory_utilization)
    weights = model.other_bytes // tp
    reserve = RESERVE_BYTES + (STAGING_BYTES if model.gpu_prefill else 0)
    layer_gpu = model.layer_expert_bytes // tp          # one MoE layer's experts on one rank's GPU
    layer_host = int(model.layer_expert_bytes * ENGINE_OVERHEAD)  # ... in the engine, all ranks together
    one_seq = model.kv_bytes_per_token * req.max_model_len
    room = usable - weights - reserve
    if room <= 0:
        raise FitError(
            f"{model.name}: VRAM: {_gib(usable)} usable per GPU ({machine.gpu_memory_utilization:g} of "
            f"{_gib(machine.gpu_bytes)}) does not hold the non-expert weights ({_gib(weights)}) and lvllm's reserve "
            f"({_gib(reserve)}): short by {_gib(-room)} before any KV cache. Options: "
            + ("--tensor-parallel-size 2, " if tp == 1 else "more GPUs (--tensor-parallel-size), ") +
            "a higher --gpu-memory-utilization, a larger GPU")
    if room < one_seq:
        short = one_seq - room
        fit_len = max(0, room) // max(1, model.kv_bytes_per_token)
        raise FitError(
            f"{model.name}: VRAM: {_gib(usable)} usable per GPU ({machine.gpu_memory_utilization:g} of "
            f"{_gib(machine.gpu_bytes)}) holds the non-expert weights ({_gib(weights)}) and lvllm's reserve "
            f"({_gib(reserve)}) but not the KV cache of one {req.max_model_len}-token sequence ({_gib(one_seq)}): "
            f"short by {_gib(short)}. Options: --max-model-len {fit_len} or less, a higher "
            f"--gpu-memory-utilization, " + ("--tensor-parallel-size 2, " if tp == 1 else "") +
            "--kv-cache-dtype fp8")
    seqs = req.max_num_seqs if req.max_num_seqs else DEFAULT_KV_SEQUENCES
    kv = one_seq * seqs
    if kv > room:
        if req.max_num_seqs:  # asked for: say what fits instead of planning less
            raise FitError(
                f"{model.name}: VRAM: the KV cache of {seqs} sequences of {req.max_model_len} tokens "
                f"({_gib(kv)}) does not fit the {_gib(room)} left per GPU after the weights and lvllm's "
                f"reserve: short by {_gib(kv - room)}. Options: --max-num-seqs {room // one_seq}, a shorter "
                f"--max-model-len, " + ("--tensor-parallel-size 2, " if tp == 1 else "") + "--kv-cache-dtype fp8")
        seqs = max(1, room // one_seq)
        kv = one_seq * seqs
    lines.append(f"KV cache {_gib(kv)} reserved: {seqs} sequence{'s' if seqs > 1 else ''} of {req.max_model_len} "
                 f"tokens ({model.kv_bytes_per_token / 1024:.1f} KiB a token per GPU; "
                 + ("--max-num-seqs" if req.max_num_seqs else "the default plan") + "); non-expert weights "
                 f"{_gib(weights)} and lvllm's reserve {_gib(reserve)} per GPU; vLLM gives the KV cache any VRAM left")
    left = room - kv

    # host RAM: the hybrid layers' experts in the engine, vLLM's processes per rank and its host tables
    process = PROCESS_HOST_BYTES * tp + model.host_table_bytes
    host_for_experts = machine.host_bytes - process
    need_hybrid_all = layer_host * model.moe_layers
    min_resident = 0 if host_for_experts >= need_hybrid_all else \
        math.ceil((need_hybrid_all - max(0, host_for_experts)) / layer_host)

    if "resident_layers" in req.explicit:
        resident = int(req.explicit["resident_layers"])
        lines.append(f"GPU-resident MoE layers: {resident} (set)")
    elif layer_gpu * model.moe_layers <= left:
        resident = model.moe_layers
        lines.append(f"GPU-resident MoE layers: all {resident}: every expert fits in the {_gib(left)} left per GPU "
                     f"({_gib(layer_gpu * model.moe_layers)}); the GPU alone beats any CPU split")
    else:
        resident = min_resident
        lines.append(f"host RAM holds the experts of {model.moe_layers - resident} of {model.moe_layers} MoE layers"
                     + (f": {resident} GPU-resident layers needed" if resident else ""))
    if resident > model.moe_layers:
        raise FitError(f"{model.name}: {resident} resident MoE layers asked for, the model has {model.moe_layers}")
    host_need = layer_host * (model.moe_layers - resident) + process
    keepable = max(0, left // max(1, layer_gpu))  # whole layers the GPUs can keep after the KV cache
    if host_need > machine.host_bytes:
        raise FitError(
            f"{model.name}: host RAM: the experts of {model.moe_layers - resident} hybrid layers "
            f"({_gib(layer_host * (model.moe_layers - resident))} in the engine) and vLLM's processes and host "
            f"tables (~{_gib(process)}) need {_gib(host_need)}; {_gib(machine.host_bytes)} is available: short by "
            f"{_gib(host_need - machine.host_bytes)}, and the GPUs can keep at most {keepable} of the "
            f"{model.moe_layers} MoE layers resident. Options: a smaller quantization of the model (8-bit "
            f"halves and 4-bit quarters bf16's expert bytes), more host RAM, more or larger GPUs "
            f"(--tensor-parallel-size), a shorter --max-model-len (more VRAM for resident layers)")
    if resident * layer_gpu > left:
        if "resident_layers" not in req.explicit:  # host RAM needs more layers on the GPUs than they hold
            raise FitError(
                f"{model.name}: host RAM: {_gib(machine.host_bytes)} holds the experts of "
                f"{model.moe_layers - resident} of {model.moe_layers} MoE layers; the other {resident} would have "
                f"to stay on the GPUs, which keep at most {keepable} after the KV cache: short by "
                f"{_gib((resident - keepable) * layer_host)} of host RAM. Options: a smaller quantization of the "
                f"model (8-bit halves and 4-bit quarters bf16's expert bytes), more host RAM, more or larger GPUs "
                f"(--tensor-parallel-size), a shorter --max-model-len")
        raise FitError(f"{model.name}: VRAM: {resident} resident MoE layers need {_gib(resident * layer_gpu)} per "
                       f"GPU, {_gib(left)} is left after the KV cache: short by {_gib(resident * layer_gpu - left)}. "
                       f"Options: LVLLM_GPU_RESIDENT_MOE_LAYERS with at most {keepable} layers, a shorter "
                       f"--max-model-len")
    left -= resident * layer_gpu

    hybrid_layers = model.moe_layers - resident
    slots_max = model.experts * hybrid_layers
    if "cache_bytes" in req.explicit:
        cache = int(req.explicit["cache_bytes"])
        lines.append(f"GPU expert cache {_gib(cache)} (set)")
    elif hybrid_layers == 0:
        cache = 0
    else:
        slot = model.slot_bytes // tp
        slots = min(slots_max, left // slot) if slot else 0
        more = min(hybrid_layers, left // max(1, layer_gpu))
        # The cache's share of the hybrid experts against the share whole resident layers would take: a
        # slot of an FP4 expert is 4x its bytes (bf16), so there whole layers may cover more of the reads.
        cache_share, layer_share = slots / max(1, slots_max), more / max(1, hybrid_layers)
        if slots and cache_share * CACHE_LOCALITY_GAIN >= layer_share:
            cache = slots * slot
            lines.append(f"GPU expert cache {_gib(cache)}: {slots} of {slots_max} expert slots of "
                         f"{slot / 2**20:.1f} MiB ({cache_share * 100:.0f}% of the hybrid experts), the VRAM left; "
                         f"it follows the routing")
        else:
            cache = 0
            if not (more and "resident_layers" not in req.explicit):
                lines.append("no GPU expert cache: " + (
                    f"{model.fmt} experts with this activation have no cache slots" if not slot else
                    f"the {_gib(left)} left per GPU holds no slot of {slot / 2**20:.1f} MiB" if not slots else
                    f"{slots} slots would hold {cache_share * 100:.0f}% of the experts, whole layers "
                    f"{layer_share * 100:.0f}% (the resident layers are set)"))
            else:
                resident += more
                hybrid_layers -= more
                host_need -= layer_host * more
                left -= more * layer_gpu
                why = (f"{model.fmt} experts have no cache slots" if not slot else
                       f"{more} whole layers cover {layer_share * 100:.0f}% of the expert reads, {slots} cache slots "
                       f"of {slot / 2**20:.1f} MiB {cache_share * 100:.0f}% of the experts")
                lines.append(f"GPU-resident MoE layers: {more} more ({resident} in all): {why}, so the VRAM left "
                             f"keeps whole layers")

    threads = _threads(machine, req, lines)
    if "gpu_prefill_min_batch" in req.explicit:
        prefill = int(req.explicit["gpu_prefill_min_batch"])
        lines.append(f"GPU prefill from {prefill} tokens (set)" if prefill else "prefill on the CPU (set)")
    elif hybrid_layers == 0:
        prefill = 0
    elif not model.gpu_prefill:
        prefill = 0
        lines.append(f"prefill on the CPU: {model.fmt} experts have no GPU prefill path")
    else:
        prefill = prefill_threshold(model, machine, threads, tp)
        lines.append(f"GPU prefill from {prefill} tokens: streaming a layer ({_gib(layer_gpu)} per GPU at "
                     f"{machine.h2d_gbps:.0f} GB/s) takes {stream_seconds(model, machine, tp) * 1e3:.1f} ms, the CPU "
                     f"({threads} thread{'s' if threads > 1 else ''}, {machine.isa}, {machine.read_gbps:.0f} GB/s) "
                     f"{cpu_prefill_seconds(model, machine, prefill, threads, tp) * 1e3:.1f} ms for {prefill} tokens")
    lines.append(f"host RAM {_gib(host_need)} of {_gib(machine.host_bytes)}: experts of {hybrid_layers} hybrid "
                 f"layers in the engine and vLLM's processes"
                 + (f", its host tables {_gib(model.host_table_bytes)}" if model.host_table_bytes else ""))
    return Plan(kv_bytes=kv, kv_sequences=seqs, reserve_bytes=reserve, resident_layers=resident, cache_bytes=cache,
                gpu_prefill_min_batch=prefill, threads=threads, host_bytes_needed=host_need, lines=lines)
