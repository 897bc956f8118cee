"""Kimi-K3's generated config (lvllm.testing.kimi_k3) as vLLM 0.33.0's own config class reads it, and as lvllm's
readers (doctor, auto-fit, the benchmarks) count it: latent MoE experts, SituGLU (the model builds on CUDA only)."""
import json

import pytest

from lvllm.autofit_inputs import describe_model
from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, read_checkpoint
from lvllm.testing.kimi_k3 import IMAGE_PLACEHOLDER, SHAPES
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    return make_checkpoint("kimi_k3", str(tmp_path_factory.mktemp("k3") / "ckpt"))


def test_vllm_config_class_reads_it(k3):
    from vllm.transformers_utils.configs.kimi_k3 import KimiK3Config

    with open(f"{k3}/config.json") as f:
        raw = json.load(f)
    cfg = KimiK3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    text, s = cfg.text_config, SHAPES["tiny"]
    assert raw["architectures"] == ["KimiK3ForConditionalGeneration"]
    assert text.is_moe and text.is_linear_attn and text.is_mla
    assert [text.is_kda_layer(i) for i in range(s["L"])] == [True, True, True, False]  # MLA every fourth layer
    assert (text.num_experts, text.num_experts_per_token, text.routed_expert_hidden_size) == (s["E"], s["K"], s["latent"])
    assert text.hidden_act == "situ" and text.activation_situ_beta == s["situ_beta"]
    assert cfg.vision_config.text_hidden_size == s["H"]
    tok = transformers.AutoTokenizer.from_pretrained(k3)
    assert tok.convert_tokens_to_ids(IMAGE_PLACEHOLDER) == raw["media_placeholder_token_id"]


def test_readers_count_latent_experts(k3):
    info = read_checkpoint(k3)
    s = SHAPES["tiny"]
    assert info.architecture == "KimiK3ForConditionalGeneration" and info.moe_layers == s["L"] - 1  # dense first
    assert expert_shape(info.config) == (s["E"], s["latent"], s["I"])  # the experts see the latent width
    assert experts_per_token(info.config) == s["K"]
    assert info.expert_bytes == (s["L"] - 1) * s["E"] * 3 * s["latent"] * s["I"] * 2
    model = describe_model(info, tp=1, max_model_len=4096)
    assert model.top_k == s["K"] and model.slot_bytes == 0  # the GPU expert cache computes no situ


def test_big_is_the_release_shape_in_compressed_tensors_mxfp4(tmp_path):
    """The big config: the shapes vLLM's own Kimi-K3 kernels are written for, MXFP4 experts as compressed-tensors
    (what vLLM 0.33 reads with CompressedTensorsW4A4Mxfp4MoEMethod); the readers price them at 17/32 B a weight."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.models.kimi_k3.amd.specialized_decode.runtime import K3_SHAPES, text_shapes
    from vllm.transformers_utils.configs.kimi_k3 import KimiK3Config

    path = make_checkpoint("kimi_k3", str(tmp_path / "big"), size="big", layers=6, quant="mxfp4_ct")
    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    text = KimiK3Config(**{k: v for k, v in raw.items() if k != "model_type"}).text_config
    assert text_shapes(text) == K3_SHAPES  # vLLM's own statement of Kimi-K3's text shapes
    assert (text.num_experts_per_token, text.routed_expert_hidden_size) == (16, 3584)
    assert text.activation_situ_linear_beta == 25.0
    ct = CompressedTensorsConfig.from_config(raw["quantization_config"])
    scheme = next(iter(ct.target_scheme_map.values()))
    assert ct._is_mxfp4(scheme["weights"])  # -> CompressedTensorsW4A4Mxfp4MoEMethod for the routed experts
    info = read_checkpoint(path)
    assert info.quant_method == "compressed-tensors/mxfp4" and info.moe_layers == 5
    assert info.expert_bytes == int(5 * 896 * 3 * 3584 * 3072 * 17 / 32)  # 15.7 GB a layer
    model = describe_model(info, tp=1, max_model_len=4096)
    assert model.top_k == 16 and model.fmt == "mxfp4"
