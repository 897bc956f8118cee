"""Engine settings from the environment, parsed once into a typed object.

LK_THREADS         worker threads (default: physical cores of the CPUs this process may use)
LK_THREAD_BINDING  CPU_CORE (default) | NUMA_NODE | NONE
LK_ISA             a kernel tier: generic | avx2 | avx512 | avx512_bf16 | amx, the rows of
                   csrc/cpu/isa_tiers.h (ISAS) (default: best the CPU has)
LK_SPIN_US         microseconds a worker busy-waits for the next job before parking (default 1000)
LK_CPU_SIGNAL      how a CUDA stream hands work to the engine: auto (default: kernel for decode-sized
                   calls, hostfn for bigger ones and where the kernel cannot run) | hostfn (a
                   host-function node) | mailbox (mapped-memory flags served by a polling thread; one
                   CPU core and one GPU thread spin while waiting) | kernel (one CUDA kernel per call
                   moves the data through mapped memory and spins until a polling thread answers; one
                   CPU core and one GPU block spin while waiting; gives up with NaN after 10 s).
                   Measured overhead per layer at M = 1 (lk_moe/cpu_path.py): kernel 24.5 us,
                   mailbox 36.5 us, hostfn 62.6 us
LK_FORCE_GPU_FALLBACK  1 | 0 (default): GPU paths of quantized experts take the fallback kernels
                   (dequantize to bf16 on the GPU, then the bf16 GEMM) even where vLLM's native
                   fused-MoE kernel for the format would be chosen (lk_moe.gpu_native: fp8_block and
                   fp8_channel from sm_89, int8_channel and wna16_int4 from sm_80; mxfp4 and nvfp4
                   always take the fallback). See lk_moe.gpu_dequant.gpu_path.
LK_INT8_ACT        auto (default) | 1 | 0 (true/false, yes/no, on/off): int8 activations in the decode
                   of 4-bit and int8_channel experts (wna16_int4, mxfp4, nvfp4, int8_channel), and in their
                   prefill on the avx2 / avx512 / avx512_bf16 tiers (1: on; auto and 0: off, the 4-bit formats'
                   decode takes 15-bit activations on every tier but generic, bf16's error; see
                   csrc/cpu/format.h). LK_WNA16_INT8_ACT, its first
                   name (1: int4 only, no auto), is read while it is unset. Read again each time a layer is
                   built (int8_act_from_env).

Empty means unset for every variable.

A bad value raises ConfigError (a ValueError) naming the variable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from . import _C

BINDINGS = ("CPU_CORE", "NUMA_NODE", "NONE")
SIGNALS = ("auto", "hostfn", "mailbox", "kernel")
ISAS = tuple(_C.all_isas())  # the kernel tiers, lowest first (csrc/cpu/isa_tiers.h)


class ConfigError(ValueError):
    """A setting has a value the engine cannot use."""


@dataclass(frozen=True)
class EngineConfig:
    threads: int = 0  # 0: physical cores of the allowed CPUs
    binding: str = "CPU_CORE"
    isa: Optional[str] = None  # None: best supported
    spin_us: int = 1000
    cpu_signal: str = "auto"
    force_gpu_fallback: bool = False
    int8_act: str = "auto"  # auto | on | off | int4 (LK_INT8_ACT; int4: LK_WNA16_INT8_ACT=1)


TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off", "")


def _bool_var(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in TRUE_VALUES:
        return True
    if raw in FALSE_VALUES:
        return False
    raise ConfigError(f"{name}={env.get(name)!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def force_gpu_fallback(env: Optional[Mapping[str, str]] = None) -> bool:
    """LK_FORCE_GPU_FALLBACK alone (read by the GPU paths when they are built)."""
    return _bool_var(os.environ if env is None else env, "LK_FORCE_GPU_FALLBACK")


# LK_INT8_ACT first, then its first name LK_WNA16_INT8_ACT: (name, its "1" as a setting, takes auto)
_INT8_ACT_VARS = (("LK_INT8_ACT", "on", True), ("LK_WNA16_INT8_ACT", "int4", False))


def int8_act_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """LK_INT8_ACT (or LK_WNA16_INT8_ACT while it is unset) as "auto", "on", "off" or "int4" (the first name's
    1: int8 for wna16_int4 only; auto is off everywhere since 2026-12-04). Parsed on
    every layer build, since the engine reads the variable then (tests switch it between layers)."""
    env = os.environ if env is None else env
    for name, on, takes_auto in _INT8_ACT_VARS:
        raw = env.get(name, "").strip().lower()
        if raw == "":
            continue
        if raw == "auto" and takes_auto:
            return "auto"
        if raw in TRUE_VALUES:
            return on
        if raw in FALSE_VALUES:
            return "off"
        raise ConfigError(f"{name}={env.get(name)!r} is not a switch: use {'auto, ' if takes_auto else ''}"
                          "1/0, true/false, yes/no or on/off")
    return "auto"


def _int_var(env: Mapping[str, str], name: str, lo: int, hi: int) -> Optional[int]:
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer (expected {lo}..{hi})") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} is out of range (expected {lo}..{hi})")
    return value


def from_env(env: Optional[Mapping[str, str]] = None, logical_cpus: Optional[int] = None) -> EngineConfig:
    """Parse the LK_* variables. `logical_cpus` bounds LK_THREADS (default: CPUs we may run on)."""
    env = os.environ if env is None else env
    if logical_cpus is None:
        logical_cpus = len(os.sched_getaffinity(0))
    threads = _int_var(env, "LK_THREADS", 1, 4096)
    if threads is not None and threads > logical_cpus:
        raise ConfigError(
            f"LK_THREADS={threads} exceeds the {logical_cpus} logical CPUs this process may use "
            f"(see `taskset -p $$` / the container's cpuset); use at most {logical_cpus}"
        )
    binding = env.get("LK_THREAD_BINDING", "").strip().upper() or "CPU_CORE"
    if binding not in BINDINGS:
        raise ConfigError(
            f"LK_THREAD_BINDING={env.get('LK_THREAD_BINDING')!r} is not one of {', '.join(BINDINGS)}"
        )
    isa = env.get("LK_ISA", "").strip().lower() or None
    if isa is not None and isa not in ISAS:
        raise ConfigError(f"LK_ISA={env.get('LK_ISA')!r} is not one of {', '.join(ISAS)}")
    spin = _int_var(env, "LK_SPIN_US", 0, 1_000_000)
    signal = env.get("LK_CPU_SIGNAL", "").strip().lower() or "auto"
    if signal not in SIGNALS:
        raise ConfigError(f"LK_CPU_SIGNAL={env.get('LK_CPU_SIGNAL')!r} is not one of {', '.join(SIGNALS)}")
    return EngineConfig(
        threads=threads or 0, binding=binding, isa=isa, spin_us=1000 if spin is None else spin, cpu_signal=signal,
        force_gpu_fallback=force_gpu_fallback(env), int8_act=int8_act_from_env(env),
    )
