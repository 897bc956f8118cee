"""Startup progress lines: every few seconds and at the last layer, with size and speed."""
from lvllm.progress import LoadProgress

from .conftest import lvllm_log_records


def test_lines_every_interval_and_at_the_end():
    t = [0.0]
    lines = []
    p = LoadProgress(total_layers=4, log=lines.append, every_s=5.0, clock=lambda: t[0])
    for step in (1.0, 2.0, 6.5, 7.0):
        t[0] = step
        p.layer_done(1 << 30, 0.5)
    assert len(lines) == 2  # at 6.5 s (5 s after the start) and at the last layer
    assert lines[0].startswith("lk_moe: experts of 3/4") and "3.0 GiB" in lines[0]
    assert lines[1].startswith("lk_moe: experts of all 4/4") and "repacked at 2.1 GB/s in 2.0 s" in lines[1]


def test_unknown_total():
    lines = []
    p = LoadProgress(total_layers=None, log=lines.append, every_s=0.0)
    p.layer_done(1 << 29, 0.25)
    assert lines == ["lk_moe: experts of 1 hybrid MoE layers in host RAM (0.5 GiB, repacked at 2.1 GB/s in 0.2 s)"]


def test_runtime_counts_planned_layers_and_logs_the_last():
    from lvllm.config import from_env
    from lvllm.policy import LayerPlan
    from lvllm.runtime import WorkerRuntime

    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1"}))
    rt.note_planned(LayerPlan("model.layers.0.mlp.experts", 0, "gpu_resident"))
    for i in (1, 2):
        rt.note_planned(LayerPlan(f"model.layers.{i}.mlp.experts", i, "hybrid", "bf16"))
    assert rt.planned_hybrid == 2 and rt.resident_layers == [0]
    with lvllm_log_records() as seen:
        rt.layer_loaded(1 << 30, 0.5)
        rt.layer_loaded(1 << 30, 0.5)
    assert any("lk_moe: experts of all 2/2 hybrid MoE layers in host RAM (2.0 GiB" in m for _, m in seen), seen


def test_runtime_warns_once_per_format_that_keeps_cpu_prefill():
    """GPU prefill on: every engine format streams (int4/fp4 too), no warning; a format without a GPU
    path (made-up names here: the engine has none today) gets one warning per model and format."""
    import logging

    from lvllm.config import from_env
    from lvllm.policy import LayerPlan
    from lvllm.runtime import WorkerRuntime

    with lvllm_log_records() as seen:
        rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "2048"}))
        for i, fmt in enumerate(["wna16_int4", "fp8_block", "mxfp4", "int8_channel", "nvfp4", "bf16"]):
            rt.note_planned(LayerPlan(f"model.layers.{i}.mlp.experts", i, "hybrid", fmt))
    assert not [m for lvl, m in seen if lvl == logging.WARNING] and rt.cpu_prefill_formats == []
    assert "CPU prefill for" not in rt.summary()
    with lvllm_log_records() as seen:
        for i, fmt in enumerate(["fp6_someday", "fp8_block", "fp6_someday", "int3_someday"]):
            rt.note_planned(LayerPlan(f"model.layers.{i + 6}.mlp.experts", i + 6, "hybrid", fmt))
        off = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1"}))
        off.note_planned(LayerPlan("model.layers.0.mlp.experts", 0, "hybrid", "fp6_someday"))
    warnings = [m for lvl, m in seen if lvl == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "fp6_someday experts have no GPU path" in warnings[0] and "stays on the CPU" in warnings[0]
    assert "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=2048" in warnings[0]
    assert "int3_someday experts have no GPU path" in warnings[1]
    assert rt.cpu_prefill_formats == ["fp6_someday", "int3_someday"] and off.cpu_prefill_formats == []
    assert "(CPU prefill for fp6_someday, int3_someday layers: no GPU path)" in rt.summary()


def test_summary_names_the_gpu_path_of_each_format():
    """The startup summary says once per format which GPU path its layers take and why
    (HybridMoE.gpu_path_reason: native kernel, fallback and its reason, or bf16)."""
    from types import SimpleNamespace

    from lk_moe import gpu_dequant
    from lvllm.config import from_env
    from lvllm.policy import LayerPlan
    from lvllm.runtime import WorkerRuntime

    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "2048"}))
    for i, (fmt, cap) in enumerate([("fp8_block", (9, 0)), ("fp8_block", (9, 0)), ("mxfp4", (9, 0)),
                                    ("fp8_channel", (8, 0))]):
        path, reason = gpu_dequant.gpu_path(fmt, capability=cap, force_fallback=False)
        layer = SimpleNamespace(nbytes=1, expert_bytes=1)
        hybrid = SimpleNamespace(format=fmt, gpu_path=path, gpu_path_reason=reason, streamer=None, layer=layer)
        rt.add_layer(LayerPlan(f"model.layers.{i}.mlp.experts", i, "hybrid", fmt), hybrid)
    text = rt.summary()
    assert text.count("GPU path of fp8_block: native on sm_90: vLLM fused_experts") == 1, text
    assert "GPU path of mxfp4: no native GPU kernel wired" in text
    assert "GPU path of fp8_channel: the native kernel needs sm_89+, this GPU is sm_80" in text


def test_worker_says_the_switch_is_on_when_its_first_moe_layer_is_built(monkeypatch):
    """The "enabled" line comes from the worker's runtime (vLLM 0.33 configures its loggers after plugins load, so a
    line at plugin registration was dropped): with the resident layers, also when every MoE layer is GPU-resident
    and no hybrid layer ever logs its summary."""
    from lvllm import runtime
    from lvllm.config import from_env

    monkeypatch.setattr(runtime, "_runtime", None)
    with lvllm_log_records() as seen:
        rt = runtime.get_runtime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "1-3,7",
                                           "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "256"}))
        assert runtime.get_runtime() is rt
    lines = [m for _, m in seen if "lk_moe hybrid MoE enabled" in m]
    assert len(lines) == 1, seen
    assert "GPU prefill from 256 tokens" in lines[0] and lines[0].endswith("GPU-resident MoE layers [1-3,7]"), lines
