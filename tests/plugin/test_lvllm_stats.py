"""Runtime statistics: totals from the engine counters and the GPU-path counts, one line per
interval (injected clock), nothing for idle intervals; the engine's counter object."""
import logging
from types import SimpleNamespace

import pytest

from lvllm.policy import LayerPlan

from lvllm.stats import Totals, WorkerStats, format_line

from .conftest import lvllm_log_records


class FakeLayer:
    """A hybrid layer as the stats see it: engine totals of its CPU path, a streamer."""

    def __init__(self):
        self.engine = {"decode": [0, 0, 0], "prefill": [0, 0, 0]}  # calls, tokens, ns
        self.queue_ns = 0
        self.errors = 0  # NaN runs not yet taken (invalid ids, kernel-signal timeouts)
        self.cpu_path = SimpleNamespace(engine_paths=self._paths, take_errors=self._take_errors)
        self.streamer = None

    def _paths(self):
        return tuple(self.engine["decode"]), tuple(self.engine["prefill"]), self.queue_ns

    def _take_errors(self):
        n, self.errors = self.errors, 0
        return n

    def run(self, tokens, ns, path="decode", queue_ns=0):
        e = self.engine[path]
        e[0] += 1
        e[1] += tokens
        e[2] += ns
        self.queue_ns += queue_ns


def _stats(clock, layers_by_index):
    s = WorkerStats(rank=1, interval=60, log=None, clock=lambda: clock[0])
    for index, layer in layers_by_index:
        s.add_layer(index, layer)
    return s


def test_format_line():
    d = Totals(cpu_steps=1200, cpu_tokens=1300, cpu_calls=57600, cpu_ns=int(1200 * 11.2e6),
               gpu_steps=34, gpu_tokens=150000, gpu_calls=1632, gpu_bytes=int(52.3e9), gpu_ms=1000.0)
    assert format_line(0, 60.0, d) == (
        "lk_moe stats (rank 0, last 60 s): 1234 steps; "
        "CPU path 1200 steps, 1300 tokens, 57600 layer calls, 11.2 ms/step engine, 1200 steps from CUDA graphs; "
        "GPU path 34 steps, 150000 tokens, 1632 layer calls, 52.3 GB at 52.3 GB/s H2D")
    only_gpu = format_line(3, 59.6, Totals(gpu_steps=2, gpu_tokens=9000, gpu_calls=4))
    assert "rank 3, last 60 s): 2 steps; CPU path 0 steps" in only_gpu and "no engine time" in only_gpu
    assert only_gpu.endswith("4 layer calls, no H2D timed")


def test_steps_and_tokens_come_from_the_first_layer_time_from_all():
    clock = [0.0]
    a, b = FakeLayer(), FakeLayer()
    s = _stats(clock, [(7, b), (3, a)])  # built out of order: layer 3 runs first
    assert s.first is a
    for tokens in (4, 5):  # two decode steps through both layers
        a.run(tokens, 2_000_000)
        b.run(tokens, 3_000_000)
    a.run(300, 9_000_000, path="prefill", queue_ns=1000)  # a prompt chunk
    b.run(300, 11_000_000, path="prefill", queue_ns=2000)
    t = s.totals()
    assert (t.cpu_steps, t.cpu_tokens, t.cpu_calls, t.cpu_ns) == (3, 309, 6, 30_000_000)
    assert (t.cpu_decode_calls, t.cpu_decode_tokens, t.cpu_decode_ns) == (4, 9, 10_000_000)
    assert (t.cpu_prefill_calls, t.cpu_prefill_tokens, t.cpu_prefill_ns) == (2, 300, 20_000_000)
    assert t.cpu_queue_ns == 3000


def test_eager_steps_are_counted_in_python_and_the_rest_replayed_from_graphs():
    """The engine counts every CPU-path call (graph replays run its host function, no Python); apply counts the
    eager ones of the first hybrid layer: the difference is the steps that stayed inside CUDA graphs."""
    clock = [0.0]
    a, b = FakeLayer(), FakeLayer()
    s = _stats(clock, [(0, a), (1, b)])
    for step in range(10):  # 2 eager steps (a prompt, the first decode), then 8 replayed from a graph
        a.run(1, 1_000_000)
        b.run(1, 1_000_000)
        if step < 2:
            s.cpu_eager(a)
            s.cpu_eager(b)  # a later layer's eager call is no step
    t = s.totals()
    assert (t.cpu_steps, t.cpu_eager_steps, t.cpu_graph_steps) == (10, 2, 8)
    clock[0] = 60.0
    assert ", 8 steps from CUDA graphs; GPU path 0 steps" in s.tick()
    for _ in range(3):  # a decode that left its graphs: every step eager
        a.run(1, 1_000_000)
        s.cpu_eager(a)
    clock[0] = 120.0
    assert "CPU path 3 steps, 3 tokens, 3 layer calls, 1.0 ms/step engine, 0 steps from CUDA graphs" in s.tick()


def test_one_line_per_interval_and_none_when_idle():
    clock = [100.0]
    a, b = FakeLayer(), FakeLayer()
    s = _stats(clock, [(0, a), (1, b)])
    a.run(1, 5_000_000)
    b.run(1, 5_000_000)
    clock[0] = 159.0
    assert s.tick() is None  # not due yet
    clock[0] = 160.0
    line = s.tick()
    assert line.startswith("lk_moe stats (rank 1, last 60 s): 1 steps; CPU path 1 steps, 1 tokens, 2 layer calls, "
                           "10.0 ms/step engine, 1 steps from CUDA graphs; GPU path 0 steps"), line
    clock[0] = 220.0
    assert s.tick() is None  # an idle minute: no line
    for _ in range(3):
        a.run(2, 1_000_000)
        b.run(2, 1_000_000)
    clock[0] = 290.0  # the line covers the 70 s since the last check, with this interval's counts only
    assert "(rank 1, last 70 s): 3 steps; CPU path 3 steps, 6 tokens, 6 layer calls, 2.0 ms/step" in s.tick()


class FakeEvent:
    """A CUDA timing event on a fake timeline: done once `now` passed the time it was recorded."""
    timeline = {"now": 0.0, "recorded": 0.0}

    def record(self):
        self.at = FakeEvent.timeline["recorded"]

    def query(self):
        return self.at <= FakeEvent.timeline["now"]

    def elapsed_time(self, end):
        return end.at - self.at


def test_gpu_path_counts_steps_at_the_first_layer_and_h2d_when_events_are_done():
    clock = [0.0]
    a, b = FakeLayer(), FakeLayer()
    a.streamer = b.streamer = SimpleNamespace(bytes_copied=0)
    s = WorkerStats(rank=0, interval=60, log=None, clock=lambda: clock[0], new_event=FakeEvent)
    s.add_layer(0, a)
    s.add_layer(1, b)
    tl = FakeEvent.timeline
    tl.update(now=0.0, recorded=0.0)
    for layer in (a, b):  # one prefill step: each layer streams 2 GB in 40 ms of GPU time
        mark = s.gpu_begin(layer, 4096)
        tl["now"] = tl["recorded"]  # the forward's sync: the earlier layers are done
        tl["recorded"] += 40.0
        layer.streamer.bytes_copied += 2_000_000_000
        s.gpu_end(mark)
    t = s.totals()
    assert (t.gpu_steps, t.gpu_tokens, t.gpu_calls) == (1, 4096, 2)
    assert (t.gpu_bytes, t.gpu_ms) == (2_000_000_000, 40.0)  # layer 1 not done yet: not counted
    tl["now"] = 1e9
    mark = s.gpu_begin(a, 100)  # the next GPU-path call reads it
    s.gpu_end(mark)
    clock[0] = 60.0
    line = s.tick()
    assert "2 steps; CPU path 0 steps" in line
    assert line.endswith("GPU path 2 steps, 4196 tokens, 3 layer calls, 4.0 GB at 50.0 GB/s H2D"), line


def test_runtime_makes_stats_unless_off_and_logs_through_vllms_logger():
    from lvllm.config import from_env
    from lvllm.runtime import WorkerRuntime

    assert WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "0"})).stats is None
    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "5"}))
    assert rt.stats.interval == 5 and rt.stats.rank == rt.local_rank
    with lvllm_log_records() as seen:
        rt.stats.log("lk_moe stats (rank 0, last 5 s): 1 steps")
    assert [m for _, m in seen] == ["lk_moe stats (rank 0, last 5 s): 1 steps"]


def test_reporting_thread_logs_and_stops():
    import threading

    a = FakeLayer()
    lines, logged = [], threading.Event()

    def log(line):
        lines.append(line)
        logged.set()

    s = WorkerStats(rank=0, interval=0.05, log=log)
    s.add_layer(0, a)
    s.start()
    a.run(3, 1_000_000)
    try:
        assert logged.wait(5.0)
    finally:
        s.stop()
    assert lines[0].startswith("lk_moe stats (rank 0, last 0 s): 1 steps; CPU path 1 steps, 3 tokens")


def test_engine_counters_start_at_zero():
    # The counting itself runs in the host function of a CUDA stream: tests/gpu/test_cpu_path.py.
    from lk_moe import _C

    c = _C.HostCallCounters()
    assert c.read() == (0, 0, 0)
    assert c.read_paths() == ((0, 0, 0), (0, 0, 0), 0) and _C.HostCallCounters.decode_slots == 16


def test_cpu_path_errors_are_logged_once_per_interval_with_counts():
    """Invalid expert ids and kernel-signal timeouts (NaN outputs) are said at ERROR level with their
    counts per layer every interval they happen in, steps or not (a dead engine runs no step)."""
    clock = [0.0]
    a, b = FakeLayer(), FakeLayer()
    infos, errors = [], []
    s = WorkerStats(rank=2, interval=60, log=infos.append, log_error=errors.append, clock=lambda: clock[0])
    s.add_layer(3, a)
    s.add_layer(7, b)
    a.errors, b.errors = 2, 1
    clock[0] = 30.0
    s.report()
    assert errors == []  # not due yet
    clock[0] = 60.0
    s.report()
    assert len(errors) == 1 and infos == []  # no step in the interval: no statistics line
    assert errors[0].startswith("lk_moe: rank 2: 3 CPU expert call(s) in the last 60 s returned NaN "
                                "(layer 3: 2, layer 7: 1)"), errors[0]
    assert "invalid expert ids" in errors[0] and "timed out" in errors[0] and "3 since start" in errors[0]
    a.run(1, 1_000_000)
    b.run(1, 1_000_000)
    clock[0] = 120.0
    s.report()  # a clean interval: its statistics line, no error line
    assert len(errors) == 1 and len(infos) == 1 and infos[0].startswith("lk_moe stats (rank 2, last 60 s)")
    b.errors = 4
    clock[0] = 180.0
    s.report()
    assert errors[1].startswith("lk_moe: rank 2: 4 CPU expert call(s) in the last 60 s returned NaN (layer 7: 4)")
    assert "7 since start" in errors[1]


def test_errors_are_reported_with_the_statistics_off():
    from lvllm.config import from_env
    from lvllm.runtime import ERROR_CHECK_INTERVAL, WorkerRuntime

    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "0"}))
    assert rt.stats is None  # no statistics (and no GPU-path timing)
    assert rt.monitor.interval == ERROR_CHECK_INTERVAL == 60 and not rt.monitor.lines
    on = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "5"}))
    assert on.monitor is on.stats and on.monitor.interval == 5
    layer = FakeLayer()
    rt.monitor.add_layer(0, layer)
    layer.errors = 5
    layer.run(1, 1000)
    t0 = rt.monitor.clock()
    rt.monitor.clock = lambda: t0 + 61.0  # a minute on
    with lvllm_log_records() as seen:
        rt.monitor.report()
    assert len(seen) == 1, seen  # the error line only: statistics are off
    level, message = seen[0]
    assert level == logging.ERROR and "5 CPU expert call(s) in the last 61 s returned NaN (layer 0: 5)" in message


def test_runtime_self_checks_each_cpu_path_when_a_layer_is_added():
    """A broken CPU path stops startup naming the layer, before the first request meets it."""
    from lvllm.config import from_env
    from lvllm.runtime import WorkerRuntime

    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1"}))
    checked = []

    def hybrid(problem=None):
        def self_check():
            checked.append(problem)
            if problem:
                raise RuntimeError(problem)
        h = SimpleNamespace(cpu_path=SimpleNamespace(self_check=self_check, kernel_unusable=None), streamer=None,
                            layer=SimpleNamespace(nbytes=0, expert_bytes=0), format="bf16", gpu_path_reason=None)
        return h

    plan = LayerPlan("model.layers.3.mlp.experts", 3, "hybrid", "bf16")
    rt.add_layer(plan, hybrid())
    assert checked == [None]
    plan = LayerPlan("model.layers.4.mlp.experts", 4, "hybrid", "bf16")
    with pytest.raises(RuntimeError, match=r"^model\.layers\.4\.mlp\.experts: engine gave NaN$"):
        rt.add_layer(plan, hybrid("engine gave NaN"))


def test_self_check_verdict_on_real_engine_outputs():
    """What CpuExpertPath.self_check decides from what came back (its GPU round trip runs in
    tests/gpu/test_cpu_path.py): the engine's own output of the same input passes; NaN, a stale or
    zero buffer, an error count fail, each saying what was seen."""
    import torch

    import lk_moe
    from lk_moe.cpu_path import self_check_problem
    from lk_moe.reference import random_routing

    from ..engine.conftest import make_experts

    w13, w2 = make_experts(4, 64, 32)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(1, 64).bfloat16()
    ids, w = random_routing(1, 4, 2)
    ref = layer.forward(x, ids, w)
    assert self_check_problem(ref.clone(), ref, errors=0) is None
    assert "1 error" in self_check_problem(ref.clone(), ref, errors=1)
    nan = torch.full_like(ref, float("nan"))
    assert "the output is not finite" in self_check_problem(nan, ref, errors=0)
    assert "weights give NaN/inf" in self_check_problem(nan, nan, errors=0)
    assert "differs from the engine's" in self_check_problem(torch.zeros_like(ref), ref, errors=0)
    other = layer.forward(torch.randn(1, 64).bfloat16(), ids, w)  # another token's result
    assert "differs from the engine's" in self_check_problem(other, ref, errors=0)
