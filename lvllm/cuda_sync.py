"""LVLLM_CUDA_BLOCKING_SYNC: a worker's CUDA context waits for the GPU by sleeping instead of spinning.

By default CUDA spins the waiting thread while fewer contexts than CPUs exist: vLLM's GPU-driving thread
then holds a core for the whole decode step, while the engine's workers want every core but the ones
left to that thread and the engine's poller. Blocking sync frees it, for a wake-up per synchronisation
(one or two per step). The runtime overwrites an initialised device's flags (cudaSetDeviceFlags), so this
runs at the first MoE layer, after vLLM set its device up.
"""
from __future__ import annotations

import ctypes

SCHEDULE_MASK = 0x07
SCHEDULE_BLOCKING_SYNC = 0x04
_NAMES = {0: "auto", 1: "spin", 2: "yield", 4: "blocking sync"}


def _cudart():
    """The libcudart this process already loaded (torch's), or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL | 4)  # 4 = RTLD_NOLOAD: only if already loaded
        except OSError:
            continue
    return None


def use_blocking_sync(cudart=None) -> str:
    """Switch the current device's waits to blocking sync; returns what was done, for the log.
    Raises RuntimeError when the runtime refuses (the message says which call and its error)."""
    rt = cudart if cudart is not None else _cudart()
    if rt is None:
        raise RuntimeError("LVLLM_CUDA_BLOCKING_SYNC=1: the CUDA runtime (libcudart) is not loaded in this process")
    flags = ctypes.c_uint(0)
    rc = rt.cudaGetDeviceFlags(ctypes.byref(flags))
    if rc != 0:
        raise RuntimeError(f"LVLLM_CUDA_BLOCKING_SYNC=1: cudaGetDeviceFlags failed (error {rc})")
    before = flags.value & SCHEDULE_MASK
    rc = rt.cudaSetDeviceFlags(ctypes.c_uint((flags.value & ~SCHEDULE_MASK) | SCHEDULE_BLOCKING_SYNC))
    if rc != 0:
        raise RuntimeError(f"LVLLM_CUDA_BLOCKING_SYNC=1: cudaSetDeviceFlags failed (error {rc})")
    rt.cudaGetDeviceFlags(ctypes.byref(flags))
    after = flags.value & SCHEDULE_MASK
    if after != SCHEDULE_BLOCKING_SYNC:
        raise RuntimeError(f"LVLLM_CUDA_BLOCKING_SYNC=1: the device kept its schedule "
                           f"({_NAMES.get(after, hex(after))}) after cudaSetDeviceFlags")
    return f"CUDA waits: {_NAMES.get(before, hex(before))} -> blocking sync"
