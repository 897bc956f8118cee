"""lk_moe's counters on vLLM's /metrics: workers write snapshots, the first process's collector serves
them through vLLM's own metrics route; names follow Prometheus conventions."""
import os
import re
import subprocess
import sys

import pytest

from lvllm import metrics
from lvllm.stats import Totals

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOTALS = Totals(cpu_steps=12, cpu_tokens=340, cpu_calls=96, cpu_ns=9_000_000_000,
                cpu_decode_calls=80, cpu_decode_tokens=40, cpu_decode_ns=2_000_000_000,
                cpu_prefill_calls=16, cpu_prefill_tokens=300, cpu_prefill_ns=7_000_000_000, cpu_queue_ns=250_000_000,
                cpu_eager_steps=5, gpu_steps=2, gpu_tokens=9000, gpu_calls=96, gpu_bytes=52_000_000_000, gpu_ms=1500.0)


def test_snapshot_values_and_names(tmp_path):
    metrics.SnapshotWriter(str(tmp_path), 1, lambda: (TOTALS, 3)).write_now()
    text = metrics.render(str(tmp_path))
    v = metrics.values(text)
    assert v['lvllm_moe_calls_total{path="cpu_decode",rank="1"}'] == 80
    assert v['lvllm_moe_calls_total{path="cpu_prefill",rank="1"}'] == 16
    assert v['lvllm_moe_calls_total{path="gpu_prefill",rank="1"}'] == 96
    assert v['lvllm_moe_tokens_total{path="cpu_prefill",rank="1"}'] == 300
    assert v['lvllm_moe_tokens_total{path="gpu_prefill",rank="1"}'] == 9000
    assert v['lvllm_moe_expert_seconds_total{path="cpu_decode",rank="1"}'] == 2.0
    assert v['lvllm_moe_expert_seconds_total{path="gpu_prefill",rank="1"}'] == 1.5
    assert v['lvllm_engine_queue_wait_seconds_total{rank="1"}'] == 0.25
    assert v['lvllm_h2d_bytes_total{rank="1"}'] == 52e9 and v['lvllm_h2d_seconds_total{rank="1"}'] == 1.5
    assert v['lvllm_cpu_expert_errors_total{rank="1"}'] == 3
    assert v['lvllm_cpu_graph_steps_total{rank="1"}'] == 7  # 12 CPU-path steps, 5 of them eager
    # Conventions: a HELP and a counter TYPE per family, base units, the _total suffix on samples.
    for name in metrics.COUNTERS:
        assert f"# HELP {name}_total " in text and f"# TYPE {name}_total counter" in text
    assert all(re.match(r"lvllm_[a-z0-9_]+_total\{", k) for k in v
               if not k.endswith("_created") and k.split("{")[0] not in metrics.GAUGES)


def test_pinned_host_bytes_are_a_gauge_by_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "pinned_host_bytes", lambda: {"engine": 54 << 30, "torch": 1 << 30})
    metrics.SnapshotWriter(str(tmp_path), 0, lambda: (TOTALS, 0)).write_now()
    text = metrics.render(str(tmp_path))
    v = metrics.values(text)
    assert v['lvllm_pinned_host_bytes{kind="engine",rank="0"}'] == 54 << 30
    assert v['lvllm_pinned_host_bytes{kind="torch",rank="0"}'] == 1 << 30
    assert "# TYPE lvllm_pinned_host_bytes gauge" in text and "# HELP lvllm_pinned_host_bytes Page-locked" in text


def test_pinned_host_bytes_reads_the_engine_and_torchs_pool():
    import lk_moe  # noqa: F401  (loads the engine: its count is then read)
    pinned = metrics.pinned_host_bytes()
    assert set(pinned) == set(metrics.PINNED_KINDS)
    assert pinned["engine"] == lk_moe._C.registered_host_bytes()
    assert pinned["torch"] >= 0


def test_dead_processes_and_torn_files_are_left_out(tmp_path):
    metrics.SnapshotWriter(str(tmp_path), 0, lambda: (TOTALS, 0)).write_now()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"rank1-pid{dead.stdout.strip()}.json").write_text(
        f'{{"pid": {dead.stdout.strip()}, "rank": 1, "lvllm_h2d_bytes": 5}}')
    (tmp_path / "rank2-pid1.json.tmp").write_text('{"pid": 1, "ra')  # a write in progress
    v = metrics.values(metrics.render(str(tmp_path)))
    assert {k for k in v if "rank=" in k and 'rank="0"' not in k} == set()


def test_only_the_first_process_makes_the_directory_and_the_collector():
    env = {}
    made = metrics.setup_first_process(env)
    try:
        assert made and os.path.isdir(made) and env[metrics.DIR_VARIABLE] == made
        assert metrics.setup_first_process(env) is None  # a process it started: writes only
    finally:
        from prometheus_client import REGISTRY
        for c in list(REGISTRY._collector_to_names):
            if isinstance(c, metrics.SnapshotCollector) and c.directory == made:
                REGISTRY.unregister(c)


SERVER = r"""
import os, subprocess, sys
import lvllm.plugin as p
p.register()  # what vLLM's API server runs first: makes the directory, registers the collector
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vllm.entrypoints.serve.instrumentator.metrics import attach_router
app = FastAPI()
attach_router(app)  # vLLM's own /metrics route
client = TestClient(app)
worker = subprocess.Popen([sys.executable, "-c", '''
import sys
from lvllm import metrics
from lvllm.stats import Totals
metrics.SnapshotWriter(sys.argv[1], 0, lambda: (Totals(cpu_decode_calls=7, cpu_decode_tokens=5), 0)).write_now()
print("written", flush=True)
sys.stdin.readline()
''', os.environ["LVLLM_METRICS_DIR"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "written"
page = client.get("/metrics").text
print([ln for ln in page.splitlines() if ln.startswith("lvllm_moe_calls_total")])
assert 'lvllm_moe_calls_total{path="cpu_decode",rank="0"} 7.0' in page
assert 'lvllm_moe_tokens_total{path="cpu_decode",rank="0"} 5.0' in page
assert "vllm:" in page or "python_gc" in page  # vLLM's own registry, not a second one
worker.communicate("\n")
assert "lvllm_moe_calls_total{" not in client.get("/metrics").text  # gone with the worker
print("scrape ok")
"""


def test_a_worker_process_shows_on_vllms_metrics_route():
    pytest.importorskip("vllm")
    pytest.importorskip("httpx")  # fastapi's TestClient
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env.update(LVLLM_MOE_NUMA_ENABLED="1", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", SERVER], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "scrape ok" in r.stdout, (r.stdout[-2000:], r.stderr[-3000:])


def test_the_writer_thread_keeps_the_snapshot_current(tmp_path):
    import time
    totals = [Totals(cpu_decode_calls=1)]
    w = metrics.SnapshotWriter(str(tmp_path), 0, lambda: (totals[0], 0), period=0.05)
    w.start()
    try:
        deadline = time.time() + 10
        while time.time() < deadline and metrics.values(metrics.render(str(tmp_path))).get(
                'lvllm_moe_calls_total{path="cpu_decode",rank="0"}') != 1:
            time.sleep(0.05)
        totals[0] = Totals(cpu_decode_calls=7)  # the worker ran on
        while time.time() < deadline and metrics.values(metrics.render(str(tmp_path))).get(
                'lvllm_moe_calls_total{path="cpu_decode",rank="0"}') != 7:
            time.sleep(0.05)
        assert metrics.values(metrics.render(str(tmp_path)))['lvllm_moe_calls_total{path="cpu_decode",rank="0"}'] == 7
    finally:
        w.stop()  # before pytest removes tmp_path
    assert not w._thread.is_alive()
