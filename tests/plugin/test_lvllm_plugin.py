"""The vllm.general_plugins entry point, without vLLM: switch off does nothing; bad settings stop
startup with the variable named; a missing or different vLLM stops startup instead of running
stock vLLM silently."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
    e.update(env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)


def test_switch_off_imports_nothing():
    code = ("import sys; import lvllm.plugin as p; p.register(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'lk_moe', 'torch')]; "
            "print('imported:', bad); assert not bad")
    for value in ("", "0", "false", "off"):
        r = _run(code, LVLLM_MOE_NUMA_ENABLED=value) if value else _run(code)
        assert r.returncode == 0, r.stderr


def test_the_moe_capture_instrumentation_waits_for_vllm_and_checks_its_directory(tmp_path):
    """LVLLM_TEST_MOE_CAPTURE (the e2e MoE-layer oracle's runs) acts switch on or off, and imports nothing itself."""
    code = ("import sys; import lvllm.plugin as p; p.register(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'lk_moe', 'torch')]; "
            "print('imported:', bad); assert not bad and p._capturing")
    r = _run(code, LVLLM_TEST_MOE_CAPTURE=str(tmp_path))
    assert r.returncode == 0, r.stderr
    r = _run("import lvllm.plugin as p; p.register()", LVLLM_TEST_MOE_CAPTURE=str(tmp_path / "nowhere"))
    assert r.returncode != 0 and "PluginError" in r.stderr and "LVLLM_TEST_MOE_CAPTURE=" in r.stderr, r.stderr


@pytest.mark.parametrize("env,words", [
    ({"LVLLM_MOE_NUMA_ENABLED": "maybe"}, "LVLLM_MOE_NUMA_ENABLED='maybe' is not a boolean"),
    ({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFETCH_WINDOW": "3"}, "LVLLM_GPU_PREFETCH_WINDOW=3"),
    ({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "x"}, "LVLLM_GPU_RESIDENT_MOE_LAYERS"),
    ({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "1m"}, "LVLLM_STATS_INTERVAL='1m'"),
])
def test_bad_settings_stop_startup_naming_the_variable(env, words):
    r = _run("import lvllm.plugin as p; p.register()", **env)
    assert r.returncode != 0 and "PluginError" in r.stderr and words in r.stderr, r.stderr


def test_switch_on_without_vllm_stops_startup():
    code = ("import sys; sys.modules['vllm'] = None\n"  # this process cannot import vLLM
            "import lvllm.plugin as p; p.register()")
    r = _run(code, LVLLM_MOE_NUMA_ENABLED="1")
    assert r.returncode != 0 and "PluginError" in r.stderr and "vLLM cannot be imported" in r.stderr, r.stderr


@pytest.mark.parametrize("other", ["0.26.0", "0.33.1"])  # the previous pin, a newer patch release
def test_switch_on_with_another_vllm_version_stops_startup(other):
    """The version the plugin reads is faked (vLLM stays installed): the refusal names both versions."""
    pytest.importorskip("vllm")
    code = (f"import vllm; vllm.__version__ = '{other}'\n"
            "import lvllm.plugin as p; p.register()")
    r = _run(code, LVLLM_MOE_NUMA_ENABLED="1")
    assert r.returncode != 0 and "PluginError" in r.stderr, r.stderr
    from lvllm import pins
    assert (f"lvllm supports vLLM {pins.VLLM} only; this is vLLM {other}. Install vllm=={pins.VLLM} or set "
            "LVLLM_MOE_NUMA_ENABLED=0") in r.stderr, r.stderr


def test_switch_on_hooks_go_in_when_vllm_imports_their_modules():
    """register() imports none of vLLM's model code (the API server and LLM() front end stay as
    with the switch off) and starts no engine thread (it loads lk_moe to check the LK_* settings);
    the hooks go in the moment vLLM imports RoutedExperts / the loader."""
    pytest.importorskip("vllm")
    code = (
        "import sys, vllm\n"
        "from lvllm import pins\n"
        "if vllm.__version__ != pins.VLLM: print('other vllm'); raise SystemExit(0)\n"
        "import lvllm.plugin as p; p.register()\n"
        "heavy = [m for m in sys.modules if m.startswith(('vllm.model_executor', 'lk_moe.hybrid', 'lk_moe.cpu_path',\n"
        "                                                 'lvllm.runtime', 'triton_kernels'))]\n"
        "assert not heavy, heavy\n"
        "import lk_moe.engine, threading\n"
        "assert lk_moe.engine._pool is None and threading.active_count() == 1, threading.enumerate()\n"
        "from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts\n"
        "assert hasattr(RoutedExperts._get_quant_method, '__wrapped__'), 'H1 not installed'\n"
        "print('hooks ok')\n")
    r = _run(code, LVLLM_MOE_NUMA_ENABLED="1")
    if "other vllm" in r.stdout:
        pytest.skip("not the pinned vLLM")
    assert r.returncode == 0 and "hooks ok" in r.stdout, r.stderr[-3000:]


def test_a_changed_vllm_function_is_named():
    from lvllm.plugin import PluginError, _check
    with pytest.raises(PluginError, match=r"vLLM 9\.9: RoutedExperts._get_quant_method\('self',\) differs"):
        _check("vLLM 9.9", {"RoutedExperts._get_quant_method": (lambda self: None, ("self", "prefix"))})
    with pytest.raises(PluginError, match="vLLM 9.9 has no FusedMoEMethodBase.apply"):
        _check("vLLM 9.9", {"FusedMoEMethodBase.apply": (None, ("self",))})


def test_switch_on_refuses_megamoe_experts_that_bypass_the_hook():
    """vLLM's MegaMoE experts (DeepSeek-V4 / Kimi-K3 with --kernel-config moe_backend=deep_gemm_mega_moe) are no
    RoutedExperts: built with the switch on they stop startup naming the backend; with it off they are vLLM's."""
    pytest.importorskip("vllm")
    code = ("import lvllm.plugin as p; p.register()\n"
            "from vllm.model_executor.layers.fused_moe import deep_gemm_mega_moe as m\n"
            "m.DeepGemmMegaMoEExperts(num_experts=8)\n")
    r = _run(code, LVLLM_MOE_NUMA_ENABLED="1")
    assert r.returncode != 0 and "UnsupportedMoELayer" in r.stderr, r.stderr[-3000:]
    assert "MegaMoE backend" in r.stderr and "moe_backend=deep_gemm_mega_moe" in r.stderr, r.stderr[-3000:]
    r = _run(code, LVLLM_MOE_NUMA_ENABLED="0")
    assert "UnsupportedMoELayer" not in r.stderr, r.stderr[-3000:]  # vLLM's own __init__ (its own errors, if any)


def test_switch_on_refuses_deepseek_v41_specialized_decode():
    """DeepSeek-V4.1's decode_backend=latency_specialized computes the experts from their GPU tensors (past the
    hook): refused with the switch on, before vLLM's own checks; decode_backend auto is vLLM's as before."""
    pytest.importorskip("vllm")
    code = ("import types, lvllm.plugin as p; p.register()\n"
            "from vllm.models.deepseek_v41.nvidia import model\n"  # the model file binds the checked function
            "cfg = types.SimpleNamespace(additional_config={'decode_backend': '%s'})\n"
            "print('RESULT', model.specialized_decode_config(cfg))\n")
    r = _run(code % "latency_specialized", LVLLM_MOE_NUMA_ENABLED="1")
    assert r.returncode != 0 and "UnsupportedMoELayer" in r.stderr and "decode_backend=latency_specialized" in r.stderr, \
        r.stderr[-3000:]
    r = _run(code % "auto", LVLLM_MOE_NUMA_ENABLED="1")
    assert r.returncode == 0 and "RESULT None" in r.stdout, r.stderr[-3000:]


def test_model_tag_is_the_one_vllm_builds_drafts_under():
    """The planner's draft signal: vLLM's compilation model tag ("backbone" for the target; its proposers build
    drafts under set_model_tag("eagle_head" / "dspark_head" / ...)), read from vLLM itself."""
    code = ("from vllm.compilation.backends import set_model_tag; from lvllm.plugin import _model_tag; "
            "from lvllm.policy import DRAFT_MODEL_TAGS; assert _model_tag() == 'backbone', _model_tag(); "
            "tags = []\n"
            "for t in sorted(DRAFT_MODEL_TAGS):\n"
            "    with set_model_tag(t): tags.append(_model_tag())\n"
            "assert tags == sorted(DRAFT_MODEL_TAGS), tags; print('ok')")
    pytest.importorskip("vllm")
    r = _run(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
