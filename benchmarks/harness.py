"""What the vLLM benchmarks share: the host read-bandwidth probe their bounds come from, and a child
process (one vLLM per mode, as a user runs it) whose log streams to a file and whose milestones and
RESULT lines come back as they happen."""
from __future__ import annotations

import json
import statistics
import subprocess
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
    "timeout", the parsed results)."""
    results = []
    t = time.time()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for ln in p.stdout:
                log.write(ln)
                if any(m in ln for m in marks):
                    print(f"  [{label} +{time.time() - t:5.0f}s] {ln.strip()[:300]}", flush=True)
                if ln.startswith("RESULT "):
                    results.append(json.loads(ln[7:]))
                    if on_result is not None:
                        on_result(results[-1])
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
    return rc, results
