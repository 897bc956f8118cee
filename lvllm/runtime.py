"""Per-worker state shared by the hybrid MoE layers of one model: the engine's thread pool, the
pinned I/O buffers of the CPU path, the GPU staging ring, the layer chain for prefetch, the
startup summary and the runtime statistics."""
from __future__ import annotations

import logging
import threading
from typing import List, Optional

from .config import LvllmConfig, from_env
from .progress import LoadProgress
from .stats import WorkerStats
from .threads import ThreadPlan, plan_threads

logger = logging.getLogger("vllm.lvllm")

# Seconds between the checks of the CPU path's error counters while LVLLM_STATS_INTERVAL=0 (with the
# statistics on, they are checked at every statistics interval).
ERROR_CHECK_INTERVAL = 60
# The benchmark routing replay (LVLLM_BENCH_ROUTING_REPLAY): trace steps kept on the GPU (replayed in
# a loop) and trace rows (a batch's tokens; row r of a batch follows trace row r mod this: 32 keeps the rows of a
# speculative verify step of 4 requests x up to 8 tokens apart).
REPLAY_STEPS = 1024
REPLAY_ROWS = 32


def before_step() -> None:
    """Called by lvllm's execute_model hook before every model step of this process."""
    if _runtime is not None:
        _runtime.before_step()


def _ranges(indices) -> str:
    out, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "none"


def _local_rank_and_world():
    import torch
    try:
        from vllm.distributed.parallel_state import get_world_group
        g = get_world_group()
        world, local_rank = g.world_size, g.local_rank
    except (ImportError, AssertionError, AttributeError):
        world, local_rank = 1, 0
    local_world = max(1, min(world, torch.cuda.device_count() or 1))
    return local_rank % local_world, local_world


class WorkerRuntime:
    def __init__(self, cfg: LvllmConfig, fit_threads: Optional[int] = None, fit_lines: Optional[List[str]] = None):
        """fit_threads, fit_lines: LVLLM_AUTO_FIT's engine threads (LK_THREADS, when set, wins) and its plan."""
        import lk_moe
        from lk_moe import engine as lk_engine

        self.cfg = cfg
        eng = lk_engine.config()  # parses and validates LK_* (raises naming the variable)
        local_rank, local_world = _local_rank_and_world()
        self.threads: ThreadPlan = plan_threads(local_rank, local_world, eng.threads or fit_threads)
        self.local_rank, self.local_world = local_rank, local_world
        self.pool = lk_moe.make_pool(threads=self.threads.threads, binding=eng.binding, spin_us=eng.spin_us,
                                     allowed=list(self.threads.cpus))
        self.isa = lk_moe.isa()
        self.cpu_signal = eng.cpu_signal
        self._kernel_unusable = None  # auto signal: why small calls cannot take the kernel (from the layers)
        self._io = {}
        self.streamer = None
        self.hybrid_layers: List[int] = []
        self.resident_layers: List[int] = []
        self.draft_layers: List[str] = []  # MoE layers of a speculative draft model (prefixes)
        self.host_bytes = 0
        self.gpu_bytes_saved = 0
        self._last = None  # the hybrid layer built last: the next one is linked to it for prefetch
        self._summary_logged = False
        self.planned_hybrid = 0  # counted as vLLM builds the layers, before any is loaded
        self.cpu_prefill_formats: List[str] = []  # formats kept on CPU prefill despite GPU prefill (warned)
        self.gpu_paths: dict = {}  # format -> HybridMoE.gpu_path_reason of its first layer with a GPU path
        self.progress: Optional[LoadProgress] = None
        # The reporting thread: statistics lines (unless off) and the CPU path's errors (always).
        self.monitor = WorkerStats(local_rank, cfg.stats_interval or ERROR_CHECK_INTERVAL,
                                   lambda line: logger.info("%s", line), log_error=lambda line: logger.error("%s", line),
                                   lines=cfg.stats_interval > 0)
        self.stats: Optional[WorkerStats] = self.monitor if cfg.stats_interval > 0 else None  # GPU-path counting
        self.metrics = _metrics_writer(local_rank, self.monitor)
        self.hybrid_count = 0  # hybrid layers loaded so far: a layer's index in the cache and the replay
        self.expert_cache = None  # lk_moe.expert_cache.ExpertCache (LVLLM_GPU_EXPERT_CACHE > 0)
        self.replay = None  # lk_moe.expert_cache.TraceReplay (LVLLM_BENCH_ROUTING_REPLAY=1, benchmarks only)
        self.refill_gbs = None  # measured at the first forward, for the summary
        self.speculation = _speculation()  # (draft tokens k, method) of vLLM's speculative decoding, or None
        self.fit_lines: List[str] = list(fit_lines or [])  # LVLLM_AUTO_FIT's plan, one line per decision
        self._exclusive_pending = cfg.exclusive_engine_cpus  # LVLLM_EXCLUSIVE_ENGINE_CPUS: applied at the first step
        if cfg.cuda_blocking_sync:
            from .cuda_sync import use_blocking_sync
            logger.info("lk_moe: %s", use_blocking_sync())

    def note_planned(self, plan) -> None:
        if plan.draft:
            self.draft_layers.append(plan.prefix)
            if plan.kind != "hybrid":  # GPU-resident by the draft rule: not among the target's resident layers
                return
        if plan.kind == "hybrid":
            self.planned_hybrid += 1
            self._note_cpu_prefill(plan.format)
        else:
            self.add_resident(plan)

    def _note_cpu_prefill(self, fmt) -> None:
        """With GPU prefill on, a format without a GPU path keeps its prefill on the CPU engine:
        said once per model (this worker serves one) and format, never silently."""
        from .policy import GPU_PREFILL_FORMATS
        if self.cfg.gpu_prefill_min_batch <= 0 or fmt in GPU_PREFILL_FORMATS or fmt in self.cpu_prefill_formats:
            return
        self.cpu_prefill_formats.append(fmt)
        logger.warning("lk_moe: LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=%d, but %s experts have no GPU path in lk_moe "
                       "(GPU prefill streams %s experts): prefill of this model's %s MoE layers stays on the CPU "
                       "engine (correct, slower for long prompts)", self.cfg.gpu_prefill_min_batch, fmt,
                       ", ".join(GPU_PREFILL_FORMATS), fmt)

    def layer_loaded(self, nbytes: int, seconds: float) -> None:
        if self.progress is None:
            self.progress = LoadProgress(self.planned_hybrid or None, lambda line: logger.info("%s", line))
        self.progress.layer_done(nbytes, seconds)

    def io(self, max_tokens: int, hidden: int, top_k: int, dtype):
        from lk_moe.cpu_path import PinnedIO
        key = (hidden, top_k, dtype)
        io = self._io.get(key)
        if io is None or io.max_tokens < max_tokens:
            io = PinnedIO(max_tokens, hidden, top_k, dtype)
            self._io[key] = io
        return io

    def staging_for(self, expert_bytes: int, num_experts: int):
        """The GPU staging ring, made on first use and shared by all streamed layers. Slots of up to
        256 MiB; when a slot holds a whole layer, two slots (this layer + the next, prefetched)."""
        from lk_moe.hybrid import ExpertStreamer
        per_slot = max(1, min(num_experts, (256 << 20) // expert_bytes))
        slot_bytes = per_slot * expert_bytes
        if self.streamer is None or self.streamer.slot_bytes < expert_bytes:
            slots = 2 if per_slot == num_experts else 4
            self.streamer = ExpertStreamer(slot_bytes, slots=slots)
        return self.streamer

    def add_layer(self, plan, hybrid) -> None:
        cpu_path = getattr(hybrid, "cpu_path", None)  # (a CPU-only load has none)
        if cpu_path is not None:
            try:
                cpu_path.self_check()  # one token through the host-call channel, before serving
            except RuntimeError as e:
                raise RuntimeError(f"{plan.prefix}: {e}") from e
        if self._last is not None and self.cfg.prefetch_window > 0 and hybrid.streamer is not None:
            self._last.link_next(hybrid)
        self._last = hybrid
        # A draft model's layers (listed apart) may reuse the target's numbers (mtp.layers.0).
        index = None if plan.draft else plan.layer_index
        if index is not None:
            self.hybrid_layers.append(index)
        self.monitor.add_layer(index, hybrid)
        self.host_bytes += hybrid.layer.nbytes
        self.gpu_bytes_saved += hybrid.layer.expert_bytes
        reason = getattr(hybrid, "gpu_path_reason", None)
        if reason is not None:  # one per format: every layer of a format takes the same path on one GPU
            self.gpu_paths.setdefault(hybrid.format, reason)
        self._kernel_unusable = getattr(cpu_path, "kernel_unusable", None)

    def attach_cache(self, hybrid, max_tokens: int):
        """(the layer's index among the hybrid layers, its lk_moe LayerCache or None). Made with the
        model's first hybrid layer: the cache (its budget split over every planned hybrid layer) and,
        for benchmarks, the routing replay."""
        import torch
        index = self.hybrid_count
        self.hybrid_count += 1
        if self.cfg.bench_routing_replay and self.replay is None:
            from lk_moe.expert_cache import TraceReplay
            logger.warning("lk_moe: LVLLM_BENCH_ROUTING_REPLAY=1: benchmarks may replace the router's expert ids "
                           "with synthetic traces; outputs are meaningless while they do (never set it for serving)")
            self.replay = TraceReplay(max(1, self.planned_hybrid), REPLAY_STEPS, REPLAY_ROWS, hybrid.top_k,
                                      max_tokens, torch.device("cuda", torch.cuda.current_device()))
        if self.cfg.expert_cache_gib <= 0:  # (`auto` was planned into GiB when the runtime was made)
            return index, None
        if self.expert_cache is None:
            from lk_moe.expert_cache import ExpertCache
            self.expert_cache = ExpertCache(int(self.cfg.expert_cache_gib * (1 << 30)), max(1, self.planned_hybrid))
            self.monitor.cache = self.expert_cache
        return index, self.expert_cache.add_layer(hybrid, max_tokens)

    def before_step(self) -> None:
        """Between two model steps (lvllm's hook around the model runners' execute_model)."""
        if self._exclusive_pending:
            # At the first step of a request: the model is loaded and the graphs are captured, so the engine's
            # signal thread (started by the first decode-sized call) exists and no loading work is left.
            self._exclusive_pending = False
            from .threads import keep_others_off_workers
            logger.info("lk_moe: %s", keep_others_off_workers(self.threads.cpus))
        if self.replay is not None:
            self.replay.advance()
        if self.expert_cache is not None:
            self.expert_cache.before_step()

    def signal_text(self) -> str:
        if self.cpu_signal != "auto":
            return f"{self.cpu_signal} signal"
        if self._kernel_unusable:
            return f"hostfn signal (auto: {self._kernel_unusable})"
        return "auto signal (kernel for decode-sized calls, hostfn for bigger ones)"

    def add_resident(self, plan) -> None:
        if plan.layer_index is not None:
            self.resident_layers.append(plan.layer_index)

    def summary(self) -> str:
        from .hugepages import huge_page_text
        pinned = sum(io.nbytes for io in self._io.values())
        staging = self.streamer.nbytes if self.streamer is not None else 0
        gib = 1 << 30
        return (f"lk_moe: hybrid MoE layers [{_ranges(self.hybrid_layers)}], GPU-resident [{_ranges(self.resident_layers)}]; "
                f"rank {self.local_rank}/{self.local_world}: {self.threads.threads} engine threads on CPUs "
                f"{self.threads.cpus[0]}-{self.threads.cpus[-1]} ({self.threads.physical_cores} cores), ISA {self.isa}, {self.signal_text()}; "
                f"experts in host RAM {self.host_bytes / gib:.2f} GiB ({huge_page_text(self.host_bytes)}), "
                f"GPU memory saved {self.gpu_bytes_saved / gib:.2f} GiB; "
                f"pinned I/O {pinned / (1 << 20):.1f} MiB, GPU staging {staging / (1 << 20):.1f} MiB; "
                + (f"GPU prefill from {self.cfg.gpu_prefill_min_batch} tokens" if self.cfg.gpu_prefill_min_batch
                   else "prefill on the CPU")
                + (f" (CPU prefill for {', '.join(self.cpu_prefill_formats)} layers: no GPU path)"
                   if self.cfg.gpu_prefill_min_batch and self.cpu_prefill_formats else "")
                + "".join(f"; GPU path of {r}" for r in self.gpu_paths.values())
                + (f"; speculative draft MoE layers {', '.join(self.draft_layers)}: "
                   + ("on the GPU (LVLLM_DRAFT_MOE=gpu)" if self.cfg.draft_moe == "gpu" else "hybrid (LVLLM_DRAFT_MOE=cpu)")
                   if self.draft_layers else "")
                + (f"; {self.expert_cache.describe()}" if self.expert_cache is not None else "")
                + (f", refills at {self.refill_gbs:.1f} GB/s" if self.refill_gbs else ""))

    def log_summary_once(self) -> None:
        """At the first forward: the summary, and the reporting thread (statistics, errors) starts."""
        if not self._summary_logged:
            self._summary_logged = True
            if self.expert_cache is not None and self.expert_cache.layers:
                from lk_moe.expert_cache import measure_refill
                self.refill_gbs = measure_refill(self.expert_cache)
            logger.info("%s", self.summary())
            self._log_speculation()
            self.monitor.start()
            if self.metrics is not None:
                self.metrics.start()

    def _log_speculation(self) -> None:
        """With speculative decoding on: what a verify step costs the CPU experts here, and whether
        the configured number of draft tokens can pay (lvllm.speculation)."""
        if self.speculation is None or self.monitor.first is None:
            return
        from . import speculation
        k, method = self.speculation
        hybrid = self.monitor.first
        ratio = speculation.measure_cost_ratio(speculation.engine_step_time(hybrid.layer, hybrid.top_k), k)
        union = speculation.expected_distinct_experts(hybrid.layer.num_experts, hybrid.top_k, k + 1) / hybrid.top_k
        level, text = speculation.advice(ratio, k, method, union)
        (logger.warning if level == "warning" else logger.info)("%s", text)


def _speculation():
    """(k, method) of the speculative decoding vLLM was started with in this worker, or None."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:  # engine-only use
        return None
    cfg = get_current_vllm_config_or_none()
    spec = getattr(cfg, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None) if spec is not None else None
    return (int(k), str(getattr(spec, "method", "") or "")) if k else None


def _metrics_writer(rank: int, monitor: WorkerStats):
    """The snapshots behind /metrics (lvllm.metrics), where the first process made their directory."""
    import os
    from .metrics import DIR_VARIABLE, SnapshotWriter
    directory = os.environ.get(DIR_VARIABLE)
    if not directory:
        return None
    return SnapshotWriter(directory, rank, lambda: (monitor.totals(), monitor.errors_total))


_lock = threading.Lock()
_runtime: Optional[WorkerRuntime] = None


def switch_line(cfg: LvllmConfig) -> str:
    """Said once per worker, when its first MoE layer is built: the switch is on, and the settings that decide where
    the experts run (also when every MoE layer stays on the GPU, where no hybrid layer ever logs)."""
    import os

    from . import __version__
    prefill = (f"GPU prefill from {cfg.gpu_prefill_min_batch} tokens" if cfg.gpu_prefill_min_batch
               else "prefill on the CPU")
    return (f"lvllm {__version__}: lk_moe hybrid MoE enabled (pid {os.getpid()}): {prefill}, prefetch window "
            f"{cfg.prefetch_window}, GPU-resident MoE layers [{_ranges(cfg.resident_layers)}]")


def get_runtime(cfg: Optional[LvllmConfig] = None) -> WorkerRuntime:
    global _runtime
    with _lock:
        if _runtime is None:
            cfg = cfg if cfg is not None else from_env()
            threads, lines = None, []
            # at the first MoE layer's construction: a model that cannot fit stops before loading
            if cfg.auto_fit or cfg.expert_cache_auto:
                import os

                from .autofit_inputs import plan_at_startup
                cfg, threads, lines = plan_at_startup(cfg, os.environ, cache_only=not cfg.auto_fit)
            _runtime = WorkerRuntime(cfg, fit_threads=threads, fit_lines=lines)
            logger.info("%s", switch_line(_runtime.cfg))
            for line in lines:
                logger.info("lk_moe: %s: %s", "LVLLM_AUTO_FIT" if cfg.auto_fit else "LVLLM_GPU_EXPERT_CACHE=auto", line)
        return _runtime
