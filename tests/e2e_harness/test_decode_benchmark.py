"""benchmarks/e2e_decode.py's modes and the CPU census it prints (the runs themselves need the GPU machine)."""
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cpu_census  # noqa: E402
from e2e_decode import mode_env  # noqa: E402


def test_hybrid_variants_combine_into_their_settings():
    assert mode_env("hybrid") == {} and mode_env("stock") == {} and mode_env("offload") == {}
    assert mode_env("hybrid-excl-bsync-t12") == {"LVLLM_EXCLUSIVE_ENGINE_CPUS": "1", "LVLLM_CUDA_BLOCKING_SYNC": "1",
                                                 "LK_THREADS": "12"}
    assert mode_env("hybrid-mailbox") == {"LK_CPU_SIGNAL": "mailbox"}
    assert mode_env("hybrid-v1") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


@pytest.mark.parametrize("mode", ["hybrid-fast", "hybrid-t0", "stock-excl", "turbo"])
def test_an_unknown_mode_stops_before_any_run(mode):
    with pytest.raises(SystemExit, match="unknown"):
        mode_env(mode)


def test_census_finds_the_busy_thread_and_its_share():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin, name="census-spin")
    before, t0 = cpu_census.snapshot(), time.perf_counter()
    t.start()
    time.sleep(1.0)
    after = cpu_census.snapshot()
    seconds = time.perf_counter() - t0
    stop.set()
    t.join()
    rows = cpu_census.busiest(before, after, seconds)
    assert rows == sorted(rows, key=lambda r: -r["core_share"])
    mine = [r for r in rows if r["tid"] == t.native_id]
    # the GIL splits the core with the sleeping main thread only: most of a core, never more than one
    assert mine and 0.3 <= mine[0]["core_share"] <= 1.05, rows[:4]
    line = cpu_census.summary(rows, 2)
    assert line.startswith("0 engine workers: 0.0 cores") and "of a core: none" not in line


def test_the_benchmark_refuses_a_bad_mode_before_anything_starts(tmp_path):
    import subprocess
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e_decode.py"
    r = subprocess.run([sys.executable, str(script), "--modes", "hybrid,hybrid-fast", "--log-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown variant 'fast'" in r.stderr
    assert not any(tmp_path.iterdir())  # no mode started
