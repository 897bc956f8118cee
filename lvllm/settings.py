"""Every LVLLM_* and LK_* setting checked at once, in the first process that loads the plugin.

`vllm serve` loads the plugin in its API-server process before any engine or model work: checking
here turns a bad value into one clear startup error there, instead of a failure inside a worker
minutes later when the first MoE layer builds its thread pool. `lvllm doctor` runs the same check.

Names of the LVLLM_/LK_ families that are no setting (a typo like LK_THREAD) get a warning with the
closest setting; the build's and the scripts' own variables are known and pass.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional

from .config import LvllmConfig, LvllmConfigError, from_env

# Read by the plugin (lvllm.config) and by the engine (lk_moe.config, csrc/cpu/moe_layer.cpp).
PLUGIN_SETTINGS = ("LVLLM_MOE_NUMA_ENABLED", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", "LVLLM_GPU_PREFETCH_WINDOW",
                   "LVLLM_GPU_RESIDENT_MOE_LAYERS", "LVLLM_STATS_INTERVAL", "LVLLM_GPU_EXPERT_CACHE",
                   "LVLLM_DRAFT_MOE", "LVLLM_BENCH_ROUTING_REPLAY", "LVLLM_AUTO_FIT", "LVLLM_EXCLUSIVE_ENGINE_CPUS",
                   "LVLLM_CUDA_BLOCKING_SYNC")
ENGINE_SETTINGS = ("LK_THREADS", "LK_THREAD_BINDING", "LK_ISA", "LK_SPIN_US", "LK_CPU_SIGNAL",
                   "LK_FORCE_GPU_FALLBACK", "LK_INT8_ACT", "LK_WNA16_INT8_ACT")
# Read by the build (setup.py), the launch scripts (commands/), the test and device harnesses.
# LVLLM_METRICS_DIR: set by the first process for those it starts (lvllm.metrics).
TOOL_VARIABLES = ("LK_CUDA", "LK_BUILD_TYPE", "LVLLM_DRY_RUN", "LVLLM_VENV", "LVLLM_PYTHON",
                  "LVLLM_USE_SYSTEM_PYTHON", "LVLLM_EXIT_CHECK", "LVLLM_METRICS_DIR")
TOOL_PREFIXES = ("LVLLM_DEVICE_", "LVLLM_E2E_", "LVLLM_TEST_")  # LVLLM_TEST_: lvllm.testing instrumentation


class SettingsError(ValueError):
    """A setting has a value lvllm or its engine cannot use (the message names the variable)."""


@dataclass
class Settings:
    plugin: LvllmConfig
    engine: object  # lk_moe.config.EngineConfig
    warnings: List[str] = field(default_factory=list)


def unknown_names(env: Mapping[str, str]) -> List[str]:
    """One warning per LVLLM_*/LK_* variable that nothing reads, naming the closest setting."""
    settings = PLUGIN_SETTINGS + ENGINE_SETTINGS
    out = []
    for name in sorted(env):
        if not name.startswith(("LVLLM_", "LK_")) or name in settings or name in TOOL_VARIABLES:
            continue
        if name.startswith(TOOL_PREFIXES):
            continue
        close = difflib.get_close_matches(name, settings, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else f"the settings are {', '.join(settings)}"
        out.append(f"{name} is not an lvllm setting and is ignored ({hint})")
    return out


def check(env: Optional[Mapping[str, str]] = None) -> Settings:
    """Parse every setting; raise SettingsError naming the first bad one. Imports lk_moe (its engine
    library parses LK_ISA against the CPU's tiers); a tree without the built engine says so."""
    env = dict(os.environ if env is None else env)
    try:
        plugin = from_env(env)
    except LvllmConfigError as e:
        raise SettingsError(str(e)) from None
    try:
        import lk_moe
        from lk_moe.config import ConfigError, from_env as engine_from_env
    except ImportError as e:
        raise SettingsError(str(e)) from None
    try:
        engine = engine_from_env(env)
    except ConfigError as e:
        raise SettingsError(str(e)) from None
    if engine.isa is not None and engine.isa not in lk_moe.supported_isas():
        raise SettingsError(f"LK_ISA={engine.isa!r}: this CPU does not have that tier; it has "
                            f"{', '.join(lk_moe.supported_isas())}")
    return Settings(plugin, engine, unknown_names(env))
