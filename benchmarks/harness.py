"""What the vLLM benchmarks share: the host read-bandwidth probe their bounds come from, and a child
process (one vLLM per mode, as a user runs it) whose log streams to a file and whose milestones and
RESULT lines come back as they happen."""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from typing import Callable, List, Optional


def read_bandwidth() -> float:
    """GB/s read by every physical core at once (lk_moe's probe, median of 7 over 4 GiB): the machine's
    bound, not the engine's threads'. The pool goes before the next mode's engine starts."""
    import lk_moe
    from lvllm.threads import plan_threads
    plan = plan_threads(0, 1, None)
    pool = lk_moe.make_pool(threads=plan.physical_cores, allowed=list(plan.cpus))
    bw = statistics.median(pool.measure_read_bandwidth(4 << 30, 7))
    del pool
    return bw


def run_child(cmd: List[str], env: dict, log_path: str, label: str, marks, timeout: float,
              on_result: Optional[Callable[[dict], None]] = None):
    """Run one benchmark child; its output into log_path, lines holding one of `marks` printed with the
    seconds since start, each `RESULT {json}` line parsed and handed to on_result. Returns (rc or
    "timeout", the parsed results). A child that outlives `timeout` seconds is stopped with SIGABRT, its
    processes (vLLM's engine core too) in its own session: PYTHONFAULTHANDLER makes each of them print
    every thread's Python stack into the log first, so a hang says where it hung."""
    results = []
    t = time.time()
    env = dict(env, PYTHONFAULTHANDLER="1")
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        deadline = t + timeout

        def watchdog():
            while p.poll() is None:
                if time.time() > deadline:
                    try:
                        os.killpg(p.pid, signal.SIGABRT)
                    except ProcessLookupError:
                        return
                    time.sleep(10)
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return
                time.sleep(1)
        threading.Thread(target=watchdog, daemon=True).start()
        try:
            for ln in p.stdout:
                log.write(ln)
                if any(m in ln for m in marks):
                    print(f"  [{label} +{time.time() - t:5.0f}s] {ln.strip()[:300]}", flush=True)
                if ln.startswith("RESULT "):
                    results.append(json.loads(ln[7:]))
                    if on_result is not None:
                        on_result(results[-1])
            rc = p.wait(timeout=30)  # its output has ended: it is done, or the watchdog stopped it
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = "killed"
        if time.time() > deadline:
            rc = "timeout"
            print(f"  [{label}] stopped after {timeout:.0f} s (SIGABRT: thread stacks in {log_path})", flush=True)
    return rc, results
