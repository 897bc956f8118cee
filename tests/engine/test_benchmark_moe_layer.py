"""benchmarks/moe_layer.py runs end to end on a small layer (the device parts and the README's
results depend on its A/B options, its thread choices and its JSON), and rejects bad options."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "moe_layer.py"


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_rounds_and_schedule_ab_reach_the_report_and_the_json(tmp_path):
    out = tmp_path / "results.json"
    r = _run("--format", "nvfp4", "--shapes", "qwen3-30b-a3b", "--max-experts", "16", "--max-copies", "1",
             "--tokens", "1", "--threads", "2", "--reps", "3", "--rounds", "2", "--read-bytes", str(16 << 20),
             "--decode-schedule", "units,guided", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.split()[:1] == ["1"]]
    assert len(rows) == 2 and rows[0].split()[-4] == "units" and rows[1].split()[-4] == "guided", r.stdout
    assert all("rounds" in row for row in rows)
    results = json.loads(out.read_text())["results"]
    assert [x["decode_schedule"] for x in results] == ["units", "guided"]
    for x in results:
        assert x["rounds"] == 2 and len(x["round_ratios"]) == 2 and x["reps"] == 3
        assert all(v > 0 for v in x["round_ratios"]) and x["engine_ms"] > 0


def test_bad_rounds_or_threads_are_usage_errors():
    r = _run("--rounds", "0", timeout=120)
    assert r.returncode == 2 and "--rounds must be >= 1" in r.stderr
    r = _run("--threads", "all,many", timeout=120)
    assert r.returncode == 2 and "'many' is not a positive number, 'all' or 'serve'" in r.stderr


def test_serve_threads_are_the_plugins_default():
    from lvllm.threads import plan_threads
    r = _run("--format", "bf16", "--shapes", "qwen3-30b-a3b", "--max-experts", "8", "--max-copies", "1",
             "--tokens", "1", "--threads", "serve", "--reps", "2", "--read-bytes", str(16 << 20))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"threads={plan_threads(0, 1, None).threads} (serve default)" in r.stdout
