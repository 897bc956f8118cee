"""Every LVLLM_* and LK_* setting is checked in the first process that loads the plugin (the API server
of `vllm serve`), before any model work, and `lvllm doctor` says the same."""
import os
import re
import subprocess
import sys

import pytest

from lvllm.cli.doctor import settings_checks
from lvllm.settings import ENGINE_SETTINGS, PLUGIN_SETTINGS, SettingsError, check, unknown_names

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (variable, a bad value, words the error must hold): one row at least per setting.
BAD = [
    ("LVLLM_MOE_NUMA_ENABLED", "maybe", "LVLLM_MOE_NUMA_ENABLED='maybe' is not a boolean"),
    ("LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", "-1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=-1 is out of range"),
    ("LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", "1k", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE='1k' is not an integer"),
    ("LVLLM_GPU_PREFETCH_WINDOW", "2", "LVLLM_GPU_PREFETCH_WINDOW=2 is out of range (expected 0..1)"),
    ("LVLLM_GPU_RESIDENT_MOE_LAYERS", "3-1", "LVLLM_GPU_RESIDENT_MOE_LAYERS: range '3-1' must be ascending"),
    ("LVLLM_GPU_RESIDENT_MOE_LAYERS", "a,b", "LVLLM_GPU_RESIDENT_MOE_LAYERS: 'a' is not a layer index"),
    ("LVLLM_STATS_INTERVAL", "1m", "LVLLM_STATS_INTERVAL='1m' is not an integer"),
    ("LVLLM_GPU_EXPERT_CACHE", "8G", "LVLLM_GPU_EXPERT_CACHE='8G' is not a number of GiB"),
    ("LVLLM_GPU_EXPERT_CACHE", "-1", "LVLLM_GPU_EXPERT_CACHE=-1 is out of range (expected 0..4096 GiB"),
    ("LVLLM_GPU_EXPERT_CACHE", "nan", "LVLLM_GPU_EXPERT_CACHE=nan is out of range"),
    ("LVLLM_DRAFT_MOE", "resident", "LVLLM_DRAFT_MOE='resident' is not one of gpu, cpu"),
    ("LVLLM_BENCH_ROUTING_REPLAY", "trace", "LVLLM_BENCH_ROUTING_REPLAY='trace' is not a boolean"),
    ("LVLLM_AUTO_FIT", "always", "LVLLM_AUTO_FIT='always' is not a boolean"),
    ("LVLLM_EXCLUSIVE_ENGINE_CPUS", "cores", "LVLLM_EXCLUSIVE_ENGINE_CPUS='cores' is not a boolean"),
    ("LVLLM_CUDA_BLOCKING_SYNC", "sleep", "LVLLM_CUDA_BLOCKING_SYNC='sleep' is not a boolean"),
    ("LK_THREADS", "lots", "LK_THREADS='lots' is not an integer"),
    ("LK_THREADS", "0", "LK_THREADS=0 is out of range"),
    ("LK_THREADS", "4000", "LK_THREADS=4000 exceeds the"),
    ("LK_THREAD_BINDING", "SOCKET", "LK_THREAD_BINDING='SOCKET' is not one of CPU_CORE, NUMA_NODE, NONE"),
    ("LK_ISA", "sse9", "LK_ISA='sse9' is not one of generic"),
    ("LK_SPIN_US", "fast", "LK_SPIN_US='fast' is not an integer"),
    ("LK_CPU_SIGNAL", "poll", "LK_CPU_SIGNAL='poll' is not one of auto, hostfn, mailbox, kernel"),
    ("LK_FORCE_GPU_FALLBACK", "2", "LK_FORCE_GPU_FALLBACK='2' is not a boolean"),
    ("LK_INT8_ACT", "int8", "LK_INT8_ACT='int8' is not a switch"),
    ("LK_WNA16_INT8_ACT", "auto", "LK_WNA16_INT8_ACT='auto' is not a switch"),
]


def test_the_table_covers_every_setting():
    assert {name for name, _, _ in BAD} == set(PLUGIN_SETTINGS + ENGINE_SETTINGS)


def _names_read_in(path, pattern):
    with open(os.path.join(ROOT, path)) as f:
        return set(re.findall(pattern, f.read()))


def test_every_variable_the_code_reads_is_a_checked_setting():
    """The names the plugin's and the engine's parsers read, and the engine's getenv calls."""
    read = (_names_read_in("lvllm/config.py", r'"(LVLLM_[A-Z0-9_]+)"')
            | _names_read_in("lk_moe/config.py", r'"(LK_[A-Z0-9_]+)"')
            | _names_read_in("csrc/cpu/moe_layer.cpp", r'"(LK_[A-Z0-9_]+)"'))
    assert read and read <= set(PLUGIN_SETTINGS + ENGINE_SETTINGS), read - set(PLUGIN_SETTINGS + ENGINE_SETTINGS)


@pytest.mark.parametrize("name,value,words", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_is_named(name, value, words):
    with pytest.raises(SettingsError) as e:
        check({"LVLLM_MOE_NUMA_ENABLED": "1", name: value})
    assert words in str(e.value)
    [line] = settings_checks({"LVLLM_MOE_NUMA_ENABLED": "1", name: value})
    assert line.level == "FAIL" and words in line.text and "stops at startup" in line.text


def test_good_values_pass_and_doctor_lists_them():
    env = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0-3,40", "LK_THREADS": "1",
           "LK_CPU_SIGNAL": "mailbox", "LK_INT8_ACT": "auto", "LK_ISA": "generic"}
    s = check(env)
    assert s.plugin.enabled and s.plugin.resident_layers == frozenset({0, 1, 2, 3, 40})
    assert s.engine.threads == 1 and s.engine.cpu_signal == "mailbox" and s.warnings == []
    [line] = settings_checks(env)
    assert line.level == "ok" and "LK_THREADS=1" in line.text and "LK_CPU_SIGNAL=mailbox" in line.text


def test_a_tier_this_cpu_lacks_is_refused():
    import lk_moe
    from lk_moe.config import ISAS
    missing = [t for t in ISAS if t not in lk_moe.supported_isas()]
    if not missing:
        pytest.skip("this CPU has every tier")
    with pytest.raises(SettingsError, match=f"LK_ISA='{missing[-1]}': this CPU does not have that tier"):
        check({"LK_ISA": missing[-1]})


def test_typos_and_unknown_names_warn_with_the_closest_setting():
    env = {"LK_THREAD": "4", "LVLLM_GPU_PREFILL_MIN_BATCH": "1024", "LK_FOO": "1",
           "LVLLM_DRY_RUN": "1", "LVLLM_DEVICE_LIMIT": "500", "LK_BUILD_TYPE": "Debug", "PATH": "/bin"}
    w = unknown_names(env)
    assert len(w) == 3, w
    assert "LK_THREAD is not an lvllm setting and is ignored (did you mean LK_THREADS?)" in w
    assert any(x.startswith("LVLLM_GPU_PREFILL_MIN_BATCH is") and "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE?" in x for x in w)
    assert any(x.startswith("LK_FOO is") and "the settings are LVLLM_MOE_NUMA_ENABLED" in x for x in w)
    lines = settings_checks(env)
    assert [ln.level for ln in lines] == ["ok", "warn", "warn", "warn"]


def _register(**env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    e.update(env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", "import lvllm.plugin as p; p.register()"], env=e,
                          capture_output=True, text=True, timeout=120)


def test_register_stops_on_a_bad_engine_setting():
    """What `vllm serve` runs first in its API server: LK_THREADS=lots stops it there, named."""
    pytest.importorskip("vllm")
    r = _register(LVLLM_MOE_NUMA_ENABLED="1", LK_THREADS="lots")
    assert r.returncode != 0 and "PluginError: lvllm: LK_THREADS='lots' is not an integer" in r.stderr, r.stderr[-2000:]


def test_register_warns_on_a_typo_and_goes_on():
    pytest.importorskip("vllm")
    r = _register(LVLLM_MOE_NUMA_ENABLED="1", LK_THREAD="4")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LK_THREAD is not an lvllm setting and is ignored (did you mean LK_THREADS?)" in r.stderr + r.stdout


def test_vllm_serve_stops_in_its_api_server(tmp_path):
    """The real CLI: `vllm serve` with a bad LK_* value exits in its first process, before any engine
    process starts or any model work, with the variable named."""
    pytest.importorskip("vllm")
    import shutil
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    vllm_cli = shutil.which("vllm", path=os.path.dirname(sys.executable)) or shutil.which("vllm")
    if vllm_cli is None:
        pytest.skip("no vllm command next to this Python")
    model = make_checkpoint("qwen3_moe", str(tmp_path / "q30b"), "big")  # config + tokenizer only
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    e.update(LVLLM_MOE_NUMA_ENABLED="1", LK_CPU_SIGNAL="polling",
             PYTHONPATH=os.path.join(ROOT, "build", "dev-metadata") + os.pathsep + ROOT)
    r = subprocess.run([vllm_cli, "serve", model, "--load-format", "dummy"], env=e, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "PluginError: lvllm: LK_CPU_SIGNAL='polling' is not one of auto, hostfn, mailbox, kernel" in out, out[-3000:]
    assert "EngineCore" not in out and "Loading" not in out, out[-3000:]
