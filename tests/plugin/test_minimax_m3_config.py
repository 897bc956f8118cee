"""MiniMax-M3's generated config (lvllm.testing.minimax_m3) as vLLM 0.33.0's own config class and model registry read
it, and as lvllm's readers (doctor, auto-fit, the benchmarks) count it: MoE layers from moe_layer_freq, swigluoai
experts on [gate; up] rows (the model builds on CUDA only)."""
import json

import pytest

from lvllm.autofit_inputs import describe_model
from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, read_checkpoint
from lvllm.testing.minimax_m3 import SHAPES
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")


@pytest.fixture(scope="module", params=["tiny", "big"])
def m3(request, tmp_path_factory):
    return request.param, make_checkpoint("minimax_m3", str(tmp_path_factory.mktemp("m3") / "ckpt"), size=request.param)


def test_vllm_reads_it_as_minimax_m3(m3):
    size, path = m3
    from vllm.config import ModelConfig
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3Config

    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    cfg = MiniMaxM3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    text, s = cfg.text_config, SHAPES[size]
    assert (text.num_local_experts, text.num_experts_per_tok, text.intermediate_size) == (s["E"], s["K"], s["I"])
    assert (text.hidden_act, text.swiglu_alpha, text.swiglu_beta, text.swiglu_limit) == ("swigluoai", 1.702, 1.0, 7.0)
    assert list(text.moe_layer_freq) == [0] * s["dense"] + [1] * (s["L"] - s["dense"])
    mc = ModelConfig(model=path, skip_tokenizer_init=True)  # vLLM's registry resolves the text-only architecture
    assert mc.architectures == ["MiniMaxM3SparseForCausalLM"] and mc.hf_text_config.num_local_experts == s["E"]


def test_readers_count_its_moe_layers(m3):
    size, path = m3
    info = read_checkpoint(path)
    s = SHAPES[size]
    assert info.architecture == "MiniMaxM3SparseForCausalLM" and info.moe_layers == s["L"] - s["dense"]
    assert expert_shape(info.config) == (s["E"], s["H"], s["I"]) and experts_per_token(info.config) == s["K"]
    assert info.expert_bytes == (s["L"] - s["dense"]) * s["E"] * 3 * s["H"] * s["I"] * 2  # bf16
    model = describe_model(info, tp=1, max_model_len=4096)
    assert model.top_k == s["K"] and model.slot_bytes > 0  # swigluoai: the GPU expert cache can hold its experts
