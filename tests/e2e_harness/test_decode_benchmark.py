"""benchmarks/e2e_decode.py's modes and the CPU census it prints (the runs themselves need the GPU machine)."""
import json
import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cpu_census  # noqa: E402
from e2e_decode import (mode_env, mode_speculation, mtp_layers, plain_twin, speculation_lines,  # noqa: E402
                        probes_disagree, speculative, uses_dspark, uses_eagle3, uses_mtp)


def test_hybrid_variants_combine_into_their_settings():
    assert mode_env("hybrid") == {} and mode_env("stock") == {} and mode_env("offload") == {}
    assert mode_env("hybrid-excl-bsync-t12") == {"LVLLM_EXCLUSIVE_ENGINE_CPUS": "1", "LVLLM_CUDA_BLOCKING_SYNC": "1",
                                                 "LK_THREADS": "12"}
    assert mode_env("hybrid-mailbox") == {"LK_CPU_SIGNAL": "mailbox"}
    assert mode_env("hybrid-v1") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_ngram_variant_is_vllms_speculative_config_and_no_environment():
    assert mode_env("hybrid-ng3-t12") == {"LK_THREADS": "12"}
    assert mode_speculation("hybrid-ng3-t12") == {"method": "ngram", "num_speculative_tokens": 3,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert mode_speculation("hybrid") is None and mode_speculation("hybrid-t12") is None


def test_eagle3_variant_takes_its_draft_model():
    assert mode_env("hybrid-eg2") == {}
    assert mode_speculation("hybrid-eg2", "/d") == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 2}
    assert uses_eagle3(["hybrid", "hybrid-eg2"]) and not uses_eagle3(["hybrid-ng2", "stock"])
    with pytest.raises(SystemExit, match="draft model"):
        mode_speculation("hybrid-eg2")
    with pytest.raises(SystemExit, match="eg<draft tokens>"):
        mode_env("hybrid-eagle")


def test_speculation_lines_put_each_step_against_a_plain_one():
    """2 tokens a step at 30 tok/s: a step of 66.7 ms against plain decode's 25 ms at 40 tok/s (2.67x its cost)."""
    results = {"hybrid": {"decode_tok_s_1": 40.0, "decode_tok_s_4": 80.0},
               "hybrid-ng2": {"decode_tok_s_1": 30.0, "spec_accept_rate_1": 0.5, "spec_tokens_per_step_1": 2.0,
                              "decode_tok_s_4": None, "spec_accept_rate_4": None, "spec_tokens_per_step_4": None}}
    lines = speculation_lines(results)
    assert lines[0] == ("hybrid-ng2 @1: 30.00 tok/s, acceptance 0.50, 2.00 tokens a step; 0.75x plain decode's 40.00 "
                        "tok/s, step 66.67 ms = 2.67x a plain step's 25.00 ms")
    assert lines[1].startswith("hybrid-ng2 @4: no figure") and len(lines) == 2
    results["hybrid-ng2"].update(decode_tok_s_4=60.0, spec_accept_rate_4=0.5, spec_tokens_per_step_4=2.0)
    assert speculation_lines(results)[1] == (  # 4 requests: a step makes 4 x 2 tokens, a plain one 4
        "hybrid-ng2 @4: 60.00 tok/s, acceptance 0.50, 2.00 tokens a step; 0.75x plain decode's 80.00 tok/s, step "
        "133.33 ms = 2.67x a plain step's 50.00 ms")


def test_speculation_with_uniform_routing_is_put_against_plain_decode_with_it():
    """hybrid-eg2-ru (EAGLE-3 drafts, the routing replay's uniform trace) against hybrid-ru, not plain hybrid."""
    assert mode_env("hybrid-eg2-ru") == {"LVLLM_BENCH_ROUTING_REPLAY": "1"} == mode_env("hybrid-ru")
    assert plain_twin("hybrid-eg2-ru") == "hybrid-ru" and plain_twin("hybrid-ng3") == "hybrid"
    results = {"hybrid": {"decode_tok_s_1": 40.0}, "hybrid-ru": {"decode_tok_s_1": 20.0},
               "hybrid-eg2-ru": {"decode_tok_s_1": 10.0, "spec_accept_rate_1": 0.0, "spec_tokens_per_step_1": 1.0}}
    assert speculation_lines(results)[0] == ("hybrid-eg2-ru @1: 10.00 tok/s, acceptance 0.00, 1.00 tokens a step; "
                                             "0.50x plain decode's 20.00 tok/s, step 100.00 ms = 2.00x a plain "
                                             "step's 50.00 ms")


def test_cost_table_orders_the_speculative_modes_by_draft_tokens(tmp_path):
    """The k = 1..4 table: a step's time and its ratio to the plain twin's at 1 and 4 requests, beside the engine's own
    startup measurement (read from the mode's log) and vLLM's acceptance."""
    from e2e_decode import _log_figures, speculation_table
    log = tmp_path / "log"
    log.write_text("INFO lk_moe: speculative decoding (eagle3) with k=2 draft tokens: a verify step (3 tokens per request) "
                   "costs 2.73x a plain decode step's CPU expert time (measured on this machine, uniform routing; its "
                   "tokens route to 2.82x one token's expert bytes, so the engine runs it at 1.03 of that floor); ...\n")
    figures = _log_figures(str(log))
    assert figures == {"engine_verify_ratio": 2.73, "verify_union_ratio": 2.82}
    spec = {"spec_accept_rate_1": 0.0, "spec_tokens_per_step_1": 1.0, "spec_tokens_per_step_4": 1.0}
    results = {"hybrid-ru": {"decode_tok_s_1": 25.0, "decode_tok_s_4": 40.0},
               "hybrid-eg2-ru": dict(spec, decode_tok_s_1=10.0, decode_tok_s_4=None, **figures),
               "hybrid-eg1-ru": dict(spec, decode_tok_s_1=12.5, decode_tok_s_4=20.0),
               "hybrid-ng3": dict(spec, decode_tok_s_1=50.0)}  # no plain twin in this run: left out
    header, k1, k2 = speculation_table(results)
    assert header.split()[:9] == ["mode", "k", "step@1", "x", "plain", "step@4", "x", "plain", "engine"]
    assert k1.split() == ["hybrid-eg1-ru", "1", "80.00", "2.00x", "200.00", "2.00x", "n/a", "n/a", "0.00"]
    assert k2.split() == ["hybrid-eg2-ru", "2", "100.00", "2.50x", "n/a", "2.73x", "2.82x", "0.00"]


def test_graph_steps_come_from_the_statistics_lines(tmp_path):
    from e2e_decode import _log_figures, graph_line
    log = tmp_path / "log"
    log.write_text("lk_moe stats (rank 0, last 15 s): 40 steps; CPU path 38 steps, 900 tokens, 76 layer calls, 2.0 "
                   "ms/step engine, 30 steps from CUDA graphs; GPU path 2 steps, 9000 tokens, 4 layer calls, no H2D\n"
                   "lk_moe stats (rank 0, last 15 s): 62 steps; CPU path 62 steps, 62 tokens, 124 layer calls, 1.9 "
                   "ms/step engine, 62 steps from CUDA graphs; GPU path 0 steps, 0 tokens, 0 layer calls, no H2D\n")
    figures = _log_figures(str(log))
    assert (figures["cpu_steps"], figures["cpu_graph_steps"]) == (100, 92)
    assert graph_line("hybrid", figures).startswith("hybrid CPU-path steps replayed from CUDA graphs: 92 of 100 (92%;")
    assert graph_line("hybrid", {}) == ""


def test_a_results_file_keeps_only_this_checkpoints_modes(tmp_path, capsys):
    # Session 36: a GLM-5.3 run whose stock mode failed printed MiniMax-M2's stock row from the file beside its own
    from e2e_decode import load_results
    path = tmp_path / "bench.json"
    assert load_results(str(path), "/tmp/glm") == {}
    path.write_text(json.dumps({"hybrid": {"checkpoint": "/tmp/glm", "decode_tok_s_1": 65.5},
                                "stock": {"checkpoint": "/tmp/minimax", "decode_tok_s_1": 419.4},
                                "offload": {"decode_tok_s_1": 3.0}}))
    assert load_results(str(path), "/tmp/glm") == {"hybrid": {"checkpoint": "/tmp/glm", "decode_tok_s_1": 65.5}}
    assert "dropped offload, stock: measured on another checkpoint" in capsys.readouterr().out


def test_trace_loader_fills_every_replay_row(monkeypatch):
    """The worker's trace loader (expert_cache.control, what the ru variant sends): the uniform trace routes each of the
    replay's 32 rows on its own; a locality trace is made for 8 rows (its calibration) and repeated over the rest."""
    import numpy as np

    import expert_cache
    from lvllm import runtime

    class Replay:
        ids = np.zeros((4, 2, runtime.REPLAY_ROWS, 8), dtype=np.int32)

        def load(self, trace):
            self.loaded = trace

    replay = Replay()
    monkeypatch.setattr(runtime, "_runtime", types.SimpleNamespace(expert_cache=None, replay=replay))
    assert expert_cache.control(None, "trace", "uniform", 0, 128)
    rows = replay.loaded.reshape(-1, runtime.REPLAY_ROWS, 8).transpose(1, 0, 2).reshape(runtime.REPLAY_ROWS, -1)
    assert replay.loaded.shape == replay.ids.shape and len({r.tobytes() for r in rows}) == runtime.REPLAY_ROWS
    assert expert_cache.control(None, "trace", "lru67", 0, 128)
    loaded = replay.loaded
    assert loaded.shape == replay.ids.shape
    assert (loaded[:, :, 8:] == np.tile(loaded[:, :, :8], (1, 1, runtime.REPLAY_ROWS // 8 - 1, 1))).all()
    assert not (loaded[:, :, :4] == loaded[:, :, 4:8]).all()  # its 8 rows route apart


@pytest.mark.parametrize("mode", ["hybrid-fast", "hybrid-t0", "stock-excl", "turbo", "hybrid-ng0", "stock-ng3"])
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
    # this process's threads only: another process on the machine (a second test run) may hold engine workers
    line = cpu_census.summary([r for r in rows if r["pid"] == os.getpid()], 2)
    assert line.startswith("0 engine workers: 0.0 cores") and "of a core: none" not in line


def test_the_benchmark_refuses_a_bad_mode_before_anything_starts(tmp_path):
    import subprocess
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e_decode.py"
    r = subprocess.run([sys.executable, str(script), "--modes", "hybrid,hybrid-fast", "--log-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown variant 'fast'" in r.stderr
    assert not any(tmp_path.iterdir())  # no mode started


def test_engine_direct_step_times_every_hybrid_layer_in_the_worker(monkeypatch):
    """What e2e_decode asks the vLLM worker for after its measurements: the hybrid layers called straight from
    Python, one decode step (M = 1) of all of them; here real engine layers in a stand-in runtime."""

    import torch

    import lk_moe
    from e2e_decode import _engine_direct_step
    from lvllm import runtime
    from lvllm.stats import WorkerStats

    calls = []

    class Counting:  # a real engine layer that counts its forwards
        def __init__(self, layer):
            self.layer = layer

        def __getattr__(self, name):
            return getattr(self.layer, name)

        def forward(self, x, ids, w):
            calls.append((tuple(x.shape), tuple(ids.shape)))
            return self.layer.forward(x, ids, w)

    g = torch.Generator().manual_seed(0)
    E, H, I = 8, 128, 64
    stats = WorkerStats(0, 60, lambda line: None)
    for index in (2, 0, 1):  # added out of order: a step runs them in model order
        layer = lk_moe.MoELayer(torch.randn(E, 2 * I, H, generator=g).bfloat16(),
                                torch.randn(E, H, I, generator=g).bfloat16())
        stats.add_layer(index, types.SimpleNamespace(layer=Counting(layer), top_k=2, index=index))
    assert [h.index for h in stats.hybrids()] == [0, 1, 2]
    monkeypatch.setattr(runtime, "_runtime", types.SimpleNamespace(monitor=stats))
    ms, n = _engine_direct_step(None, reps=3)
    assert n == 3 and ms > 0
    assert calls == [((1, H), (1, 2))] * 9  # 3 steps x 3 layers, M = 1, top-2
    monkeypatch.setattr(runtime, "_runtime", types.SimpleNamespace(monitor=WorkerStats(0, 60, lambda line: None)))
    assert _engine_direct_step(None) is None  # no hybrid layer (a stock run): nothing to time


def test_modes_share_the_total_timeout():
    """--total-timeout: each mode gets what is left when it starts less a floor for each later mode, never less than an
    even share, so a cold first mode gets more and a mode that fails fast leaves its time to the next (an even split of
    530 s stopped all three modes of a run on a fresh H200 while they measured: each compiled cold and started in
    145-166 s of its 172)."""
    from e2e_decode import mode_share
    assert mode_share(530, 3, 1500, 150) == 230  # the first mode: all but two floors
    assert mode_share(400, 3, 1500, 150) == 133  # floors that would leave it less than an even share: the even share
    assert mode_share(300, 2, 1500, 150) == 150
    assert mode_share(280, 1, 1500, 150) == 280  # the first of two failed after 20 s: the second gets the rest
    assert mode_share(900, 1, 600, 150) == 600  # --timeout caps a mode
    assert mode_share(-5, 2, 600, 150) == 1  # past the deadline: a start that times out at once, never a negative timeout


def test_a_mode_stopped_while_measuring_keeps_what_it_measured(tmp_path):
    """A child that printed its decode figures and then outran its timeout (the harness stops it): its last partial
    result is kept, marked with the stop; one stopped before any figure gives none."""
    from e2e_decode import measured, mode_result
    from harness import run_child
    child = tmp_path / "child.py"
    child.write_text("import json, time\n"
                     "print('RESULT ' + json.dumps({'mode': 'hybrid-eg1', 'startup_s': 60.0, 'decode_tok_s_1': 20.5, "
                     "'decode_tok_s_1_all': [20.5], 'partial': True}), flush=True)\n"
                     "time.sleep(60)\n")
    rc, lines = run_child([sys.executable, str(child)], dict(os.environ), str(tmp_path / "log"), "hybrid-eg1",
                          ("RESULT",), timeout=3)
    r = mode_result(rc, lines)
    assert rc == "timeout" and r["partial"] and r["rc"] == "timeout" and r["decode_tok_s_1"] == 20.5
    assert measured(r) == ["decode_tok_s_1"]
    assert mode_result("timeout", []) is None
    assert mode_result(0, [{"mode": "hybrid", "partial": True}, {"mode": "hybrid", "ttft_1024_s": 1.0}]) == \
        {"mode": "hybrid", "ttft_1024_s": 1.0}


def test_speculative_modes_are_told_apart_from_plain_ones():
    """(Their decode rate is not put against one token's bandwidth bound: a verify step reads k + 1 tokens' experts.)"""
    assert all(speculative(m) for m in ("hybrid-ng3", "hybrid-eg1-ru", "hybrid-mt2", "hybrid-ds4"))
    assert not any(speculative(m) for m in ("hybrid", "hybrid-ru", "stock", "hybrid-v1", "offload"))


def test_mtp_variant_drafts_with_the_checkpoints_own_layers():
    assert mode_env("hybrid-mt2") == {}
    assert mode_speculation("hybrid-mt2") == {"method": "mtp", "num_speculative_tokens": 2}
    assert uses_mtp(["hybrid", "hybrid-mt1"]) and not uses_mtp(["hybrid-ng1", "hybrid-eg1"])
    assert mtp_layers({"num_nextn_predict_layers": 1}) == 1
    assert mtp_layers({"text_config": {"mtp_num_hidden_layers": 2}}) == 2
    assert mtp_layers({"num_nextn_predict_layers": 0}) == 0 and mtp_layers({}) == 0
    with pytest.raises(SystemExit, match="mt<draft tokens>"):
        mode_env("hybrid-mtp")


def test_generated_model_declares_the_mtp_layer_the_mt_modes_draft_with(tmp_path):
    """DeepSeek-V4-Flash's release config (dummy weights) with mtp=1: the field vLLM's MTP model reads, the release's
    FP8 projections (its MTP layer's e_proj / h_proj among them); a family without an MTP layer is refused."""
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    path = make_checkpoint("deepseek_v4", str(tmp_path / "v4"), "big", quant="mxfp4", mtp=1)
    config = json.load(open(f"{path}/config.json"))
    assert mtp_layers(config) == 1 and config["quantization_config"]["quant_method"] == "fp8"
    with pytest.raises(ValueError, match="mtp layers are written for deepseek_v3"):
        make_checkpoint("qwen3_moe", str(tmp_path / "q"), "big", mtp=1)


def test_dspark_variant_drafts_a_block_from_the_stages():
    assert mode_speculation("hybrid-ds4") == {"method": "dspark", "num_speculative_tokens": 4}
    assert uses_dspark(["hybrid", "hybrid-ds4"]) and not uses_dspark(["hybrid-mt1"])


def test_a_release_written_without_its_vision_tower_runs_its_text_model_alone():
    """MiniMax-M3's generated checkpoints (the release's vision-language layout, no vision weights) run with vLLM's
    language_model_only, as the e2e suite serves them; other models keep vLLM's default unless asked."""
    from argparse import Namespace

    from e2e_decode import engine_kwargs
    from lvllm.testing.tiny_checkpoint import LANGUAGE_MODEL_ONLY
    base = dict(model="m", max_model_len=9216, max_num_seqs=4, gpu_util=0.85, offload_gb=0, eagle3_draft="",
                no_jit_warmup=False)
    assert "minimax_m3" in LANGUAGE_MODEL_ONLY
    assert engine_kwargs(Namespace(**base, mode="hybrid-mt2", language_model_only=True))["language_model_only"]
    assert "language_model_only" not in engine_kwargs(Namespace(**base, mode="hybrid", language_model_only=False))


def test_probes_that_disagree_are_named_with_the_ratio_to_the_higher_one():
    """Session 34 (H100 host): probes 50.5 / 110.2 GB/s made plain decode '1.20 of the bandwidth bound' at their
    mean; the line now says they disagree and gives 0.88 of the higher probe."""
    assert probes_disagree([106.5, 106.3], 100.0) == ""
    note = probes_disagree([50.5, 110.2], 1.20 * 80.4)
    assert "2.18x" in note and "0.88 of the higher one" in note


def test_decode_at_4_requests_against_the_bound_of_their_expert_union():
    """Qwen3-Next's 512 experts, top-10: 4 independently routed tokens read 3.88x one token's experts, so the bound
    at 4 requests is 4 / 3.88 times the bound at 1; the engine's step against the read bandwidth for that union;
    speculative modes and rows without the figures get no line."""
    from e2e_decode import decode4_lines
    r = dict(decode_tok_s_4=80.0, read_bw_gbs=100.0, bound_tok_s=90.0, engine_ms_per_step_4=40.0)
    union = 512 * (1 - (1 - 10 / 512) ** 4) / 10
    lines = decode4_lines("hybrid", r, 512, 10, 10**9)
    bound = 90.0 * 4 / union
    assert f"= {80.0 / bound:.2f} of the bandwidth bound ({bound:.1f} tok/s" in lines[0] and f"{union:.2f}x" in lines[0]
    gbs = union * 1e9 / 40.0 / 1e6
    assert f"engine 40.00 ms at {gbs:.1f} GB/s = {gbs / 100:.2f} of the read bandwidth" in lines[1]
    assert decode4_lines("hybrid-ng3", r, 512, 10, 10**9) == []
    assert decode4_lines("hybrid", dict(r, decode_tok_s_4=None), 512, 10, 10**9) == []
    assert len(decode4_lines("hybrid", dict(r, engine_ms_per_step_4=None), 512, 10, 10**9)) == 1


def test_decode_at_1_request_is_split_into_engine_gpu_and_hand_offs():
    """A 10 ms step (100 tok/s) with 6 ms in the engine, stock at 400 tok/s (2.5 ms a step, the GPU's share at most):
    at least 1.5 ms of hand-offs; without stock's row only the engine line; a stock step longer than what the engine
    leaves is said to overlap, never a negative hand-off."""
    from e2e_decode import decode1_split_lines
    r = dict(decode_tok_s_1=100.0, engine_ms_per_step_1=6.0, engine_queue_ms_per_step_1=0.1, read_bw_gbs=100.0)
    lines = decode1_split_lines("hybrid", r, {"decode_tok_s_1": 400.0}, 10**8)
    assert "step 10.00 ms: engine 6.00 ms (60%" in lines[0] and "the other 4.00 ms" in lines[0]
    assert lines[1] == ("hybrid decode @1 step split: engine 6.00 ms (60%), GPU at most 2.50 ms (25%; stock's whole "
                        "step, its experts included), hand-offs and graph breaks at least 1.50 ms (15%)")
    assert len(decode1_split_lines("hybrid", r, None, 10**8)) == 1
    assert len(decode1_split_lines("hybrid-ng3", r, {"decode_tok_s_1": 400.0}, 10**8)) == 1
    slow = decode1_split_lines("hybrid", r, {"decode_tok_s_1": 200.0}, 10**8)[1]
    assert "at least 0.00 ms (0%) (the parts overlap by 1.00 ms)" in slow
    assert decode1_split_lines("hybrid", {"decode_tok_s_1": 100.0}, None, 1) == []
