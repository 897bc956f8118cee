"""The integration switches, parsed once into a typed object (names compatible with Lvllm).

LVLLM_MOE_NUMA_ENABLED            master switch: 0 (default) = stock vLLM, nothing of ours runs
LVLLM_GPU_PREFILL_MIN_BATCH_SIZE  smallest batch (tokens) whose routed experts run on the GPU by
                                  streaming them there; 0 (default) = prefill on the CPU too
LVLLM_GPU_PREFETCH_WINDOW         layers whose experts are copied ahead during GPU prefill (0 or 1,
                                  default 1; the staging ring holds at most 2 layers)
LVLLM_GPU_RESIDENT_MOE_LAYERS     MoE layers kept on the GPU, e.g. "0-3,40" (default: none)
LVLLM_STATS_INTERVAL              seconds between the runtime statistics log lines of each rank
                                  (default 60; 0 = off)
LVLLM_GPU_EXPERT_CACHE            GiB of VRAM per rank for the GPU expert cache: copies of hot
                                  routed experts of the hybrid layers, computed on the GPU while
                                  the CPU computes the rest (default 0 = off); "auto": lvllm.autofit's
                                  plan sizes it (what is left after the weights, lvllm's reserve and the
                                  KV cache of two full-context sequences), the other settings held as set
LVLLM_DRAFT_MOE                   MoE layers of a speculative draft model (MTP / NextN layers): "gpu"
                                  (default: resident, vLLM's own kernels; one layer) or "cpu" (hybrid,
                                  experts in host RAM like the target's)
LVLLM_AUTO_FIT                    1: lvllm.autofit plans, at the first MoE layer (before any weight loads),
                                  what the settings here and LK_THREADS leave unset: resident layers,
                                  the expert cache, the GPU-prefill threshold, threads; a model that
                                  cannot fit stops there saying what is short (default 0 for now)
LVLLM_EXCLUSIVE_ENGINE_CPUS       1: from the first step on, every other thread of a worker process runs
                                  on the rank's CPUs that no engine worker is pinned to, the engine's
                                  signal thread (poller) on one of them alone, so none preempts a worker
                                  (a decode layer waits for its slowest worker); default 0 (its first
                                  form, poller crowded in with the rest, was 2.8x slower: to be measured)
LVLLM_CUDA_BLOCKING_SYNC          1: a worker's CUDA context waits for the GPU by sleeping instead of
                                  spinning (one core more for the engine during a decode step, a wake-up
                                  per synchronisation); default 0 (no measured change)
LVLLM_BENCH_ROUTING_REPLAY        benchmark-only: 1 lets benchmarks/expert_cache.py replace the
                                  router's expert ids with synthetic traces (default 0; never for
                                  serving: the outputs are then meaningless)

A bad value raises LvllmConfigError (a ValueError) naming the variable and what it accepts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import FrozenSet, Mapping, Optional


class LvllmConfigError(ValueError):
    """An LVLLM_* variable has a value lvllm cannot use."""


@dataclass(frozen=True)
class LvllmConfig:
    enabled: bool = False
    gpu_prefill_min_batch: int = 0
    prefetch_window: int = 1
    resident_layers: FrozenSet[int] = field(default_factory=frozenset)
    stats_interval: int = 60  # seconds; 0 = no statistics
    expert_cache_gib: float = 0.0  # 0 = no GPU expert cache
    expert_cache_auto: bool = False  # LVLLM_GPU_EXPERT_CACHE=auto: sized by lvllm.autofit at the first MoE layer
    draft_moe: str = "gpu"  # "gpu" | "cpu": where a speculative draft model's MoE layers run
    bench_routing_replay: bool = False
    auto_fit: bool = False  # LVLLM_AUTO_FIT=1: lvllm.autofit plans what the settings above leave unset
    exclusive_engine_cpus: bool = False  # LVLLM_EXCLUSIVE_ENGINE_CPUS=1: other threads off the workers' CPUs
    cuda_blocking_sync: bool = False  # LVLLM_CUDA_BLOCKING_SYNC=1: the worker's CUDA waits sleep

    def is_resident(self, layer_index: int) -> bool:
        return layer_index in self.resident_layers


TRUE_VALUES = {"1", "true", "yes", "on"}
FALSE_VALUES = {"0", "false", "no", "off", ""}


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in TRUE_VALUES:
        return True
    if raw in FALSE_VALUES:
        return False
    raise LvllmConfigError(f"{name}={env[name]!r} is not a boolean (use 1/0, true/false)")


# Parsed here rather than with lk_moe.config's twin: with the master switch off, nothing of
# lk_moe may be imported (it loads torch and the engine).
def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise LvllmConfigError(f"{name}={raw!r} is not an integer (expected {lo}..{hi})") from None
    if not lo <= value <= hi:
        raise LvllmConfigError(f"{name}={value} is out of range (expected {lo}..{hi})")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, choices) -> str:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw not in choices:
        raise LvllmConfigError(f"{name}={env[name]!r} is not one of {', '.join(choices)}")
    return raw


def _gib(env: Mapping[str, str], name: str, hi: float) -> float:
    raw = env.get(name, "").strip()
    if raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise LvllmConfigError(f"{name}={raw!r} is not a number of GiB (expected 0..{hi:g}; 0 = off) or auto") from None
    if not 0 <= value <= hi:  # also refuses nan and inf
        raise LvllmConfigError(f"{name}={raw} is out of range (expected 0..{hi:g} GiB; 0 = off)")
    return value


MAX_LAYER_INDEX = 10_000  # bounds the set a typo like 0-99999999 would build


def parse_layer_set(text: str, name: str = "LVLLM_GPU_RESIDENT_MOE_LAYERS") -> FrozenSet[int]:
    """ "0-3,40" -> {0, 1, 2, 3, 40}; empty -> {}."""
    layers = set()
    for part in text.replace(" ", "").split(","):
        if part == "":
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo, 10)
            b = int(hi, 10) if sep else a
        except ValueError:
            raise LvllmConfigError(f"{name}: {part!r} is not a layer index or range like 0-3 "
                                   f"(full value {text!r})") from None
        if b > MAX_LAYER_INDEX:
            what = f"range {part!r} goes" if sep else f"layer {b} is"
            raise LvllmConfigError(f"{name}: {what} past layer index {MAX_LAYER_INDEX}, the largest accepted "
                                   f"(full value {text!r})")
        if b < a:
            raise LvllmConfigError(f"{name}: range {part!r} must be ascending (first-last, e.g. 0-3)")
        layers.update(range(a, b + 1))
    return frozenset(layers)


def from_env(env: Optional[Mapping[str, str]] = None) -> LvllmConfig:
    env = os.environ if env is None else env
    cache_auto = env.get("LVLLM_GPU_EXPERT_CACHE", "").strip().lower() == "auto"
    return LvllmConfig(
        enabled=_bool(env, "LVLLM_MOE_NUMA_ENABLED"),
        gpu_prefill_min_batch=_int(env, "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", 0, 0, 1 << 24),
        prefetch_window=_int(env, "LVLLM_GPU_PREFETCH_WINDOW", 1, 0, 1),
        resident_layers=parse_layer_set(env.get("LVLLM_GPU_RESIDENT_MOE_LAYERS", "")),
        stats_interval=_int(env, "LVLLM_STATS_INTERVAL", 60, 0, 86_400),
        expert_cache_gib=0.0 if cache_auto else _gib(env, "LVLLM_GPU_EXPERT_CACHE", 4096.0),
        expert_cache_auto=cache_auto,
        draft_moe=_choice(env, "LVLLM_DRAFT_MOE", "gpu", ("gpu", "cpu")),
        bench_routing_replay=_bool(env, "LVLLM_BENCH_ROUTING_REPLAY"),
        auto_fit=_bool(env, "LVLLM_AUTO_FIT"),
        exclusive_engine_cpus=_bool(env, "LVLLM_EXCLUSIVE_ENGINE_CPUS"),
        cuda_blocking_sync=_bool(env, "LVLLM_CUDA_BLOCKING_SYNC"),
    )
