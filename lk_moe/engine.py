"""Process-wide engine state: the applied config, the ISA tier and the default thread pool."""
from __future__ import annotations

import threading
from typing import Optional

from . import _C
from .config import ConfigError, EngineConfig, from_env

_lock = threading.Lock()
_config: Optional[EngineConfig] = None
_pool = None


def config() -> EngineConfig:
    """The engine config, parsed from the environment on first use and applied (LK_ISA)."""
    global _config
    with _lock:
        if _config is None:
            cfg = from_env()
            if cfg.isa is not None:
                try:
                    _C.set_isa(cfg.isa)
                except ValueError as e:
                    raise ConfigError(f"LK_ISA={cfg.isa}: {e}") from None
            _config = cfg
        return _config


def isa() -> str:
    """The ISA tier the kernels run with (generic, avx2, avx512, avx512_bf16 or amx)."""
    config()
    return _C.isa()


def set_isa(name: str) -> None:
    """Switch the kernel tier (same checks as LK_ISA); layers keep working, their layout is shared."""
    config()
    _C.set_isa(name)


def supported_isas() -> list:
    return list(_C.supported_isas())


def default_pool():
    """The shared worker pool, built from LK_THREADS / LK_THREAD_BINDING / LK_SPIN_US on first use."""
    global _pool
    cfg = config()
    with _lock:
        if _pool is None:
            _pool = _C.ThreadPool(threads=cfg.threads, binding=cfg.binding, spin_us=cfg.spin_us)
        return _pool


def make_pool(threads: int = 0, binding: str = "CPU_CORE", spin_us: int = 1000, sysfs_root: str = "/sys",
              allowed=None):
    """A separate pool (tests, benchmarks). threads=0: physical cores."""
    return _C.ThreadPool(threads=threads, binding=binding, spin_us=spin_us, sysfs_root=sysfs_root,
                         allowed=list(allowed or []))
