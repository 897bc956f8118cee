"""End to end through the real vLLM 0.33.0: tiny checkpoints of real architectures, switch on vs off.

Each vLLM run is its own process (tests/e2e/generate.py), CUDA graphs on (vLLM's default
FULL_AND_PIECEWISE), prefix caching, chunked prefill (512-token budget), 4 requests in flight.
The comparison runs share the GPU and start together (a fixed KV-cache size each, so vLLM's
memory sizing is not confused by its neighbours); the KV-cache growth check runs its two
processes alone, with vLLM's own sizing.

Criterion and tolerances: tests/e2e/compare.py (calibrated against stock vLLM's own run-to-run
differences, which the switch-off vs stock test measures in the same session), including its
teacher-forced check: each run also scores 6 x 600-token prompts with prompt_logprobs, and the test
run may not be farther from the checkpoint's fp32 truth (HF transformers, tests/e2e/oracle.py) than
the reference run is, in greedy flips and in logprob drift. The switch-off run
computes the experts with vLLM's Triton fused-MoE kernel (bf16 intermediates), the switch-on run
with the CPU engine (fp32 accumulation, bf16 SwiGLU output) or our GPU path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .compare import DRIFT_FACTOR, DRIFT_SLACK, MAX_OUTLIERS, TOL, compare_runs, oracle_problems, yardstick_limit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
# Quantized checkpoints (expert formats of the formats issue; the experts quantized, the rest bf16),
# CPU prefill. Each also gets its bf16 twin (checkpoint_quant.write_dequantized_twin). fp8_channel /
# int8_channel: compressed-tensors W8A8 per channel (vLLM's CompressedTensorsW8A8Fp8MoEMethod /
# CompressedTensorsW8A8Int8MoEMethod); GLM-4.5 for int8 adds shared experts and a dense layer.
QUANTIZED = [("qwen3_moe", "fp8"), ("deepseek_v3", "fp8"), ("deepseek_v3", "w4a16"), ("qwen3_moe", "nvfp4"),
             ("qwen3_moe", "fp8_channel"), ("glm4_moe", "int8_channel")]
# Quantized checkpoints whose experts also stream to the GPU for prefill: the dequant fallback (FP8 /
# INT8 codes + scales, int4 and NVFP4 4-bit blocks + scales, dequantized to bf16 on the GPU) and, where
# the GPU has one, vLLM's native kernel (fp8_channel's native path is the fp8 W8A8 kernel of fp8
# block with other scales: covered by tests/gpu/test_native.py, left out here to keep the suite to two
# rounds of runs).
QUANTIZED_GPU = [("qwen3_moe", "fp8"), ("deepseek_v3", "w4a16"), ("qwen3_moe", "nvfp4"), ("glm4_moe", "int8_channel")]
GPU_PREFILL = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "128"}
FORCED_FALLBACK = {**GPU_PREFILL, "LK_FORCE_GPU_FALLBACK": "1"}
# tiny-checkpoint quant -> engine format; the native GPU path (vLLM's fused-MoE kernels) of the fp8
# formats quantizes the activations to fp8 (W8A8), as vLLM's own methods do.
ENGINE_FORMAT = {"fp8": "fp8_block", "w4a16": "wna16_int4", "nvfp4": "nvfp4",
                 "fp8_channel": "fp8_channel", "int8_channel": "int8_channel"}
W8A8_NATIVE = ("fp8_block", "fp8_channel")
# Architectures whose checkpoints ship quantized experts (gpt-oss: MXFP4, biases, swigluoai).
NATIVE = ["gpt_oss"]
# vLLM runs at a time (each is two processes of a few GB of host RAM and ~5 GB of GPU memory)
PARALLEL = int(os.environ.get("LVLLM_E2E_PARALLEL", "10"))
STOCK = {"VLLM_PLUGINS": "lora_filesystem_resolver,lora_hf_hub_resolver"}  # every plugin but ours
OFF = {"LVLLM_MOE_NUMA_ENABLED": "0"}
CPU = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "0"}
# The GPU expert cache: 0.018 GiB over the tiny Qwen3-MoE's 4 layers = 6 of 16 bf16 experts per layer
# (786 KiB each; fp8_block: 12 in their native slots; gpt-oss's MXFP4 experts: 6 in bf16 slots with their
# biases, swigluoai); stats every 5 s report its hit rate. "bf16": the checkpoint as made (gpt-oss: MXFP4).
CACHE = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "128", "LVLLM_GPU_EXPERT_CACHE": "0.018",
         "LVLLM_STATS_INTERVAL": "5"}
CACHED = [("qwen3_moe", "bf16", 6), ("qwen3_moe", "fp8", 12), ("gpt_oss", "bf16", 6)]


def fallback_text(fmt: str) -> str:
    """What the plugin's startup summary says of a format whose fallback was forced (lvllm/runtime.py:
    "GPU path of " + gpu_path's reason); tests/e2e_harness/test_compare.py checks it against the real text."""
    return f"GPU path of {fmt}: LK_FORCE_GPU_FALLBACK=1"


def native_text(fmt: str) -> str:
    return f"GPU path of {fmt}: native on sm_"


def _native_here(quant) -> bool:
    """Whether the format's GPU path on this GPU is vLLM's kernel (lk_moe.gpu_dequant.gpu_path)."""
    from lk_moe.gpu_dequant import gpu_path
    return gpu_path(ENGINE_FORMAT[quant], force_fallback=False)[0] == "native"


def gpu_env(resident_layer: int) -> dict:
    """GPU prefill from 128 tokens, and one MoE layer kept on the GPU with vLLM's kernels."""
    return {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "128",
            "LVLLM_GPU_RESIDENT_MOE_LAYERS": str(resident_layer)}


# MTP layers a checkpoint gets for the draft runs where it is not one: DeepSeek-V4.1's DSpark stages (vLLM's default 3)
MTP_LAYERS = {"deepseek_v41": 3}


def _checkpoint(workdir, arch, quant="bf16"):
    """quant: bf16, a format (routed experts quantized, the rest bf16), "<format>-twin": the bf16 twin
    of that checkpoint (its experts decoded), the reference for the format, or "mtp": bf16 with its MTP layer(s)
    (MTP_LAYERS)."""
    from lvllm.testing.checkpoint_quant import write_dequantized_twin
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    path = str(workdir / (arch if quant == "bf16" else f"{arch}-{quant}"))
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        if quant.endswith("-twin"):
            write_dequantized_twin(_checkpoint(workdir, arch, quant[:-len("-twin")]), path)
        elif quant == "mtp":  # bf16 with an MTP layer as released (speculative decoding's draft)
            make_checkpoint(arch, path, mtp=MTP_LAYERS.get(arch, 1))
        else:
            make_checkpoint(arch, path, quant=quant, experts_only=True)
    return path


CAPTURE = "-moe"  # a run named so records its MoE layers for tests/e2e/moe_oracle.py instead of generating


def _launch(workdir, arch, name, env_extra, args=(), quant="bf16"):
    """Start one vLLM run; returns (tag, process)."""
    model = _checkpoint(workdir, arch, quant)
    tag = f"{arch}-{name}" if quant == "bf16" else f"{arch}-{quant}-{name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
    # Concurrent runs: own compile caches (no races), engine threads unpinned and few.
    # PYTHONFAULTHANDLER: a run that dies of a signal (also at exit) leaves every thread's Python
    # stack in its log, naming the process and the frame.
    env.update(VLLM_USE_FLASHINFER_SAMPLER="0", VLLM_CACHE_ROOT=str(workdir / f"cache-{tag}"), PYTHONFAULTHANDLER="1",
               LK_THREADS=env.get("LK_THREADS", "2"), LK_THREAD_BINDING="NONE", LK_SPIN_US="50")
    env.update(env_extra)
    log = open(workdir / f"{tag}.log", "w")
    from lvllm.testing.tiny_checkpoint import LANGUAGE_MODEL_ONLY
    if arch in LANGUAGE_MODEL_ONLY:  # a release written without its vision tower
        args = [*args, "--language-model-only"]
    if name.endswith(CAPTURE):  # the MoE-layer oracle's recording run (tests/e2e/moe_capture.py): no generation
        cmd = [sys.executable, os.path.join(ROOT, "tests", "e2e", "moe_capture.py"), "--model", model,
               "--out", str(workdir / f"{tag}.pt"), *args]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "tests", "e2e", "generate.py"), "--model", model,
               "--out", str(workdir / f"{tag}.json"), *args]
    return tag, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _result(workdir, tag, rc):
    log = (workdir / f"{tag}.log").read_text()
    if rc != 0:
        return {"error": f"vLLM run {tag} failed (rc {rc}); log tail:\n{log[-6000:]}"}
    if tag.endswith(CAPTURE):
        return {"capture": str(workdir / f"{tag}.pt"), "log": log}
    with open(workdir / f"{tag}.json") as f:
        res = json.load(f)
    res["log"] = log
    return res


def _collect(workdir, procs, timeout=900):
    results = {}
    for tag, p in procs:
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        results[tag] = _result(workdir, tag, rc)
    return results


# LVLLM_E2E_ONLY=gpt_oss,qwen3_moe-fp8: start only the runs of these checkpoints (arch, or arch-quant,
# twins included); the tests of the others skip. For re-running one case on the GPU machine.
ONLY = [s for s in os.environ.get("LVLLM_E2E_ONLY", "").split(",") if s]


def _selected(spec) -> bool:
    arch, quant = spec[0], (spec[4] if len(spec) > 4 else "bf16")
    key = arch if quant == "bf16" else f"{arch}-{quant}"
    return not ONLY or any(key == p or key.startswith(p + "-") for p in ONLY)


def _run_all(workdir, specs, parallel=PARALLEL, timeout=900):
    """specs: _launch argument tuples; at most `parallel` runs at a time."""
    results, running, pending = {}, [], [s for s in specs if _selected(s)]
    deadline = time.time() + timeout
    while pending or running:
        while pending and len(running) < parallel:
            running.append(_launch(workdir, *pending.pop(0)))
        time.sleep(1)
        for tag, p in list(running):
            rc = p.poll()
            if rc is None and time.time() > deadline:
                p.kill()
                rc = "timeout"
            if rc is not None:
                running.remove((tag, p))
                results[tag] = _result(workdir, tag, rc)
    return results


KV = ["--kv-bytes", str(2 << 30)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The bf16 comparison runs (stock, switch off, CPU prefill, GPU prefill + resident), started
    together; {tag: result}."""
    specs = [("qwen3_moe", "stock", STOCK, KV)]
    for arch in ARCHS:
        specs += [(arch, "off", OFF, KV), (arch, "cpu", CPU, KV), (arch, "gpu", gpu_env(ARCHS[arch]), KV)]
    return _run_all(tmp_path_factory.mktemp("e2e"), specs)


@pytest.fixture(scope="module")
def quantized_runs(tmp_path_factory):
    """Quantized checkpoints (FP8 block, W4A16 int4, NVFP4, FP8 / INT8 per channel, gpt-oss MXFP4),
    switch off and on: a fixture of its own so `-k quantized or gpt_oss` starts only these."""
    specs = []
    for arch, quant in QUANTIZED:
        specs += [(arch, "off", OFF, KV, quant), (arch, "cpu", CPU, KV, quant), (arch, "stock", OFF, KV, f"{quant}-twin")]
    for arch, quant in QUANTIZED_GPU:
        specs += [(arch, "gpu", FORCED_FALLBACK, KV, quant)]
        if _native_here(quant):
            specs += [(arch, "gpu-native", GPU_PREFILL, KV, quant)]
    for arch in NATIVE:
        specs += [(arch, "off", OFF, KV), (arch, "cpu", CPU, KV)]
    return _run_all(tmp_path_factory.mktemp("e2e-quant"), specs)


@pytest.fixture(scope="module")
def cache_runs(tmp_path_factory):
    """Switch off and switch on with the GPU expert cache: bf16, FP8-block and gpt-oss MXFP4 experts."""
    specs = []
    for arch, quant, _ in CACHED:
        specs += [(arch, "off", OFF, KV, quant), (arch, "cache", CACHE, KV, quant)]
        if quant != "bf16":  # the fp32 truth of a quantized file is its bf16 twin's (tests/e2e/oracle.py)
            specs += [(arch, "stock", OFF, KV, f"{quant}-twin")]
    return _run_all(tmp_path_factory.mktemp("e2e-cache"), specs)


def _get(runs, tag):
    if tag not in runs and ONLY:
        pytest.skip(f"{tag} not run (LVLLM_E2E_ONLY={','.join(ONLY)})")
    r = runs[tag]
    if "error" in r:
        pytest.fail(r["error"])
    return r


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


_FP32 = {}  # (checkpoint, scored prompts) -> fp32 truth, shared by the comparisons of one checkpoint


def _fp32_truth(model_dir, result):
    """The teacher-forced fp32 truth (tests/e2e/oracle.py) for the scored prompts of a run."""
    from .compare import scored_prompts
    from .oracle import teacher_forced_logprobs
    prompts = scored_prompts(result)
    if not prompts:
        pytest.fail(f"run of {model_dir} scored no prompts: the teacher-forced check has no data")
    key = (model_dir, json.dumps(prompts))
    if key not in _FP32:
        _FP32[key] = teacher_forced_logprobs(model_dir, prompts, device=_device())
    return _FP32[key]


def _spike_notes(ref, c):
    """Per-flip fp32 oracle notes on the spike flips (tests/e2e/oracle.py), on request
    (LVLLM_E2E_SPIKE_NOTES=1): data for a human, the verdict is the teacher-forced count. A failure of
    the notes themselves is reported, not raised."""
    if not c.spike_cases or os.environ.get("LVLLM_E2E_SPIKE_NOTES", "0") != "1":
        return []
    try:
        from .oracle import diagnose_spikes
        return diagnose_spikes(ref, c, device=_device())
    except Exception as e:  # noqa: BLE001 - diagnostics must not mask the comparison's verdict
        return [f"oracle unavailable: {type(e).__name__}: {e}"]


def yardstick_run(runs, tag):
    """The run `tag` if the comparisons' fixture started it (architectures without fp32 truth), else None."""
    return _get(runs, tag) if tag in runs else None


def _check(ref, test, label, yardstick=None, experts=None):
    """The criterion of compare.py, the teacher-forced check included: truth = the reference's checkpoint in fp32
    (where transformers implements its architecture: oracle.has_fp32_truth); without it, the thresholds may come
    from a yardstick run (stock, differing from the reference only numerically), and `experts` (moe_oracle.verdict of
    the two runs' recordings) holds the test's MoE layers to fp32 on their own inputs."""
    from .oracle import has_fp32_truth
    truth = has_fp32_truth(ref["model"])
    fp32 = _fp32_truth(ref["model"], ref) if truth else None
    c = compare_runs(ref, test, label, fp32=fp32, yardstick=yardstick)  # both passes (the second from the prefix cache)
    if experts is not None and fp32 is None:
        c.experts = experts
    notes = _spike_notes(ref, c) if truth else []
    print(f"[e2e] {label}: {c.summary()}" + ("" if truth else " (no fp32 truth: transformers has no such model)")
          + "".join(f"\n[e2e]   oracle: {n}" for n in notes))
    assert c.ok(), c.summary() + "".join(f"; oracle: {n}" for n in notes)
    return c


def _check_w8a8(twin, off, on, label):
    """The criterion for runs whose GPU experts take vLLM's fp8 W8A8 kernels (activations quantized to
    fp8, as vLLM's own method does with the switch off): teacher-forced, the run may be no farther from
    the bf16 twin's fp32 truth than the switch-off run (vLLM's kernels on the same file) is; its greedy
    tokens no farther from the twin than the switch-off run's are."""
    fp32 = _fp32_truth(twin["model"], twin)
    tf = compare_runs(off, on, label, fp32=fp32)  # teacher-forced: reference = vLLM's kernels (switch off)
    greedy, yardstick = compare_runs(twin, on, label), compare_runs(twin, off, "switch off")
    problems = oracle_problems(*tf.oracle)
    for what, q, ref, floor in (("p90", greedy.quantile(0.9), yardstick.quantile(0.9), TOL),
                                ("share beyond TOL", greedy.outlier_fraction(), yardstick.outlier_fraction(), MAX_OUTLIERS)):
        if q > yardstick_limit(floor, ref):
            problems.append(f"greedy vs twin {what} {q:.3f} > the switch-off run's {ref:.3f} x {DRIFT_FACTOR:g} + {DRIFT_SLACK}")
    print(f"[e2e] {label}: teacher-forced reference (switch off) {tf.oracle[0].summary()}, test {tf.oracle[1].summary()}; "
          f"greedy vs twin: {greedy.figures()}; switch off vs twin: {yardstick.figures()}"
          + (f"; FAIL: {'; '.join(problems)}" if problems else "; ok"))
    assert not problems, problems


def test_kv_cache_gets_the_experts_memory(tmp_path):
    """Alone on the GPU, vLLM sizes the KV cache: with the experts in host RAM it is larger."""
    off = _collect(tmp_path, [_launch(tmp_path, "qwen3_moe", "off", OFF)])["qwen3_moe-off"]
    on = _collect(tmp_path, [_launch(tmp_path, "qwen3_moe", "cpu", CPU)])["qwen3_moe-cpu"]
    for r in (off, on):
        if "error" in r:
            pytest.fail(r["error"])
    loaded = [next((ln for ln in r["log"].splitlines() if "Model loading took" in ln), "") for r in (off, on)]
    print(f"[e2e] KV blocks off {off['num_gpu_blocks']} on {on['num_gpu_blocks']}; nvidia-smi MiB off "
          f"{off['gpu_memory_used_mib']} on {on['gpu_memory_used_mib']}\n  off: {loaded[0][-90:]}\n  on:  {loaded[1][-90:]}")
    assert on["num_gpu_blocks"] > off["num_gpu_blocks"]


def test_switch_off_is_stock_vllm(runs):
    """Switch off, the plugin returns before importing anything (tests/plugin/test_lvllm_plugin.py);
    here: no trace of it in the run, and the outputs differ from stock vLLM (plugin not even
    loaded) only as much as two stock runs do. That difference is the noise floor the switch-on
    comparisons are held to."""
    stock, off = _get(runs, "qwen3_moe-stock"), _get(runs, "qwen3_moe-off")
    assert "lk_moe" not in off["log"] and "lvllm" not in off["log"]
    _check(stock, off, "stock vs switch-off")


def experts_verdict(runs, arch, mode):
    """The MoE-layer oracle on the `mode` run's recording against the switch-off run's (tests/e2e/moe_oracle.py; bf16
    checkpoints), if the comparisons' fixture made them (architectures without fp32 truth), else None."""
    ref_tag, test_tag = f"{arch}-off{CAPTURE}", f"{arch}-{mode}{CAPTURE}"
    if ref_tag not in runs or test_tag not in runs:
        return None
    from .moe_oracle import verdict
    return verdict(arch, "bf16", _get(runs, ref_tag)["capture"], _get(runs, test_tag)["capture"])


def check_cpu_run(runs, arch):
    """The "cpu" run of `arch` (CPU prefill) against its switch-off run."""
    off, on = _get(runs, f"{arch}-off"), _get(runs, f"{arch}-cpu")
    assert "lk_moe: hybrid MoE layers" in on["log"], "the plugin did not report its layers"
    _check(off, on, f"{arch} cpu-prefill", yardstick=yardstick_run(runs, f"{arch}-off-again"),
           experts=experts_verdict(runs, arch, "cpu"))


def check_gpu_run(runs, arch, resident_layer):
    """The "gpu" run of `arch` (GPU prefill, one resident layer) against its switch-off run."""
    off, on = _get(runs, f"{arch}-off"), _get(runs, f"{arch}-gpu")
    assert f"GPU-resident [{resident_layer}]" in on["log"]
    _check(off, on, f"{arch} gpu-prefill+resident", yardstick=yardstick_run(runs, f"{arch}-off-again"),
           experts=experts_verdict(runs, arch, "gpu"))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_cpu_experts_match_switch_off(runs, arch):
    check_cpu_run(runs, arch)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_prefill_and_resident_match_switch_off(runs, arch):
    check_gpu_run(runs, arch, ARCHS[arch])


@pytest.mark.parametrize("arch,quant,slots", CACHED)
def test_expert_cache_matches_switch_off(cache_runs, arch, quant, slots):
    """The cached experts computed on the GPU while the CPU computes the rest, inside vLLM's CUDA graphs
    (decode) and on the streamed prefill path: outputs under the suite's criterion, teacher-forced check
    included; the cache served lookups. FP8 block experts sit in their native slots and take vLLM's W8A8
    kernel (fp8 activations): the criterion of the native W8A8 prefill test. gpt-oss's MXFP4 experts
    (exact in bf16) sit in bf16 slots with their biases and take vLLM's swigluoai: the suite's criterion."""
    import re
    tag = arch if quant == "bf16" else f"{arch}-{quant}"
    off, on = _get(cache_runs, f"{tag}-off"), _get(cache_runs, f"{tag}-cache")
    assert f"GPU expert cache: {slots} of 16 experts per layer on 4 layers" in on["log"], on["log"][-3000:]
    assert "Graph capturing finished" in on["log"]  # decode stays in CUDA graphs with the cache on
    rates = [float(r) for r in re.findall(r"expert cache hit rate ([\d.]+)%", on["log"])]
    print(f"[e2e] {tag} expert cache hit rates per stats line: {rates}")
    assert rates and max(rates) > 0, "no stats line reported a cache hit"
    if quant == "bf16":
        _check(off, on, f"{tag} expert-cache")
    else:
        _check_w8a8(_get(cache_runs, f"{tag}-twin-stock"), off, on, f"{tag} expert cache (native W8A8 slots)")


@pytest.mark.parametrize("arch,quant", QUANTIZED)
def test_quantized_experts_match_switch_off(quantized_runs, arch, quant):
    """The engine reads vLLM's quantized expert tensors as loaded and computes with bf16
    activations. The reference is stock vLLM on the checkpoint's bf16 twin (the same experts,
    decoded): the same math, so the bf16 criterion applies. vLLM's own kernels on the quantized
    file (switch off) are compared too, and printed: FP8 block MoE also quantizes the activations
    to FP8 (measured on the H200: 54-97% of positions beyond the bf16 tolerance, against the
    engine's W8A16), so against them only the switch-off vs twin difference is a yardstick."""
    off, on = _get(quantized_runs, f"{arch}-{quant}-off"), _get(quantized_runs, f"{arch}-{quant}-cpu")
    twin = _get(quantized_runs, f"{arch}-{quant}-twin-stock")
    assert "lk_moe: hybrid MoE layers" in on["log"]
    for label, a, b in ((f"{arch} {quant} switch off (vLLM's {quant} kernels) vs bf16 twin", twin, off),
                        (f"{arch} {quant} switch on vs switch off", off, on)):
        print(f"[e2e] {label}: {compare_runs(a, b, label).figures()}")
    _check(twin, on, f"{arch} {quant} switch on vs bf16 twin")


@pytest.mark.parametrize("arch,quant", QUANTIZED_GPU)
def test_quantized_gpu_prefill_matches_bf16_twin(quantized_runs, arch, quant):
    """Prompts of >= 128 tokens stream the quantized experts (FP8 codes + scales, int4 / NVFP4 4-bit
    blocks + scales) to the GPU; with LK_FORCE_GPU_FALLBACK=1 they are dequantized there (each weight
    rounded to bf16 once, as the twin holds them): the bf16 criterion against the twin. (This is the
    path of GPUs without a native kernel for the format: FP8 before sm_89, FP4 before sm_100.)"""
    on = _get(quantized_runs, f"{arch}-{quant}-gpu")
    twin = _get(quantized_runs, f"{arch}-{quant}-twin-stock")
    fmt = ENGINE_FORMAT[quant]
    assert "GPU prefill from 128 tokens" in on["log"], "the plugin did not plan GPU prefill"
    assert "GPU staging 0.0 MiB" not in on["log"] and "CPU prefill for" not in on["log"], f"{quant} layers did not stream"
    assert fallback_text(fmt) in on["log"], "the fallback was not forced"
    _check(twin, on, f"{arch} {quant} GPU prefill (fallback) vs bf16 twin")


@pytest.mark.parametrize("arch,quant", QUANTIZED_GPU)
def test_quantized_gpu_prefill_native_kernels(quantized_runs, arch, quant):
    """GPU prefill through vLLM's own fused-MoE kernel on the streamed codes (lk_moe.gpu_native), where
    this GPU has one. W4A16 / W8A16 keep bf16 activations: the bf16 criterion against the twin. The fp8
    formats' W8A8 kernels quantize the activations to fp8, as vLLM's own method does with the switch off:
    the reference is then the switch-off run (vLLM's kernels on the same file). Teacher-forced (every
    scored position is GPU prefill) the run may be no farther from the twin's fp32 truth than the
    switch-off run; the greedy tokens (decode on the CPU, W8A16, over prompts whose keys/values the fp8
    prefill computed) no farther from the twin than the switch-off run's are."""
    if not _native_here(quant):
        pytest.skip(f"{ENGINE_FORMAT[quant]} has no native GPU kernel on this GPU")
    fmt = ENGINE_FORMAT[quant]
    on = _get(quantized_runs, f"{arch}-{quant}-gpu-native")
    twin = _get(quantized_runs, f"{arch}-{quant}-twin-stock")
    assert native_text(fmt) in on["log"], "the native kernel was not taken"
    assert "GPU staging 0.0 MiB" not in on["log"] and "CPU prefill for" not in on["log"], f"{quant} layers did not stream"
    if fmt not in W8A8_NATIVE:
        _check(twin, on, f"{arch} {quant} GPU prefill (native) vs bf16 twin")
        return
    _check_w8a8(twin, _get(quantized_runs, f"{arch}-{quant}-off"), on, f"{arch} {quant} GPU prefill (native W8A8)")


@pytest.mark.parametrize("arch", NATIVE)
def test_gpt_oss_mxfp4_experts_match_switch_off(quantized_runs, arch):
    """gpt-oss as released: MXFP4 experts with biases and the clamped SwiGLU, interleaved gate/up
    rows, hidden/intermediate sizes vLLM would pad for its kernels (the engine keeps them unpadded)."""
    off, on = _get(quantized_runs, f"{arch}-off"), _get(quantized_runs, f"{arch}-cpu")
    assert "lk_moe: hybrid MoE layers" in on["log"]
    _check(off, on, f"{arch} cpu-prefill")


def _gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


@pytest.mark.skipif(_gpus() < 2, reason="TP=2 needs two GPUs (nvidia-h200-x2)")
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_tensor_parallel_2_matches_tp1(tmp_path, arch):
    """Each rank's engine holds its shard of every expert, on its own CPU share; vLLM all-reduces
    the partial outputs. TP=2 against TP=1, both with the switch on (same criterion)."""
    procs = [_launch(tmp_path, arch, "cpu-tp1", CPU, KV), _launch(tmp_path, arch, "cpu-tp2", CPU, KV + ["--tp", "2"])]
    res = _collect(tmp_path, procs)
    tp1, tp2 = _get(res, f"{arch}-cpu-tp1"), _get(res, f"{arch}-cpu-tp2")
    assert "rank 1/2" in tp2["log"], "the second rank did not report its own CPU share"
    _check(tp1, tp2, f"{arch} tp2 vs tp1")
