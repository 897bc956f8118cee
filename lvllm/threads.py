"""How many engine threads a vLLM worker gets, and on which CPUs.

Each rank's engine gets its own contiguous share of the CPUs this process may use (rank r of n
local ranks: the r-th n-th), so two TP ranks never pin workers to the same cores. Default thread
count: the physical cores of that share minus the cores the rank's own busy threads need: the
Python/GPU-driving thread (it spin-waits on the GPU) and, from 12 cores up, one more for the thread
that hands each decode layer to the pool (CUDA's host-function thread or the mailbox/kernel poller,
which spins while the pool computes). Measured on a 16-core host: 16 workers ran decode ~6x slower
than 15 (docs/results/2026-11-30_h200_cpu_path_threads16.log); with 15, 17 spinning threads still
share 16 cores. LK_THREADS overrides the count per rank; it must fit in the share.
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


def reserved_cores(phys: int) -> int:
    """Cores of a rank's share left to its own busy threads (see the module docstring)."""
    return 2 if phys >= 12 else 1


def plan_threads(local_rank: int, local_world: int, lk_threads: Optional[int],
                 allowed: Optional[Sequence[int]] = None, sysfs_root: str = "/sys") -> ThreadPlan:
    """lk_threads: LK_THREADS (None = default)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    cpus = rank_cpus(allowed, local_rank, local_world)
    phys = physical_cores(cpus, sysfs_root)
    default = max(1, phys - reserved_cores(phys))
    if lk_threads is None:
        threads = default
    else:
        if lk_threads > len(cpus):
            raise ValueError(
                f"LK_THREADS={lk_threads} is more than the {len(cpus)} CPUs of this rank's share "
                f"(CPUs {cpus[0]}-{cpus[-1]} of {len(allowed)} split between {local_world} local rank(s)); "
                f"use at most {len(cpus)}, or unset it for {default}")
        threads = lk_threads
    return ThreadPlan(tuple(cpus), threads, phys)


WORKER_NAME_PREFIX = "lk_moe-w"  # the engine's pool names its workers lk_moe-w<N> (csrc/cpu/thread_pool.cpp)
# The engine's threads that hand each decode layer to the pool (the kernel-signal and mailbox pollers): on
# the critical path of every layer, they spin while the pool computes.
SIGNAL_THREAD_NAMES = ("lk_moe-poller", "lk_moe-mailbox")


def split_spare_cpus(spare: Sequence[int], has_signal_thread: bool):
    """(CPUs of the signal threads, CPUs of every other non-worker thread): the first spare CPU to the
    signal threads alone when there are two or more spare CPUs, else one set shared by all."""
    spare = sorted(spare)
    if has_signal_thread and len(spare) >= 2:
        return spare[:1], spare[1:]
    return spare, spare


def keep_others_off_workers(share_cpus: Sequence[int], task_dir: str = "/proc/self/task") -> str:
    """LVLLM_EXCLUSIVE_ENGINE_CPUS: every thread of this process but the engine's workers onto the CPUs of the
    rank's share that no worker is pinned to; the engine's signal thread (poller) gets one of them alone,
    the others (the GPU-driving thread, vLLM's and torch's threads) share the rest. Crowding the poller in
    with the others made decode 2.8x slower (docs/results/2026-12-04_h200_session26.log): it starts every
    layer's job. Threads started later inherit their starter's CPUs. Returns what was done, for the log;
    changes nothing when no worker is pinned to a single CPU or no CPU is left over."""
    workers, signal, others = [], [], []
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # ended meanwhile
        group = (workers if name.startswith(WORKER_NAME_PREFIX) else
                 signal if name in SIGNAL_THREAD_NAMES else others)
        group.append(int(tid))
    if not workers:
        return "LVLLM_EXCLUSIVE_ENGINE_CPUS: no engine workers in this process: nothing moved"
    pinned = [os.sched_getaffinity(t) for t in workers]
    if any(len(cpus) != 1 for cpus in pinned):
        return ("LVLLM_EXCLUSIVE_ENGINE_CPUS: the engine's workers are not pinned one per CPU "
                "(LK_THREAD_BINDING): nothing moved")
    spare = sorted(set(share_cpus) - set().union(*pinned))
    if not spare:
        return (f"LVLLM_EXCLUSIVE_ENGINE_CPUS: the {len(workers)} workers take every CPU of this rank's share: "
                "nothing moved (lower LK_THREADS)")
    signal_cpus, other_cpus = split_spare_cpus(spare, bool(signal))
    moved = {"signal": 0, "other": 0}
    for group, cpus, key in ((signal, signal_cpus, "signal"), (others, other_cpus, "other")):
        for tid in group:
            try:
                os.sched_setaffinity(tid, cpus)
                moved[key] += 1
            except OSError:
                continue  # ended meanwhile
    where = ",".join(map(str, other_cpus))
    alone = signal_cpus != other_cpus
    poller = ("" if not moved["signal"] else f"; the engine's signal thread alone on CPU {signal_cpus[0]}" if alone
              else "; the engine's signal thread with them")
    return (f"LVLLM_EXCLUSIVE_ENGINE_CPUS: {moved['other']} other threads of this process on CPUs {where}{poller}; "
            f"the {len(workers)} engine workers alone on theirs")
