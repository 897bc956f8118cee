"""Where the machine's CPU time went during a measured window, thread by thread (every process).

A hybrid decode step waits for the slowest engine worker: a worker that shares its core with another busy
thread (a CUDA stream-sync spinner, vLLM's output thread, a front-end process) stretches every layer it is
preempted in. `snapshot()` before and after the window, `busiest()` names the threads that ran, how much
of a core each took, and how often each was preempted (involuntary context switches). The engine's
threads are named lk_moe-w<N> (workers), lk_moe-poller and lk_moe-mailbox.
"""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

_TICK = os.sysconf("SC_CLK_TCK")

# (pid, tid) -> (name, cpu seconds, involuntary switches, CPU it last ran on)
Snapshot = Dict[Tuple[int, int], Tuple[str, float, int, int]]


def _thread(pid: str, tid: str):
    base = f"/proc/{pid}/task/{tid}"
    with open(f"{base}/stat") as f:
        stat = f.read()
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd (state) on
    cpu_s = (int(rest[11]) + int(rest[12])) / _TICK  # utime, stime
    last_cpu = int(rest[36])  # field 39: processor
    nonvol = 0
    with open(f"{base}/status") as f:
        for line in f:
            if line.startswith("nonvoluntary_ctxt_switches"):
                nonvol = int(line.split()[1])
    return name, cpu_s, nonvol, last_cpu


def snapshot() -> Snapshot:
    """Every thread of every process now (threads that end meanwhile are skipped)."""
    out: Snapshot = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                out[(int(pid), int(tid))] = _thread(pid, tid)
            except (OSError, ValueError, IndexError):
                continue
    return out


def busiest(before: Snapshot, after: Snapshot, seconds: float, n: int = 16) -> List[dict]:
    """The n threads that used the most CPU between the snapshots: name, pid, tid, share of one core,
    involuntary context switches, the CPU each last ran on."""
    rows = []
    for key, (name, cpu_s, nonvol, last_cpu) in after.items():
        b = before.get(key)
        used, preempted = (cpu_s - b[1], nonvol - b[2]) if b else (cpu_s, nonvol)
        if used > 0 or preempted > 0:
            rows.append({"name": name, "pid": key[0], "tid": key[1], "core_share": round(used / seconds, 3),
                         "preempted": preempted, "cpu": last_cpu})
    rows.sort(key=lambda r: (-r["core_share"], -r["preempted"]))
    return rows[:n]


def summary(rows: List[dict], cores: int) -> str:
    """One line: the engine workers' share and preemptions against everything else that was busy."""
    workers = [r for r in rows if r["name"].startswith("lk_moe-w")]
    others = [r for r in rows if not r["name"].startswith("lk_moe-w") and r["core_share"] >= 0.2]
    busy = sum(r["core_share"] for r in rows)
    return (f"{len(workers)} engine workers: {sum(r['core_share'] for r in workers):.1f} cores, "
            f"{sum(r['preempted'] for r in workers)} preemptions; other threads at >= 0.2 of a core: "
            + (", ".join(f"{r['name']}[{r['pid']}] {r['core_share']:.2f}" for r in others) or "none")
            + f"; listed threads {busy:.1f} of {cores} cores")
