"""End to end through the real vLLM 0.26.0: tiny checkpoints of real architectures, switch on vs off.

Each vLLM run is its own process (tests/e2e/generate.py), CUDA graphs on (vLLM's default
FULL_AND_PIECEWISE), prefix caching, chunked prefill (512-token budget), 4 requests in flight.

Tolerance: TOL = 0.15 nats on logprobs. The switch-off run computes the experts with vLLM's Triton
fused-MoE kernel (bf16 intermediates), the switch-on run with the CPU engine (fp32 accumulation,
bf16 SwiGLU output) or our GPU path; each MoE output differs by bf16 rounding (2^-8 relative),
which four residual layers and logits of std ~3 turn into logprob differences of a few 0.01 (the
measured maximum is printed). A layer computed wrongly (wrong expert, weight, scale, or a lost
row) moves logprobs by O(1).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .compare import Comparison, compare_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 0.15
MIN_COVERAGE = 0.5


def _have_gpu_and_vllm() -> str:
    try:
        import torch
        if not torch.cuda.is_available():
            return "no NVIDIA GPU"
    except ImportError:
        return "no torch"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed"
    return ""


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_have_gpu_and_vllm()), reason=_have_gpu_and_vllm() or "ok")]

# First MoE layer of each tiny checkpoint (DeepSeek/GLM start with one dense layer).
ARCHS = {"qwen3_moe": 0, "deepseek_v3": 1, "glm4_moe": 1, "mixtral": 0}
STOCK = {"VLLM_PLUGINS": "lora_filesystem_resolver,lora_hf_hub_resolver"}  # every plugin but ours
OFF = {"LVLLM_MOE_NUMA_ENABLED": "0"}
CPU = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "0"}


def _gpu_env(arch):
    return {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "128",
            "LVLLM_GPU_RESIDENT_MOE_LAYERS": str(ARCHS[arch])}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


_cache = {}


def _checkpoint(workdir, arch):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from make_tiny_checkpoint import make_checkpoint
    path = str(workdir / arch)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        make_checkpoint(arch, path)
    return path


def run(workdir, arch, name, env_extra, tp=1):
    key = (arch, name, tp)
    if key in _cache:
        return _cache[key]
    model = _checkpoint(workdir, arch)
    out = str(workdir / f"{arch}-{name}-tp{tp}.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
    env.update(env_extra)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    log = str(workdir / f"{arch}-{name}-tp{tp}.log")
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "e2e", "generate.py"), "--model", model,
                            "--out", out, "--tp", str(tp)], env=env, stdout=f, stderr=subprocess.STDOUT,
                           timeout=900)
    if p.returncode != 0:
        with open(log) as f:
            tail = f.read()[-6000:]
        pytest.fail(f"vLLM run {arch}/{name} failed (rc {p.returncode}); log tail:\n{tail}")
    with open(out) as f:
        res = json.load(f)
    with open(log) as f:
        res["log"] = f.read()
    _cache[key] = res
    return res


def _check(ref, test, label):
    c = Comparison()
    for i, pass_ in enumerate(test["runs"]):  # both passes (the second from the prefix cache)
        compare_outputs(ref["runs"][0], pass_, TOL, f"{label} pass {i}", into=c)
    print(f"[e2e] {label}: {c.summary()}")
    assert c.ok(MIN_COVERAGE), c.summary()
    return c


def test_switch_off_is_stock_vllm(workdir):
    stock = run(workdir, "qwen3_moe", "stock", STOCK)
    off = run(workdir, "qwen3_moe", "off", OFF)
    assert "lk_moe" not in off["log"]
    for a, b in zip(stock["runs"], off["runs"]):
        for x, y in zip(a, b):
            assert x["tokens"] == y["tokens"]
            assert x["logprobs"] == y["logprobs"]
    assert stock["num_gpu_blocks"] == off["num_gpu_blocks"]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_cpu_experts_match_stock(workdir, arch):
    off = run(workdir, arch, "off", OFF)
    on = run(workdir, arch, "cpu", CPU)
    assert "lk_moe: hybrid MoE layers" in on["log"], "the plugin did not report its layers"
    _check(off, on, f"{arch} cpu-prefill")
    # The experts live in host RAM: the KV cache gets the GPU memory they would have used.
    print(f"[e2e] {arch}: KV blocks off {off['num_gpu_blocks']} on {on['num_gpu_blocks']}; GPU MiB used "
          f"off {off['gpu_memory_used_mib']} on {on['gpu_memory_used_mib']}")
    assert on["num_gpu_blocks"] > off["num_gpu_blocks"]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_prefill_and_resident_match_stock(workdir, arch):
    off = run(workdir, arch, "off", OFF)
    on = run(workdir, arch, "gpu", _gpu_env(arch))
    assert f"GPU-resident [{ARCHS[arch]}]" in on["log"]
    _check(off, on, f"{arch} gpu-prefill+resident")
