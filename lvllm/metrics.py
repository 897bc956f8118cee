"""lk_moe's counters on vLLM's own `/metrics` endpoint (Prometheus text format, no second server).

The counters live in the worker processes; `/metrics` is served by the API-server process, which
shares no memory with them. So: the first process that loads the plugin (the API server of
`vllm serve`, or the script that calls `LLM()`) makes a directory, names it in LVLLM_METRICS_DIR
(inherited by the engine-core and worker processes it starts) and registers a collector with
prometheus_client's default registry, the one `/metrics` serves. Each worker writes a snapshot of
its totals there every SNAPSHOT_PERIOD seconds (one small JSON file per process, replaced
atomically); a scrape reads the files of live processes.

With `--api-server-count` > 1 vLLM serves a multiprocess registry of its own instead, and these
metrics are not on `/metrics` (the statistics log lines still are).

Names follow Prometheus conventions: `lvllm_` prefix, base units, `_total` for counters.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import Callable, Dict, Iterable, List, Optional

logger = logging.getLogger("vllm.lvllm")

DIR_VARIABLE = "LVLLM_METRICS_DIR"
SNAPSHOT_PERIOD = 5.0  # seconds between a worker's snapshots: a scrape sees totals at most this old

PATHS = ("cpu_decode", "cpu_prefill", "gpu_prefill")
# name -> (help text, labelled by path); every value a counter since the worker started.
COUNTERS = {
    "lvllm_moe_calls": ("MoE layer calls of the hybrid layers, by path (CPU decode, CPU prefill, "
                        "streamed GPU prefill)", True),
    "lvllm_moe_tokens": ("Tokens through the model's first hybrid MoE layer, by path (rows of graph "
                         "padding and of warm-up, capture and profile runs are not tokens)", True),
    "lvllm_moe_expert_seconds": ("Seconds spent computing routed experts, by path: the CPU engine's "
                                 "wall time per call, and GPU time of streamed-prefill layers", True),
    "lvllm_engine_queue_wait_seconds": ("Seconds CPU expert calls waited for the engine's workers to "
                                        "start them (earlier jobs, waking parked workers)", False),
    "lvllm_cpu_graph_steps": ("Forward steps whose CPU expert calls replayed from CUDA graphs (the rest of the "
                              "CPU-path steps ran eagerly)", False),
    "lvllm_h2d_bytes": ("Bytes of routed experts copied host to device by streamed GPU prefill", False),
    "lvllm_h2d_seconds": ("GPU time of the streamed-prefill layers those bytes were copied in", False),
    "lvllm_cpu_expert_errors": ("CPU expert calls whose output was NaN (invalid expert ids, or a "
                                "kernel-signal call that gave up waiting for the engine)", False),
    "lvllm_expert_cache_lookups": ("Routed (token, expert) pairs of the hybrid layers looked up in the GPU "
                                   "expert cache (LVLLM_GPU_EXPERT_CACHE)", False),
    "lvllm_expert_cache_hits": ("Of those, the pairs computed on the GPU from a cached expert", False),
    "lvllm_expert_cache_refills": ("Experts copied into GPU expert cache slots", False),
    "lvllm_expert_cache_refill_bytes": ("Bytes copied host to device by those refills", False),
}

# name -> (help text, label) of the gauges: the worker's value at its last snapshot.
GAUGES = {
    "lvllm_pinned_host_bytes": ("Page-locked host memory of the worker, by kind: the engine's expert weights "
                                "registered for streamed prefill (engine), torch's pinned-memory pool, which holds "
                                "lk_moe's staging and vLLM's own pinned buffers (torch). The kernel's VmPin counts "
                                "neither", "kind"),
}
PINNED_KINDS = ("engine", "torch")

_dir_owner: Optional[tempfile.TemporaryDirectory] = None  # the first process's directory


def pinned_host_bytes() -> Dict[str, int]:
    """This process's page-locked host memory by kind (PINNED_KINDS); 0 where the engine is not loaded or
    torch's pinned pool holds nothing (no CUDA)."""
    import sys
    import torch
    lk = sys.modules.get("lk_moe._C")  # only where the worker loaded the engine: never import it for this
    return {"engine": int(lk.registered_host_bytes()) if lk is not None else 0,
            "torch": int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))}


def setup_first_process(env=None) -> Optional[str]:
    """In the first process that loads the plugin (no LVLLM_METRICS_DIR yet): make the directory,
    export it to the processes started later, register the collector. Returns the directory made,
    None in the processes started by it (they only write)."""
    global _dir_owner
    env = os.environ if env is None else env
    if env.get(DIR_VARIABLE):
        return None
    _dir_owner = tempfile.TemporaryDirectory(prefix="lvllm-metrics-")
    env[DIR_VARIABLE] = _dir_owner.name
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # vLLM depends on it; without it there is no /metrics to serve either
        return _dir_owner.name
    REGISTRY.register(SnapshotCollector(_dir_owner.name))
    return _dir_owner.name


def snapshot_of(totals, errors_total: int, rank: int, pinned: Optional[Dict[str, int]] = None) -> dict:
    """The file a worker writes: lvllm.stats.Totals plus the error count and its pinned host bytes by kind."""
    return {
        "pid": os.getpid(), "rank": rank,
        "lvllm_moe_calls": {"cpu_decode": totals.cpu_decode_calls, "cpu_prefill": totals.cpu_prefill_calls,
                            "gpu_prefill": totals.gpu_calls},
        "lvllm_moe_tokens": {"cpu_decode": totals.cpu_decode_tokens, "cpu_prefill": totals.cpu_prefill_tokens,
                             "gpu_prefill": totals.gpu_tokens},
        "lvllm_moe_expert_seconds": {"cpu_decode": totals.cpu_decode_ns / 1e9,
                                     "cpu_prefill": totals.cpu_prefill_ns / 1e9,
                                     "gpu_prefill": totals.gpu_ms / 1e3},
        "lvllm_engine_queue_wait_seconds": totals.cpu_queue_ns / 1e9,
        "lvllm_cpu_graph_steps": totals.cpu_graph_steps,
        "lvllm_h2d_bytes": totals.gpu_bytes,
        "lvllm_h2d_seconds": totals.gpu_ms / 1e3,
        "lvllm_cpu_expert_errors": errors_total,
        "lvllm_expert_cache_lookups": totals.cache_lookups,
        "lvllm_expert_cache_hits": totals.cache_hits,
        "lvllm_expert_cache_refills": totals.cache_refills,
        "lvllm_expert_cache_refill_bytes": totals.cache_refill_bytes,
        "lvllm_pinned_host_bytes": pinned,
    }


def _write(directory: str, snap: dict) -> None:
    path = os.path.join(directory, f"rank{snap['rank']}-pid{snap['pid']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(snap, f)
    os.replace(tmp, path)  # a scrape never reads half a file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_snapshots(directory: str) -> List[dict]:
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                snap = json.load(f)
        except (OSError, ValueError):
            continue
        if _alive(int(snap.get("pid", -1))):  # a dead worker's counters go with it, as in-process ones would
            out.append(snap)
    return out


class SnapshotCollector:
    """A prometheus_client collector over the workers' snapshot files."""

    def __init__(self, directory: str):
        self.directory = directory

    def describe(self):
        return []  # not known before a scrape: do not call collect() at registration

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        snaps = read_snapshots(self.directory)
        for name, (help_text, label) in GAUGES.items():
            fam = GaugeMetricFamily(name, help_text, labels=["rank", label])
            for snap in snaps:
                for kind, value in (snap.get(name) or {}).items():
                    fam.add_metric([str(snap["rank"]), kind], float(value))
            yield fam
        for name, (help_text, by_path) in COUNTERS.items():
            fam = CounterMetricFamily(name, help_text, labels=["rank", "path"] if by_path else ["rank"])
            for snap in snaps:
                rank = str(snap["rank"])
                value = snap.get(name)
                if by_path:
                    for path in PATHS:
                        fam.add_metric([rank, path], float((value or {}).get(path, 0)))
                elif value is not None:
                    fam.add_metric([rank], float(value))
            yield fam


class SnapshotWriter:
    """A worker's daemon thread: its totals into the directory every `period` seconds (it ends with the
    worker; a scrape then leaves the dead process's file out). read: () -> (lvllm.stats.Totals, errors so far)."""

    def __init__(self, directory: str, rank: int, read: Callable[[], tuple], period: float = SNAPSHOT_PERIOD):
        self.directory, self.rank, self.read, self.period = directory, rank, read, period
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    def write_now(self) -> None:
        totals, errors = self.read()
        _write(self.directory, snapshot_of(totals, errors, self.rank, pinned_host_bytes()))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lk_moe-metrics", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread (after a snapshot being written, if any)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            try:
                self.write_now()
            except Exception:  # a failed snapshot must not end the snapshots
                logger.exception("lk_moe: writing the metrics snapshot failed")


def render(directory: str) -> str:
    """The Prometheus text of the snapshots (for tests and `lvllm` tools; /metrics does the same)."""
    from prometheus_client import CollectorRegistry, generate_latest
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(directory))
    return generate_latest(reg).decode()


def values(text: str) -> Dict[str, float]:
    """Samples of a Prometheus text page: 'name{labels}' -> value (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out
