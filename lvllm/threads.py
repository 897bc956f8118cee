"""How many engine threads a vLLM worker gets, and on which CPUs.

Each rank's engine gets its own contiguous share of the CPUs this process may use (rank r of n
local ranks: the r-th n-th), so two TP ranks never pin workers to the same cores. Default thread
count: the physical cores of that share minus one, left to the rank's Python/GPU-driving thread
(measured: 16 workers + the GPU thread on 16 cores ran decode ~6x slower than 15 workers).
LK_THREADS overrides the count per rank; it must fit in the share.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class ThreadPlan:
    cpus: tuple  # logical CPUs this rank's pool may use
    threads: int
    physical_cores: int


def physical_cores(cpus: Sequence[int], sysfs_root: str = "/sys") -> int:
    cores = set()
    for c in cpus:
        base = f"{sysfs_root}/devices/system/cpu/cpu{c}/topology"
        try:
            with open(f"{base}/physical_package_id") as f:
                pkg = f.read().strip()
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
        except OSError:
            return len(cpus)  # no topology (some containers): count logical CPUs
        cores.add((pkg, core))
    return len(cores)


def rank_cpus(allowed: Sequence[int], local_rank: int, local_world: int) -> List[int]:
    allowed = sorted(allowed)
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} outside 0..{local_world - 1}")
    if len(allowed) < local_world:
        raise ValueError(f"{len(allowed)} CPU(s) cannot be split between {local_world} local ranks")
    n = len(allowed)
    return allowed[local_rank * n // local_world:(local_rank + 1) * n // local_world]


def plan_threads(local_rank: int, local_world: int, lk_threads: Optional[int],
                 allowed: Optional[Sequence[int]] = None, sysfs_root: str = "/sys") -> ThreadPlan:
    """lk_threads: LK_THREADS (None = default)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    cpus = rank_cpus(allowed, local_rank, local_world)
    phys = physical_cores(cpus, sysfs_root)
    if lk_threads is None:
        threads = max(1, phys - 1)
    else:
        if lk_threads > len(cpus):
            raise ValueError(
                f"LK_THREADS={lk_threads} is more than the {len(cpus)} CPUs of this rank's share "
                f"(CPUs {cpus[0]}-{cpus[-1]} of {len(allowed)} split between {local_world} local rank(s)); "
                f"use at most {len(cpus)}, or unset it for {max(1, phys - 1)}")
        threads = lk_threads
    return ThreadPlan(tuple(cpus), threads, phys)
