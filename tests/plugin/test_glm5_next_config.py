"""GLM-5.3's generated config (lvllm.testing.glm5_next) as transformers' Glm5NextTextConfig (vLLM 0.33.0's) and vLLM's
registry read it, and as lvllm's readers count it: MoE layers from mlp_layer_types, silu experts clamped at
swiglu_limit (the engine's silu_clamp; the model builds on CUDA only)."""
import json

import pytest

from lvllm.autofit_inputs import describe_model
from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, read_checkpoint
from lvllm.testing.glm5_next import SHAPES
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")


@pytest.fixture(scope="module", params=["tiny", "big"])
def glm(request, tmp_path_factory):
    return request.param, make_checkpoint("glm5_next", str(tmp_path_factory.mktemp("glm") / "ckpt"), size=request.param)


def test_vllm_reads_it_as_glm5_next(glm):
    size, path = glm
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from vllm.config import ModelConfig

    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    cfg = Glm5NextTextConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    s = SHAPES[size]
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (s["E"], s["K"], s["I"])
    assert (cfg.hidden_act, cfg.swiglu_limit) == ("silu", 10.0)
    assert cfg.layer_types[3] == "indexed_attention" and cfg.layer_types[0] == "linear_attention"
    mc = ModelConfig(model=path, skip_tokenizer_init=True)  # vLLM's registry resolves the architecture
    assert mc.architectures == ["Glm5NextForCausalLM"] and mc.hf_text_config.n_routed_experts == s["E"]


def test_readers_count_its_moe_layers(glm):
    size, path = glm
    info = read_checkpoint(path)
    s = SHAPES[size]
    assert info.architecture == "Glm5NextForCausalLM" and info.moe_layers == s["L"] - s["dense"]
    assert expert_shape(info.config) == (s["E"], s["H"], s["I"]) and experts_per_token(info.config) == s["K"]
    assert info.expert_bytes == (s["L"] - s["dense"]) * s["E"] * 3 * s["H"] * s["I"] * 2  # bf16
    assert describe_model(info, tp=1, max_model_len=4096).top_k == s["K"]
