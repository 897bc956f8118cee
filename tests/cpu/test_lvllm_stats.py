"""Runtime statistics: totals from the engine counters and the GPU-path counts, one line per
interval (injected clock), nothing for idle intervals; the engine's counter object."""
from types import SimpleNamespace

from lvllm.stats import Totals, WorkerStats, format_line

from .conftest import lvllm_log_records


class FakeLayer:
    """A hybrid layer as the stats see it: engine totals of its CPU path, a streamer."""

    def __init__(self):
        self.engine = [0, 0, 0]  # calls, tokens, ns
        self.cpu_path = SimpleNamespace(engine_totals=lambda: tuple(self.engine))
        self.streamer = None

    def run(self, tokens, ns):
        self.engine[0] += 1
        self.engine[1] += tokens
        self.engine[2] += ns


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
        "CPU path 1200 steps, 1300 tokens, 57600 layer calls, 11.2 ms/step engine; "
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
    t = s.totals()
    assert (t.cpu_steps, t.cpu_tokens, t.cpu_calls, t.cpu_ns) == (2, 9, 4, 10_000_000)


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
                           "10.0 ms/step engine; GPU path 0 steps"), line
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

    assert _C.HostCallCounters().read() == (0, 0, 0)
