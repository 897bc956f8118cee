"""Runtime statistics of one worker process, logged as one line per rank every
LVLLM_STATS_INTERVAL seconds; the same totals feed the /metrics counters (lvllm.metrics).

What is counted, and where:
- CPU path: by the engine's host function (lk_moe HostCallCounters), so decode steps replayed
  from CUDA graphs, where no Python runs, are counted too. A step is a call of the model's first
  hybrid layer; tokens are its rows without graph padding; engine time sums all hybrid layers.
  The steps that ran eagerly are counted in Python as well: the rest replayed from CUDA graphs (a
  decode that left its graphs shows as eager steps).
- GPU (streamed) path: always eager, counted in Python per call. Its time is taken with CUDA
  events around each layer's forward and read once they completed (no added sync); H2D GB/s =
  bytes the layers streamed / time the main stream spent in them, so copies that overlap other
  work (prefetch) make it an effective rate.
- Errors of the CPU path (calls whose output is NaN: expert ids outside the layer's experts, or a
  kernel-signal call that gave up waiting for the engine): counted by the engine per call, taken
  by the reporting thread at each interval and logged at ERROR level with their counts per layer,
  in every interval that had any. The reporting thread runs with the statistics off too
  (lvllm.runtime.ERROR_CHECK_INTERVAL): a NaN is never left to be found downstream.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
import time
from dataclasses import dataclass, fields
from typing import Callable, Optional


@dataclass
class Totals:
    """Counts since the worker started (or, after `minus`, over an interval)."""
    cpu_steps: int = 0
    cpu_tokens: int = 0
    cpu_calls: int = 0  # MoE layer calls
    cpu_ns: int = 0  # engine wall time, all layers
    # The same split by the engine's decode/prefill-sized calls (lk_moe HostCallCounters.read_paths),
    # and the time calls waited for the pool to start them.
    cpu_decode_calls: int = 0
    cpu_decode_tokens: int = 0
    cpu_decode_ns: int = 0
    cpu_prefill_calls: int = 0
    cpu_prefill_tokens: int = 0
    cpu_prefill_ns: int = 0
    cpu_queue_ns: int = 0
    # CPU-path steps whose first hybrid layer ran with Python (eager, counted in apply); the others replayed from
    # CUDA graphs, where no Python runs
    cpu_eager_steps: int = 0
    gpu_steps: int = 0
    gpu_tokens: int = 0
    gpu_calls: int = 0
    gpu_bytes: int = 0  # streamed bytes whose layer time is known (gpu_ms)
    gpu_ms: float = 0.0
    # GPU expert cache (lk_moe.expert_cache): routed (token, expert) lookups of all hybrid layers,
    # those served from VRAM slots, refills started and their bytes.
    cache_lookups: int = 0
    cache_hits: int = 0
    cache_refills: int = 0
    cache_refill_bytes: int = 0

    @property
    def steps(self) -> int:
        return self.cpu_steps + self.gpu_steps

    @property
    def cpu_graph_steps(self) -> int:
        """CPU-path steps replayed from CUDA graphs (an interval's eager count may lead the engine's by a call)."""
        return max(0, self.cpu_steps - self.cpu_eager_steps)

    def minus(self, other: "Totals") -> "Totals":
        return Totals(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


def format_line(rank: int, seconds: float, d: Totals) -> str:
    engine = f"{d.cpu_ns / d.cpu_steps / 1e6:.1f} ms/step engine" if d.cpu_steps else "no engine time"
    h2d = (f"{d.gpu_bytes / 1e9:.1f} GB at {d.gpu_bytes / d.gpu_ms / 1e6:.1f} GB/s H2D" if d.gpu_ms > 0
           else "no H2D timed")
    line = (f"lk_moe stats (rank {rank}, last {seconds:.0f} s): {d.steps} steps; "
            f"CPU path {d.cpu_steps} steps, {d.cpu_tokens} tokens, {d.cpu_calls} layer calls, {engine}, "
            f"{d.cpu_graph_steps} steps from CUDA graphs; "
            f"GPU path {d.gpu_steps} steps, {d.gpu_tokens} tokens, {d.gpu_calls} layer calls, {h2d}")
    if d.cache_lookups:
        hit = d.cache_hits / d.cache_lookups
        line += (f"; expert cache hit rate {100 * hit:.1f}% (routed experts on the GPU {100 * hit:.0f}%, "
                 f"on the CPU {100 * (1 - hit):.0f}%), {d.cache_refills} refills, "
                 f"{d.cache_refill_bytes / 1e9:.2f} GB at {d.cache_refill_bytes / max(seconds, 1e-9) / 1e9:.2f} GB/s")
    return line


_GRAPH_STEPS = re.compile(r"CPU path (\d+) steps, .*?, (\d+) steps from CUDA graphs")


def graph_steps_in(log_text: str) -> tuple:
    """(CPU-path steps, those replayed from CUDA graphs) summed over the statistics lines of a log."""
    found = _GRAPH_STEPS.findall(log_text)
    return sum(int(s) for s, _ in found), sum(int(g) for _, g in found)


def _timing_event():
    import torch
    return torch.cuda.Event(enable_timing=True)  # recorded on the current stream


def format_errors(rank: int, seconds: float, per_layer, total: int) -> str:
    """per_layer: (layer index or None, count) of the layers with errors in the interval."""
    where = ", ".join(f"layer {'?' if i is None else i}: {n}" for i, n in per_layer)
    return (f"lk_moe: rank {rank}: {sum(n for _, n in per_layer)} CPU expert call(s) in the last {seconds:.0f} s "
            f"returned NaN ({where}): invalid expert ids from the router (neither one of the layer's experts "
            f"nor -1), or kernel-signal calls that timed out waiting for the engine (LK_CPU_SIGNAL); "
            f"{total} since start")


class WorkerStats:
    def __init__(self, rank: int, interval: float, log: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, new_event: Optional[Callable[[], object]] = None,
                 log_error: Optional[Callable[[str], None]] = None, lines: bool = True):
        """log: the statistics lines (INFO); log_error: the error lines (default: log); lines=False:
        errors only (LVLLM_STATS_INTERVAL=0)."""
        self.rank, self.interval, self.log, self.clock = rank, interval, log, clock
        self.log_error = log_error or log
        self.lines = lines
        self.errors_total = 0
        self._new_event = new_event or _timing_event
        self._layers = []  # (layer index, HybridMoE), in the order they were built
        self.first = None  # the hybrid layer that runs first in a step
        self.cache = None  # the worker's lk_moe.expert_cache.ExpertCache, if any
        self._counted = Totals()  # the fields counted in Python (GPU path, eager CPU steps); the others from the engine
        self._lock = threading.Lock()  # the reporting thread reads what apply writes
        self._pending = collections.deque()  # (start event, end event, bytes) not yet completed
        self._since = clock()
        self._last = Totals()
        self._thread = None
        self._stop = threading.Event()

    def add_layer(self, layer_index: Optional[int], hybrid) -> None:
        self._layers.append((layer_index, hybrid))
        indexed = [(i, h) for i, h in self._layers if i is not None]
        self.first = min(indexed, key=lambda p: p[0])[1] if indexed else self._layers[0][1]

    def hybrids(self) -> list:
        """The hybrid layers added so far, in model order where known."""
        return [h for _, h in sorted(self._layers, key=lambda p: -1 if p[0] is None else p[0])]

    # -- an eager CPU-path call, from apply (a captured graph's replays run no Python: the engine counts those alone)
    def cpu_eager(self, hybrid) -> None:
        if hybrid is self.first:
            with self._lock:
                self._counted.cpu_eager_steps += 1

    # -- the GPU path, called from apply around hybrid.forward (eager only)
    def gpu_begin(self, hybrid, tokens: int):
        with self._lock:
            if hybrid is self.first:
                self._counted.gpu_steps += 1
                self._counted.gpu_tokens += tokens
            self._counted.gpu_calls += 1
        start = self._new_event()
        start.record()
        st = hybrid.streamer
        return start, st, (st.bytes_copied if st is not None else 0)

    def gpu_end(self, mark) -> None:
        start, st, bytes_before = mark
        end = self._new_event()
        end.record()
        self._pending.append((start, end, (st.bytes_copied if st is not None else 0) - bytes_before))
        self._drain()

    def _drain(self) -> None:
        # Only completed events are read (query does not block). The streamed path syncs once per
        # layer, so the earlier layers' events are done by now; a step's last layer is read at the
        # next GPU-path call. Runs on the forward thread only: a CUDA call from the reporting
        # thread would open a context on device 0 in every rank's process.
        while self._pending and self._pending[0][1].query():
            start, end, nbytes = self._pending.popleft()
            ms = start.elapsed_time(end)
            with self._lock:
                self._counted.gpu_ms += ms
                self._counted.gpu_bytes += nbytes

    # -- reporting
    def totals(self) -> Totals:
        with self._lock:
            t = Totals(**{f.name: getattr(self._counted, f.name) for f in fields(Totals)})
        for _, hybrid in self._layers:
            (dc, dr, dns), (pc, pr, pns), queue_ns = hybrid.cpu_path.engine_paths()
            t.cpu_calls += dc + pc
            t.cpu_ns += dns + pns
            t.cpu_decode_calls += dc
            t.cpu_decode_ns += dns
            t.cpu_prefill_calls += pc
            t.cpu_prefill_ns += pns
            t.cpu_queue_ns += queue_ns
            if hybrid is self.first:
                t.cpu_steps, t.cpu_tokens = dc + pc, dr + pr
                t.cpu_decode_tokens, t.cpu_prefill_tokens = dr, pr
        if self.cache is not None:
            c = self.cache.totals()
            t.cache_lookups, t.cache_hits = c["lookups"], c["hits"]
            t.cache_refills, t.cache_refill_bytes = c["refills"], c["refill_bytes"]
        return t

    def tick(self) -> Optional[str]:
        """The line for the interval just ended, once `interval` seconds have passed since the last
        one; None before that, and for an interval without a forward step (idle servers stay quiet)."""
        now = self.clock()
        if now - self._since < self.interval:
            return None
        t = self.totals()
        d, seconds = t.minus(self._last), now - self._since
        self._last, self._since = t, now
        return format_line(self.rank, seconds, d) if d.steps else None

    def error_line(self, seconds: float) -> Optional[str]:
        """The CPU-path errors since the last call, per layer, as one line; None without any."""
        per_layer = []
        for index, hybrid in self._layers:
            path = getattr(hybrid, "cpu_path", None)
            n = path.take_errors() if path is not None else 0
            if n:
                per_layer.append((index, n))
        if not per_layer:
            return None
        self.errors_total += sum(n for _, n in per_layer)
        return format_errors(self.rank, seconds, per_layer, self.errors_total)

    def report(self) -> None:
        """Once `interval` seconds have passed since the last report: the CPU-path errors of the
        interval (log_error, whenever there were any, steps or not: a dead engine runs no step),
        then the statistics line (log; with lines on, for an interval with a step)."""
        now = self.clock()
        if now - self._since < self.interval:
            return
        err = self.error_line(now - self._since)
        if err:
            self.log_error(err)
        if self.lines:
            line = self.tick()
            if line:
                self.log(line)
        else:
            self._since = now

    def start(self) -> None:
        """A daemon thread that logs the line: `apply` cannot do it, since it does not run while CUDA
        graphs replay (decode), which would leave long decode-only stretches without a line."""
        if self._thread is None:
            self._since, self._last = self.clock(), self.totals()
            self._thread = threading.Thread(target=self._run, name="lk_moe-stats", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self._since + self.interval - self.clock())):
            try:
                self.report()
            except Exception:  # a reporting failure must not end the reports (the thread would die silently)
                logging.getLogger("vllm.lvllm").exception("lk_moe: the statistics/error report failed")
