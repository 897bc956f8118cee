"""benchmarks/serve_load.py and serve_soak.py read vLLM's and lk_moe's own log lines and counters: the
parsing, on lines as vLLM 0.33.0 and lk_moe print them (from docs/results/2026-12-02_h200_session17.log)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import serve_load  # noqa: E402
import serve_soak  # noqa: E402

GiB = 1 << 30

LOG = """\
(EngineCore pid=2841) INFO 12-02 18:03:12 [runtime.py:103] lk_moe: experts of 20/48 hybrid MoE layers in host RAM (22.5 GiB, repacked at 7.1 GB/s in 3.4 s)
(EngineCore pid=2841) INFO 12-02 18:03:12 [runtime.py:103] lk_moe: experts of all 48/48 hybrid MoE layers in host RAM (54.0 GiB, repacked at 7.5 GB/s in 7.7 s)
(EngineCore pid=2841) INFO 12-02 18:03:13 [model_runner.py:428] Model loading took 3.87 GiB memory and 19.994755 seconds
(EngineCore pid=2841) INFO 12-02 18:03:15 [monitor.py:62] [backbone] torch.compile took 0.31 s in total
(EngineCore pid=2841) INFO 12-02 18:03:25 [model_runner.py:1163] Graph capturing finished in 7 secs, took 0.68 GiB
(EngineCore pid=2841) INFO 12-02 18:03:42 [model_runner.py:1163] Graph capturing finished in 11 secs, took 0.45 GiB
(EngineCore pid=2841) INFO 12-02 18:03:43 [core.py:405] init engine (profile, create kv cache, warmup model) took 29.38 s (compilation: 0.31 s)
"""


def test_startup_phases_from_the_log():
    assert serve_load.phases(LOG) == {"lk_moe_repack_s": 7.7, "model_load_s": 19.994755, "compile_s": 0.31,
                                      "capture_s": 18.0, "engine_init_s": 29.38}


def test_counters_from_a_metrics_page():
    page = ('# HELP lvllm_moe_calls_total x\n# TYPE lvllm_moe_calls_total counter\n'
            'lvllm_moe_calls_total{path="cpu_decode",rank="0"} 8424.0\n'
            'lvllm_moe_calls_total{path="cpu_decode",rank="1"} 6.0\n'
            'lvllm_moe_tokens_total{path="cpu_decode",rank="0"} 5.0\n'
            'lvllm_moe_tokens_total{path="gpu_prefill",rank="0"} 23552.0\n'
            'lvllm_moe_calls_created{path="cpu_decode",rank="0"} 1.7e9\n'
            'vllm:num_requests_running{engine="0"} 0.0\n')
    samples = serve_load.lvllm_samples(page)
    assert all(k.startswith("lvllm_moe_") and "_created" not in k for k in samples)
    assert serve_load.counter_summary(samples).startswith("cpu_decode 8430 calls / 5 tokens / 0.0 s, cpu_prefill 0")


def test_the_soaks_decode_rate_counts_each_requests_share_of_a_window():
    # (start, first token, last token, tokens): 100 tokens over [0, 10) and 100 over [5, 15)
    done = [(0.0, 0.0, 10.0, 100), (4.0, 5.0, 15.0, 100)]
    assert serve_soak.decode_rate(done, 0.0, 10.0) == 15.0  # all of the first, half of the second
    assert serve_soak.decode_rate(done, 10.0, 15.0) == 10.0  # the second's last half


def test_the_soak_compares_the_first_window_after_warm_up_with_the_last():
    assert serve_soak.windows(1500.0, 120.0, 300.0) == ((120.0, 420.0), (1200.0, 1500.0))
    assert serve_soak.windows(540.0, 120.0, 300.0) == ((120.0, 420.0), (240.0, 540.0))  # a short soak: overlapping
    assert serve_soak.windows(200.0, 120.0, 300.0) == ((120.0, 200.0), (0.0, 200.0))
    sample = dict(t=0.0, rss=GiB, pinned=0, gpu=GiB)
    summary = dict(minutes=9.0, streams=8, requests=144, failed=0, warmup_s=120, window_min=5, rate_first=68.7,
                   rate_last=69.9)
    assert "the two windows overlap" in serve_soak.report([sample, sample], summary)
    assert "overlap" not in serve_soak.report([sample, sample], dict(summary, minutes=25.0))


def test_the_soak_reads_vllms_own_count_of_generated_tokens():
    page = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 3072.0
vllm:generation_tokens_total{engine="1",model_name="m"} 1024.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 99.0
"""
    assert serve_soak.generated_tokens(page) == 4096.0
    assert serve_soak.generated_tokens("lvllm_moe_calls_total 3.0\n") is None


def test_lvllm_env_takes_only_lvllm_and_engine_settings():
    assert serve_load.lvllm_env(["LVLLM_GPU_EXPERT_CACHE=auto", "LK_THREADS=12"]) == {
        "LVLLM_GPU_EXPERT_CACHE": "auto", "LK_THREADS": "12"}
    for bad in ("VLLM_X=1", "LVLLM_GPU_EXPERT_CACHE"):
        with pytest.raises(SystemExit, match="--lvllm-env"):
            serve_load.lvllm_env([bad])


def test_the_soak_report_says_how_the_long_prompt_went():
    sample = dict(t=0.0, rss=GiB, pinned=GiB, gpu=GiB)
    summary = dict(minutes=10, streams=4, requests=40, failed=0, warmup_s=0, window_min=5, rate_first=20.0,
                   rate_last=19.5, long_prompt=dict(ok=True, prompt_tokens=8312, ttft_s=2.5))
    assert "long prompt: 8312 tokens, TTFT 2.5 s" in serve_soak.report([sample, sample], summary)
    summary["long_prompt"] = dict(ok=False, error="HTTP 500")
    assert "long prompt FAILED: HTTP 500" in serve_soak.report([sample, sample], summary)


def test_the_soak_reports_the_pinned_memory_the_workers_count():
    summary = dict(minutes=10, streams=8, requests=80, failed=0, warmup_s=60, window_min=5, rate_first=68.0,
                   rate_last=69.0)
    early = dict(t=60.0, rss=58 * GiB, pinned=0, pinned_host=int(55.5 * GiB), gpu=GiB)
    late = dict(early, t=600.0, pinned_host=int(55.75 * GiB))
    text = serve_soak.report([early, late], summary)
    assert "pinned (lvllm_pinned_host_bytes): 55.50 GiB after warm-up (t=60 s) -> 55.75 GiB at the end (+0.250 GiB" in text
    assert "pinned (VmPin): 0.00 GiB" in text
    earlier_run = [{k: v for k, v in s.items() if k != "pinned_host"} for s in (early, late)]
    assert "lvllm_pinned_host_bytes" not in serve_soak.report(earlier_run, summary)


def test_the_soak_checks_gpu_memory_against_the_vram_cap():
    total = 140 * GiB
    assert serve_soak.vram_cap(["--gpu-memory-utilization=0.17"], total) == int(0.17 * total)
    assert serve_soak.vram_cap(["--gpu-memory-utilization", "0.5"], total) == int(0.5 * total)
    assert serve_soak.vram_cap([], total) == int(0.9 * total)  # vLLM's default
    summary = dict(minutes=10, streams=4, requests=40, failed=0, warmup_s=0, window_min=5, rate_first=20.0,
                   rate_last=19.5, gpu_total=total, vram_cap=serve_soak.vram_cap(["--gpu-memory-utilization=0.17"], total))
    low, high = (dict(t=float(t), rss=GiB, pinned=GiB, gpu=g) for t, g in ((0, 20 * GiB), (30, 24 * GiB)))
    assert "peak 20.00 GiB against the cap of 23.80 GiB" in serve_soak.report([low, low], summary)
    assert "held" in serve_soak.report([low, low], summary)
    assert "EXCEEDED" in serve_soak.report([low, high], summary)


BUDGET_LINE = ("(EngineCore pid=12961) INFO 12-03 22:23:41 [gpu_worker.py:1066] Free memory on device (139.1/139.8 GiB) on "
               "startup. Desired GPU memory utilization is (0.17, 23.77 GiB). Actual usage is 15.39 GiB for consumed memory")


def test_the_soak_reads_vllms_own_budget_and_counts_from_its_first_snapshot():
    """(the H200 soak of 2026-12-03: 24.50 GiB in nvidia-smi under a 0.17 cap, 0.70 GiB of it the CUDA context
    that was there before vLLM's first snapshot)"""
    budget = serve_soak.vllm_budget("noise\n" + BUDGET_LINE)
    assert abs(budget["vram_before"] / GiB - 0.70) < 1e-6 and abs(budget["vram_cap"] / GiB - 23.77) < 1e-6
    assert serve_soak.vllm_budget("no such line") == {}
    summary = dict(minutes=7, streams=4, requests=252, failed=0, warmup_s=0, window_min=5, rate_first=200.0,
                   rate_last=204.8, **budget)
    at = lambda gib: dict(t=30.0, rss=GiB, pinned=0, gpu=int(gib * GiB))  # noqa: E731
    assert "23.77 GiB of it after vLLM's first snapshot" in serve_soak.report([at(24.47)] * 2, summary)
    assert "budget of 23.77 GiB: held" in serve_soak.report([at(24.47)] * 2, summary)
    assert "EXCEEDED by 0.23 GiB" in serve_soak.report([at(24.70)] * 2, summary)


def test_a_soak_cut_short_still_reports_from_its_start_record(tmp_path, capsys, monkeypatch):
    start = dict(start=True, shape="qwen3-30b-a3b", minutes=10, streams=4, startup_s=215.8, warmup_s=60, window_min=1,
                 gpu_total=140 * GiB, vram_cap=int(23.77 * GiB), vram_before=int(0.70 * GiB))
    rows = [start] + [dict(t=float(t), rss=59 * GiB, pinned=0, gpu=int(24.5 * GiB), requests=8 * i, failed=0,
                           rate=r, healthy=True) for i, (t, r) in enumerate(((30, 136.5), (60, 204.8), (90, 204.8),
                                                                             (120, 170.7), (150, 204.8)), 1)]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(sys, "argv", ["serve_soak.py", "--report", str(path)])
    assert serve_soak.main() == 0
    out = capsys.readouterr().out
    assert "soak: 2.5 min, 4 streams, 40 requests, 0 failed (cut short" in out
    assert "decode: 187.8 tok/s in the first 1 min after warm-up, 187.8 in the last" in out  # (60, 120] and (90, 150]
    assert "budget of 23.77 GiB: EXCEEDED by 0.03 GiB" in out


def test_gpu_prefill_auto_leaves_the_threshold_to_auto_fit(tmp_path, monkeypatch):
    """--gpu-prefill auto: the hybrid server starts without LVLLM_GPU_PREFILL_MIN_BATCH_SIZE (issue 26's no-knob runs)."""
    import argparse
    import types
    assert serve_load.gpu_prefill_arg("auto") == "auto" and serve_load.gpu_prefill_arg("512") == 512
    with pytest.raises(argparse.ArgumentTypeError, match="a token count or auto"):
        serve_load.gpu_prefill_arg("lots")
    seen = []
    monkeypatch.setattr(serve_load.subprocess, "Popen", lambda cmd, env, **kw: seen.append(env))
    monkeypatch.setenv("LVLLM_GPU_PREFILL_MIN_BATCH_SIZE", "64")  # the caller's own is never passed on
    for value in ("auto", 2048):
        a = types.SimpleNamespace(gpu_prefill=value, lvllm_env=["LVLLM_AUTO_FIT=1"], vllm=["vllm"], model="m",
                                  offload_gb=0, serve_arg=[])
        serve_load.Server(a, "hybrid", str(tmp_path / "serve.log"))
    assert "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE" not in seen[0] and seen[0]["LVLLM_AUTO_FIT"] == "1"
    assert seen[1]["LVLLM_GPU_PREFILL_MIN_BATCH_SIZE"] == "2048"
