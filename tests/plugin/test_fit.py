"""lvllm.fit: the KV bytes per token of real model configs; LVLLM_GPU_EXPERT_CACHE=auto's parsing; `lvllm doctor`'s
plan (lvllm.autofit, tests/plugin/test_autofit.py). Pure arithmetic: the expected figures are worked out by hand."""
import pytest

from lvllm.cli.checkpoint_info import CheckpointInfo
from lvllm.config import LvllmConfigError, from_env
from lvllm.fit import kv_bytes_per_token

GiB = 1 << 30
# The published configs' attention fields (Hugging Face config.json of each model).
QWEN3_30B = dict(num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                 hidden_size=2048, moe_intermediate_size=768, num_experts=128, max_position_embeddings=40960)
DEEPSEEK_V3 = dict(num_hidden_layers=61, num_attention_heads=128, kv_lora_rank=512, qk_rope_head_dim=64,
                   hidden_size=7168, n_routed_experts=256, max_position_embeddings=163840)
GPT_OSS_120B = dict(num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                    sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 18,
                    hidden_size=2880, intermediate_size=2880, num_local_experts=128)
QWEN3_NEXT_80B = dict(num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                      full_attention_interval=4, hidden_size=2048)


def test_kv_bytes_per_token_of_real_configs():
    # GQA: K and V, 4 heads of 128, bf16, 48 layers; TP splits the KV heads (8 ranks > 4 heads: one each)
    assert kv_bytes_per_token(QWEN3_30B, 40960) == 2 * 4 * 128 * 2 * 48 == 98304
    assert kv_bytes_per_token(QWEN3_30B, 40960, tp=2) == 98304 // 2
    assert kv_bytes_per_token(QWEN3_30B, 40960, tp=8) == 2 * 1 * 128 * 2 * 48
    assert kv_bytes_per_token(QWEN3_30B, 40960, dtype_bytes=1) == 98304 // 2  # fp8 KV cache
    # MLA: one latent of 512 + 64 per layer, the same on every rank
    assert kv_bytes_per_token(DEEPSEEK_V3, 4096) == (512 + 64) * 2 * 61 == kv_bytes_per_token(DEEPSEEK_V3, 4096, tp=8)
    # gpt-oss: 18 full layers, 18 sliding ones holding 128 tokens (at a 128-token context they count fully)
    per_layer = 2 * 8 * 64 * 2
    assert kv_bytes_per_token(GPT_OSS_120B, 131072) == round((18 + 18 * 128 / 131072) * per_layer)
    assert kv_bytes_per_token(GPT_OSS_120B, 128) == 36 * per_layer
    # Qwen3-Next: one full-attention layer in 4 (the linear-attention ones keep a fixed state)
    assert kv_bytes_per_token(QWEN3_NEXT_80B, 262144) == 12 * 2 * 2 * 256 * 2


def test_lvllm_gpu_expert_cache_auto_is_parsed():
    cfg = from_env({"LVLLM_GPU_EXPERT_CACHE": "auto"})
    assert cfg.expert_cache_auto and cfg.expert_cache_gib == 0
    assert not from_env({"LVLLM_GPU_EXPERT_CACHE": "3"}).expert_cache_auto
    with pytest.raises(LvllmConfigError, match="or auto"):
        from_env({"LVLLM_GPU_EXPERT_CACHE": "lots"})


def test_doctor_prints_the_autofit_plan_and_its_environment(capsys):
    from lvllm.autofit import Machine
    from lvllm.cli.doctor import suggest
    info = CheckpointInfo(path="/m", architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", moe_layers=48,
                          num_layers=48, expert_bytes=54 * GiB, other_bytes=int(3.87 * GiB), config=QWEN3_30B)
    machine = Machine(gpu_bytes=48 * GiB, host_bytes=125 * GiB, cores=16, read_gbps=90, h2d_gbps=53, isa="amx")
    lines = suggest(info, 1, 0, machine=machine)
    text = "\n".join(ln.text for ln in lines)
    assert "context 40960 tokens" in lines[0].text
    assert "KV cache 7.50 GiB reserved: 2 sequences of 40960 tokens" in text
    assert "of 6144 expert slots of 9.0 MiB" in text and "LVLLM_GPU_EXPERT_CACHE=" in text
    assert "LK_THREADS=" in text and "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=" in text
    # a GPU too small for one sequence of the model's context: a FAIL line with the shortfall
    lines = suggest(info, 1, 0, machine=Machine(**{**machine.__dict__, "gpu_bytes": 8 * GiB}))
    assert lines[-1].level == "FAIL" and "short by" in lines[-1].text and "--max-model-len" in lines[-1].text


def test_doctor_says_what_host_ram_is_short_for_a_model_that_does_not_fit(tmp_path, capsys):
    """The issue's failure message, for DeepSeek-V3's 656 GB of FP8 experts on this machine's host RAM."""
    import json

    from lvllm.cli.doctor import main as doctor
    cfg = dict(DEEPSEEK_V3, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
               moe_intermediate_size=2048, num_experts_per_tok=8, first_k_dense_replace=3, vocab_size=129280,
               quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert doctor(["--model", str(tmp_path), "--gpu-gib", "80", "--max-model-len", "8192"]) == 1
    out = capsys.readouterr().out
    fail = next(ln for ln in out.splitlines() if ln.startswith("FAIL  plan"))
    assert "host RAM" in fail and "short by" in fail and "smaller quantization" in fail, fail
    # planned for a host with 1 TiB free instead (--host-gib): it fits, with the first MoE layers' indices
    assert doctor(["--model", str(tmp_path), "--gpu-gib", "80", "--host-gib", "1024", "--max-model-len", "8192"]) in (0, 1)
    out = capsys.readouterr().out
    assert not any(ln.startswith("FAIL  plan") or ln.startswith("FAIL  host RAM") for ln in out.splitlines()), out
    assert "host RAM available 1024 GiB" in out and "LVLLM_GPU_EXPERT_CACHE=" in out
