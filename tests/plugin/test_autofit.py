"""lvllm.autofit on recorded machines and models (no GPU): every plan fits the VRAM and host RAM it was
given, explicit settings win, and a model that cannot fit gets one message with the shortfall."""
import itertools

import pytest

from lvllm.autofit import (ENGINE_OVERHEAD, PROCESS_HOST_BYTES, Machine, Model, Request, cpu_prefill_seconds, plan,
                           prefill_threshold, slot_bytes, stream_seconds)
from lvllm.fit import RESERVE_BYTES, STAGING_BYTES, FitError

GiB = 1 << 30
GB = 10 ** 9

# Bytes per routed-expert parameter in each engine format (codes + scales as the checkpoints store them).
PARAM_BYTES = {"bf16": 2.0, "fp8_block": 1 + 4 / 128 ** 2, "fp8_channel": 1.0005, "int8_channel": 1.0005,
               "wna16_int4": 0.5 + 2 / 128, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "mxfp8": 1 + 1 / 32}


def moe_model(name, moe_layers, E, K, H, I, other, kv_per_token, fmt="bf16", activation="silu"):
    expert = int(3 * H * I * PARAM_BYTES[fmt])
    return Model(name=f"{name} {fmt}", moe_layers=moe_layers, experts=E, top_k=K, hidden=H, expert_intermediate=I,
                 layer_expert_bytes=E * expert, other_bytes=other, kv_bytes_per_token=kv_per_token, fmt=fmt,
                 slot_bytes=slot_bytes(fmt, expert, H, I, activation))


# Recorded shapes (config.json arithmetic): KV bytes per token per GPU at TP=1 in bf16.
def qwen3_30b(fmt="bf16"):  # 48 layers x 4 KV heads x 128 x (K, V) x 2 bytes
    return moe_model("Qwen3-30B-A3B", 48, 128, 8, 2048, 768, int(3.1 * GB), 48 * 4 * 128 * 2 * 2, fmt)


def gpt_oss_120b():  # 18 full-attention layers of 8 KV heads x 64 (the sliding ones hold 128 tokens)
    return moe_model("gpt-oss-120b", 36, 128, 4, 2880, 2880, int(3.6 * GB), 18 * 8 * 64 * 2 * 2, "mxfp4")


def deepseek_v3_fp8():  # MLA: one 512 + 64 latent per layer
    return moe_model("DeepSeek-V3", 58, 256, 8, 7168, 2048, int(17 * GB), 61 * 576 * 2, "fp8_block")


def deepseek_v4_flash():  # clamped silu: no cache slots (kv: MLA-like upper bound)
    return moe_model("DeepSeek-V4-Flash", 42, 256, 6, 4096, 2048, int(9 * GB), 43 * 512 * 2, "mxfp4",
                     activation="silu_clamp")


def minimax_m3_mxfp8(layers=20):  # its release's MXFP8 experts, swigluoai (cache slots in bf16), fewer layers
    return moe_model("MiniMax-M3", layers, 128, 4, 6144, 3072, int(10 * GB), layers * 4 * 128 * 2 * 2, "mxfp8",
                     activation="swigluoai")


GPUS = {"24 GB": 24 * GB, "48 GB": 48 * GB, "80 GB": 80 * GB, "141 GB": 141 * GB}
HOSTS = {"64 GiB": 64 * GiB, "128 GiB": 128 * GiB, "256 GiB": 256 * GiB, "1024 GiB": 1024 * GiB}
MODELS = [qwen3_30b(f) for f in PARAM_BYTES] + [gpt_oss_120b(), deepseek_v3_fp8(), deepseek_v4_flash(),
                                                minimax_m3_mxfp8()]


def h200_host(gpu=141 * GB, host=125 * GiB, **kw):
    return Machine(gpu_bytes=gpu, host_bytes=host, cores=16, read_gbps=90, h2d_gbps=53, isa="amx", **kw)


def _check_fits(m: Machine, model: Model, req: Request, p):
    usable = int(m.gpu_bytes * m.gpu_memory_utilization)
    layer_gpu = model.layer_expert_bytes // req.tp
    used = model.other_bytes // req.tp + p.reserve_bytes + p.kv_bytes + p.resident_layers * layer_gpu + p.cache_bytes
    assert used <= usable, (model.name, p.lines)
    assert p.kv_bytes >= model.kv_bytes_per_token * req.max_model_len  # one full sequence at least
    hybrid = model.moe_layers - p.resident_layers
    assert p.host_bytes_needed == (int(model.layer_expert_bytes * ENGINE_OVERHEAD) * hybrid + PROCESS_HOST_BYTES * req.tp
                                   + model.host_table_bytes)
    assert p.host_bytes_needed <= m.host_bytes, (model.name, p.lines)
    assert 0 <= p.resident_layers <= model.moe_layers
    # no VRAM left idle: less than one more slot is left (or every hybrid expert has one), or, without a
    # cache, less than one more whole layer
    if p.cache_bytes:
        slot = model.slot_bytes // req.tp
        assert usable - used < slot or p.cache_bytes == slot * model.experts * hybrid, p.lines
    elif hybrid:
        assert usable - used < layer_gpu, p.lines
    if not model.slot_bytes:
        assert p.cache_bytes == 0
    assert (p.gpu_prefill_min_batch == 0) == (hybrid == 0 or not model.gpu_prefill)
    assert p.threads >= 1 and p.lines


@pytest.mark.parametrize("gpu,host,tp", list(itertools.product(GPUS, HOSTS, (1, 2))))
def test_every_plan_fits_what_it_was_given_or_says_why_not(gpu, host, tp):
    m = Machine(gpu_bytes=GPUS[gpu], host_bytes=HOSTS[host], cores=32, read_gbps=120, h2d_gbps=25, isa="avx512_bf16")
    for model in MODELS:
        req = Request(max_model_len=32768, tp=tp)
        try:
            p = plan(m, model, req)
        except FitError as e:
            msg = str(e)
            assert model.name in msg and "short by" in msg and "Options:" in msg, msg
            continue
        _check_fits(m, model, req, p)


def test_engram_tables_count_in_host_ram_not_in_vram(tmp_path):
    """DeepSeek-V4.1's Engram n-gram tables stay in host RAM under vLLM 0.33 (pinned, read through unified
    addressing): the planner counts them there, from the safetensors names or the config."""
    import json

    from lvllm.autofit_inputs import describe_model
    from lvllm.cli.checkpoint_info import engram_table_bytes, read_checkpoint
    cfg = dict(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", num_hidden_layers=4,
               hidden_size=256, moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4,
               num_attention_heads=4, head_dim=512, vocab_size=2048, engram_layer_ids=[1, 2],
               engram_num_embeddings=[1000, 3000], engram_head_dim=64)
    assert engram_table_bytes(cfg) == 4000 * (64 + 2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = read_checkpoint(str(tmp_path))  # config only: estimated
    assert info.host_table_bytes == 4000 * 66
    model = describe_model(info, 1, 4096)
    big = Model(**{**model.__dict__, "host_table_bytes": 189 * GiB})
    m = h200_host(gpu=48 * GB, host=256 * GiB)
    p = plan(m, big, Request(max_model_len=4096))
    assert p.host_bytes_needed >= 189 * GiB and any("host tables 189.00 GiB" in ln for ln in p.lines)
    with pytest.raises(FitError, match="host tables"):
        plan(h200_host(gpu=48 * GB, host=125 * GiB), big, Request(max_model_len=4096))


def test_deepseek_v4_flash_experts_are_read_as_mxfp4_under_its_fp8_config(tmp_path):
    """The release's config says "fp8" for the projections and expert_dtype "fp4" for the routed experts: the
    planner and doctor count MXFP4 bytes (17/32 per weight) and plan the engine's mxfp4 format for them."""
    import json

    from lvllm.autofit_inputs import describe_model
    from lvllm.cli.checkpoint_info import read_checkpoint
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    path = make_checkpoint("deepseek_v4", str(tmp_path / "v4"), "big", quant="mxfp4")
    cfg = json.load(open(f"{path}/config.json"))
    assert cfg["expert_dtype"] == "fp4" and cfg["quantization_config"]["quant_method"] == "fp8"
    info = read_checkpoint(path)
    assert info.moe_layers == 43 and info.expert_bytes == 43 * 256 * 3 * 4096 * 2048 * 17 // 32
    model = describe_model(info, 1, 8192)
    assert model.fmt == "mxfp4" and model.top_k == 6 and model.slot_bytes == 0  # silu_clamp: no cache slots


@pytest.mark.parametrize("quant,fmt,per_weight", [("fp8", "fp8_block", 1.0), ("nvfp4", "nvfp4", 0.56)])
def test_deepseek_v4_other_expert_formats_are_read_by_their_own_fields(tmp_path, quant, fmt, per_weight):
    """expert_dtype "fp8" (V4-Flash-Base) is FP8 block experts; expert_dtype "fp4" with moe_quant_algo "NVFP4" is
    NVFP4 (not MXFP4): the planner holds the engine's format for them, and an estimate from the config alone counts
    that format's bytes."""
    import json

    from lvllm.autofit_inputs import describe_model
    from lvllm.cli.checkpoint_info import info_from_config, read_checkpoint
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    path = make_checkpoint("deepseek_v4", str(tmp_path / "v4"), quant=quant)
    assert describe_model(read_checkpoint(path), 1, 4096).fmt == fmt
    cfg = json.load(open(f"{path}/config.json"))
    info = info_from_config(cfg, estimate=True)
    assert info.expert_bytes == int(info.moe_layers * 16 * 3 * 256 * 128 * per_weight)


def test_a_small_model_on_a_big_gpu_is_all_resident():
    p = plan(h200_host(), qwen3_30b(), Request(max_model_len=40960))
    assert p.resident_layers == 48 and p.cache_bytes == 0 and p.gpu_prefill_min_batch == 0
    assert any("every expert fits" in ln for ln in p.lines)


def test_a_24_gb_gpu_gets_the_cache_with_what_the_kv_cache_leaves():
    m = h200_host(gpu=24 * GB)
    model = qwen3_30b()
    p = plan(m, model, Request(max_model_len=40960))
    assert p.resident_layers == 0 and p.kv_sequences == 2
    kv = 2 * 40960 * model.kv_bytes_per_token
    assert p.kv_bytes == kv
    assert 0 < p.cache_bytes <= int(24 * GB * 0.9) - model.other_bytes - p.reserve_bytes - kv
    assert p.cache_bytes % model.slot_bytes == 0
    # a longer requested context leaves less to the cache; more sequences asked for, less again
    shorter = plan(m, model, Request(max_model_len=8192)).cache_bytes
    more = plan(m, model, Request(max_model_len=8192, max_num_seqs=8)).cache_bytes
    assert shorter > p.cache_bytes and more < shorter


def test_host_ram_too_small_moves_layers_to_the_gpu_or_fails_with_the_shortfall():
    model = qwen3_30b()  # 58 GB of bf16 experts
    p = plan(h200_host(gpu=48 * GB, host=48 * GiB), model, Request(max_model_len=8192))
    layer_host = int(model.layer_expert_bytes * ENGINE_OVERHEAD)
    assert 0 < p.resident_layers < 48
    assert p.host_bytes_needed <= 48 * GiB < p.host_bytes_needed + layer_host
    with pytest.raises(FitError, match=r"host RAM: .* short by .*smaller quantization"):
        plan(h200_host(gpu=24 * GB, host=32 * GiB), model, Request(max_model_len=8192))
    # the same host holds the 4-bit checkpoint
    assert plan(h200_host(gpu=24 * GB, host=32 * GiB), qwen3_30b("wna16_int4"), Request(max_model_len=8192))


def test_vram_too_small_for_one_sequence_names_the_context_that_fits():
    with pytest.raises(FitError, match=r"KV cache of one 131072-token sequence .* short by .*--max-model-len \d+"):
        plan(h200_host(gpu=24 * GB), deepseek_v3_fp8(), Request(max_model_len=131072))
    with pytest.raises(FitError, match=r"--max-num-seqs \d+"):
        plan(h200_host(gpu=24 * GB), qwen3_30b(), Request(max_model_len=40960, max_num_seqs=64))


def test_formats_without_slots_keep_whole_layers_instead():
    model = deepseek_v4_flash()
    assert model.slot_bytes == 0
    p = plan(h200_host(gpu=141 * GB, host=256 * GiB), model, Request(max_model_len=32768))
    assert p.cache_bytes == 0 and 0 < p.resident_layers < model.moe_layers
    assert any("no cache slots" in ln for ln in p.lines)


def test_fp4_experts_keep_whole_layers_where_their_bf16_slots_would_hold_too_few():
    # gpt-oss-120b on 24 GB at 128K context: 4.7 GiB left holds 102 bf16 slots of 47.5 MiB (2% of the
    # experts) or 3 whole MXFP4 layers (8% of the reads)
    p = plan(h200_host(gpu=24 * GB), gpt_oss_120b(), Request(max_model_len=131072))
    assert p.cache_bytes == 0 and p.resident_layers == 3
    assert any("whole layers cover" in ln for ln in p.lines)
    # with 141 GB the slots hold every expert's share the layers would: the cache
    big = plan(h200_host(gpu=141 * GB, host=125 * GiB), gpt_oss_120b(), Request(max_model_len=131072))
    assert big.resident_layers == 36 or big.cache_bytes > 0


def test_fp4_and_mxfp8_slots_are_bf16_and_the_native_formats_keep_their_bytes():
    for fmt, in_bf16 in (("mxfp4", True), ("nvfp4", True), ("mxfp8", True), ("fp8_block", False),
                         ("wna16_int4", False), ("bf16", False)):
        expert = int(3 * 2048 * 768 * PARAM_BYTES[fmt])
        got = slot_bytes(fmt, expert, 2048, 768)
        assert got == (3 * 2048 * 768 * 2 if in_bf16 else expert), fmt


def test_explicit_settings_win():
    m = h200_host(gpu=24 * GB)
    explicit = {"resident_layers": 2, "cache_bytes": GiB, "gpu_prefill_min_batch": 4096, "threads": 7}
    p = plan(m, qwen3_30b("fp8_block"), Request(max_model_len=8192, explicit=explicit))
    assert (p.resident_layers, p.cache_bytes, p.gpu_prefill_min_batch, p.threads) == (2, GiB, 4096, 7)
    assert sum("(set" in ln for ln in p.lines) == 4
    with pytest.raises(FitError, match="resident MoE layers need"):
        plan(m, qwen3_30b(), Request(max_model_len=8192, explicit={"resident_layers": 40}))


def test_the_prefill_model_matches_the_h200_hosts_measurements_and_moves_the_right_way():
    model = qwen3_30b()
    m = Machine(gpu_bytes=141 * GB, host_bytes=125 * GiB, cores=16, read_gbps=100.3, h2d_gbps=53, isa="amx")
    # benchmarks/moe_layer.py on that host, 16 threads (docs/results/2026-11-30_h200-xeon16_amx_moe_layer.log)
    for tokens, measured_ms in ((256, 14.668), (1024, 21.640)):
        assert cpu_prefill_seconds(model, m, tokens, 16, 1) * 1e3 == pytest.approx(measured_ms, rel=0.1)
    base = prefill_threshold(model, m, 14, 1)
    assert 256 < base < 4096 and base % 64 == 0
    faster_pcie = Machine(**{**m.__dict__, "h2d_gbps": 106})
    assert prefill_threshold(model, faster_pcie, 14, 1) < base
    assert prefill_threshold(model, m, 30, 1) > base  # more CPU: streaming pays later
    assert stream_seconds(model, m, 2) == pytest.approx(stream_seconds(model, m, 1) / 2)


def test_threads_leave_cores_to_vllm_and_split_between_ranks():
    p1 = plan(h200_host(gpu=24 * GB), qwen3_30b(), Request(max_model_len=8192))
    m2 = Machine(gpu_bytes=24 * GB, host_bytes=125 * GiB, cores=32, read_gbps=90, h2d_gbps=53, isa="amx")
    p2 = plan(m2, qwen3_30b(), Request(max_model_len=8192, tp=2))
    assert 1 <= p1.threads < 16 and p2.threads == p1.threads


def test_bad_requests_are_refused():
    with pytest.raises(ValueError):
        plan(h200_host(), qwen3_30b(), Request(max_model_len=0))
    with pytest.raises(ValueError):
        plan(h200_host(), qwen3_30b(), Request(max_model_len=8192, tp=0))


def test_the_cache_alone_is_planned_when_the_other_settings_are_held():
    """LVLLM_GPU_EXPERT_CACHE=auto without LVLLM_AUTO_FIT: resident layers and the prefill threshold held as set
    (autofit_inputs.plan_at_startup's cache_only); the cache takes the VRAM left, or a line says why it gets none."""
    held = {"resident_layers": 0, "gpu_prefill_min_batch": 1024}
    p = plan(h200_host(gpu=24 * GB), qwen3_30b(), Request(max_model_len=8192, explicit=held))
    assert p.resident_layers == 0 and p.gpu_prefill_min_batch == 1024 and p.cache_bytes > 0
    assert any(ln.startswith("GPU expert cache") for ln in p.lines)
    # a context whose one sequence takes all the VRAM after the weights and the reserve: no cache, and why
    m, model = h200_host(gpu=24 * GB), qwen3_30b()
    room = int(m.gpu_bytes * m.gpu_memory_utilization) - model.other_bytes - RESERVE_BYTES - STAGING_BYTES
    p = plan(m, model, Request(max_model_len=room // model.kv_bytes_per_token, explicit=held))
    assert p.cache_bytes == 0 and p.resident_layers == 0
    assert any(ln.startswith("no GPU expert cache: the ") and "holds no slot of 9.0 MiB" in ln for ln in p.lines), p.lines


def test_the_startup_plan_keeps_what_the_user_set_and_applies_the_rest():
    from lvllm.autofit_inputs import applied, explicit_settings
    from lvllm.config import from_env
    env = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_AUTO_FIT": "1", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "40-47",
           "LK_THREADS": "6"}
    cfg = from_env(env)
    assert cfg.auto_fit
    explicit = explicit_settings(env, cfg)
    assert explicit == {"resident_layers": 8, "threads": 6}
    m = h200_host(gpu=48 * GB)
    p = plan(m, qwen3_30b(), Request(max_model_len=8192, explicit=explicit))
    out = applied(cfg, p, list(range(48)))
    assert out.resident_layers == frozenset(range(40, 48))  # the user's layers, not the first eight
    assert out.gpu_prefill_min_batch == p.gpu_prefill_min_batch > 0
    assert out.expert_cache_gib * GiB == pytest.approx(p.cache_bytes) and p.cache_bytes > 0
    assert not out.expert_cache_auto and p.threads == 6
    # nothing set: the plan's resident layers are the first MoE layers (after DeepSeek's dense ones)
    cfg = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_AUTO_FIT": "1", "LVLLM_GPU_EXPERT_CACHE": "auto"})
    assert explicit_settings({"LVLLM_GPU_EXPERT_CACHE": "auto"}, cfg) == {}
    p = plan(h200_host(gpu=48 * GB, host=48 * GiB), qwen3_30b(), Request(max_model_len=8192))
    out = applied(cfg, p, list(range(3, 51)))
    assert out.resident_layers == frozenset(range(3, 3 + p.resident_layers)) and p.resident_layers > 0
