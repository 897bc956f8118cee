"""LK_* settings: parsed once, a bad value names its variable."""
import os
import subprocess
import sys

import pytest

import lk_moe
from lk_moe.config import ConfigError, from_env


def test_defaults():
    cfg = from_env({}, logical_cpus=8)
    assert cfg.threads == 0 and cfg.binding == "CPU_CORE" and cfg.isa is None and cfg.spin_us == 1000
    assert cfg.cpu_signal == "auto"


def test_values():
    cfg = from_env({"LK_THREADS": "6", "LK_THREAD_BINDING": "numa_node", "LK_ISA": "AVX2", "LK_SPIN_US": "0"},
                   logical_cpus=8)
    assert (cfg.threads, cfg.binding, cfg.isa, cfg.spin_us) == (6, "NUMA_NODE", "avx2", 0)
    assert from_env({"LK_CPU_SIGNAL": "Mailbox"}, logical_cpus=8).cpu_signal == "mailbox"
    assert from_env({"LK_CPU_SIGNAL": " KERNEL "}, logical_cpus=8).cpu_signal == "kernel"


def test_every_signal_is_one_the_cpu_path_takes():
    from lk_moe.config import SIGNALS
    from lk_moe.cpu_path import CpuExpertPath
    assert SIGNALS == CpuExpertPath.SIGNALS and SIGNALS[0] == "auto"  # auto is the default


@pytest.mark.parametrize(
    "env,words",
    [
        ({"LK_THREADS": "many"}, "LK_THREADS='many' is not an integer"),
        ({"LK_THREADS": "0"}, "LK_THREADS=0 is out of range"),
        ({"LK_THREADS": "40"}, "LK_THREADS=40 exceeds the 8 logical CPUs"),
        ({"LK_THREAD_BINDING": "socket"}, "LK_THREAD_BINDING='socket' is not one of CPU_CORE, NUMA_NODE, NONE"),
        ({"LK_ISA": "avx9"}, "LK_ISA='avx9' is not one of"),
        ({"LK_SPIN_US": "-5"}, "LK_SPIN_US=-5 is out of range"),
        ({"LK_CPU_SIGNAL": "poll"}, "LK_CPU_SIGNAL='poll' is not one of auto, hostfn, mailbox, kernel"),
        ({"LK_FORCE_GPU_FALLBACK": "maybe"}, "LK_FORCE_GPU_FALLBACK='maybe' is not a boolean"),
        ({"LK_INT8_ACT": "maybe"}, "LK_INT8_ACT='maybe' is not a switch: use auto, 1/0"),
        ({"LK_WNA16_INT8_ACT": "auto"}, "LK_WNA16_INT8_ACT='auto' is not a switch: use 1/0"),
    ],
)
def test_bad_values_name_the_variable(env, words):
    with pytest.raises(ConfigError) as ei:
        from_env(env, logical_cpus=8)
    assert words in str(ei.value)


def _run(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_lk_isa_forces_a_tier():
    r = _run("import lk_moe; print(lk_moe.isa())", LK_ISA="generic")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "generic"


def test_lk_isa_missing_on_this_cpu_is_a_clear_error():
    missing = [t for t in lk_moe._C.all_isas() if t not in lk_moe.supported_isas()]
    if not missing:
        pytest.skip("this CPU has every tier")
    r = _run("import lk_moe; lk_moe.isa()", LK_ISA=missing[-1])
    assert r.returncode != 0
    assert f"LK_ISA={missing[-1]}" in r.stderr and "not supported by this CPU" in r.stderr


def test_lk_threads_applies_to_default_pool():
    r = _run("import lk_moe; print(lk_moe.default_pool().num_threads)", LK_THREADS="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_auto_signal_names_why_the_kernel_cannot_run_here():
    import torch
    from lk_moe.cpu_path import kernel_signal_unusable
    why = kernel_signal_unusable()
    assert (why is None) == torch.cuda.is_available() or "lk_moe/_lk_cuda.so" in (why or "")
    if not torch.cuda.is_available():
        assert why == "signal 'kernel' needs a CUDA device"


@pytest.mark.parametrize("env,want", [
    ({}, "auto"), ({"LK_INT8_ACT": ""}, "auto"), ({"LK_INT8_ACT": "  "}, "auto"), ({"LK_INT8_ACT": " On "}, "on"),
    ({"LK_INT8_ACT": "0"}, "off"), ({"LK_INT8_ACT": "AUTO"}, "auto"),
    # the first name (int4 only, no "auto"), read while LK_INT8_ACT is unset or empty
    ({"LK_WNA16_INT8_ACT": "0"}, "off"), ({"LK_WNA16_INT8_ACT": "yes"}, "int4"), ({"LK_WNA16_INT8_ACT": ""}, "auto"),
    ({"LK_INT8_ACT": "", "LK_WNA16_INT8_ACT": "off"}, "off"), ({"LK_INT8_ACT": "1", "LK_WNA16_INT8_ACT": "0"}, "on"),
])
def test_int8_act_is_parsed_like_the_other_variables(env, want):
    assert from_env(env, logical_cpus=8).int8_act == want


def test_int8_act_is_checked_for_every_format_and_empty_is_the_default(monkeypatch):
    """Read when a layer is built: a bad value is a ConfigError whatever the format (a bf16 layer
    ignored it); empty means the default, as for every other variable (a 4-bit layer refused it)."""
    import torch

    from .conftest import make_experts
    from .test_mxfp4 import make_mxfp4

    w13, w2 = make_experts(2, 64, 32)
    monkeypatch.delenv("LK_WNA16_INT8_ACT", raising=False)
    monkeypatch.setenv("LK_INT8_ACT", "maybe")
    with pytest.raises(ConfigError, match="LK_INT8_ACT='maybe' is not a switch"):
        lk_moe.MoELayer(w13, w2)
    tensors, *_ = make_mxfp4(2, 96, 64)
    with pytest.raises(ConfigError, match="LK_INT8_ACT='maybe' is not a switch"):
        lk_moe.MoELayer.from_checkpoint("mxfp4", tensors)
    monkeypatch.delenv("LK_INT8_ACT")
    default = lk_moe.MoELayer.from_checkpoint("mxfp4", tensors)
    monkeypatch.setenv("LK_INT8_ACT", "")
    empty = lk_moe.MoELayer.from_checkpoint("mxfp4", tensors)
    x = torch.randn(2, 96).bfloat16()
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    w = torch.full((2, 2), 0.5)
    assert torch.equal(empty.forward(x, ids, w), default.forward(x, ids, w))
