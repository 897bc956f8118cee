"""The block-FP8 releases' shapes as configs over dummy weights (make_checkpoint(arch, size="big", quant="fp8"): Qwen3-Next,
Qwen3.5, MiniMax-M2, GLM-5.3), read the way vLLM 0.33.0's own Fp8Config and layer-skip rule read a release's config, and priced
by lvllm's readers at one byte a weight. Their models build on CUDA only with FP8 projections: the GPU benchmark
(benchmarks/e2e_decode.py --size big --quant fp8) runs them."""
import importlib
import json

import pytest

from lvllm.cli.checkpoint_info import read_checkpoint
from lvllm.testing.tiny_checkpoint import FP8_RELEASES, SHAPES, make_checkpoint

pytest.importorskip("vllm")

LAYERS = 8
# vLLM's model class of each family: its packed_modules_mapping is what the layer-skip rule fuses by
MODEL_CLASS = {"qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM"), "qwen3_5_moe": ("qwen3_5", "Qwen3_5MoeForCausalLM"),
               "minimax_m2": ("minimax_m2", "MiniMaxM2ForCausalLM")}


def _quantized_widths(arch: str, s: dict) -> list:
    """Input and output widths of the projections the config leaves in FP8 (attention, GDN, shared and routed experts)."""
    widths = [s["H"], s["I"], s["nh"] * s["hd"], s["nkv"] * s["hd"]]
    if arch != "minimax_m2":
        widths += [s["shared_I"], 2 * s["nh"] * s["hd"],  # the gated attention's q_proj: query and gate
                   2 * s["lin_nk"] * s["lin_dk"], s["lin_nv"] * s["lin_dv"]]
    return widths


@pytest.mark.parametrize("arch", [a for a in FP8_RELEASES if a in MODEL_CLASS])
def test_big_fp8_config_reads_as_vllm_reads_the_release(tmp_path, arch):
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

    path = make_checkpoint(arch, str(tmp_path / arch), size="big", layers=LAYERS, quant="fp8")
    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    qc = Fp8Config.from_config(raw["quantization_config"])
    assert qc.is_checkpoint_fp8_serialized and qc.weight_block_size == [128, 128]
    module, name = MODEL_CLASS[arch]
    fused = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name).packed_modules_mapping
    linear = {i for i, t in enumerate(raw.get("layer_types") or ()) if t == "linear_attention"}
    assert (len(linear) == LAYERS * 3 // 4) == (arch != "minimax_m2")  # GDN in 3 of every 4 layers
    for i in range(LAYERS):
        ba = f"model.layers.{i}.linear_attn.in_proj_ba"
        assert is_layer_skipped(ba, qc.ignored_layers, fused) == (i in linear)
        assert not is_layer_skipped(f"model.layers.{i}.linear_attn.in_proj_qkvz", qc.ignored_layers, fused)
        assert not is_layer_skipped(f"model.layers.{i}.self_attn.qkv_proj", qc.ignored_layers, fused)
    s = SHAPES[arch]["big"]
    assert all(w % 128 == 0 for w in _quantized_widths(arch, s))  # whole 128 x 128 blocks
    if linear:
        assert 2 * s["lin_nv"] % 128 != 0  # in_proj_ba's outputs: why the releases leave it unquantized
    info = read_checkpoint(path)
    assert info.quant_method == "fp8" and info.moe_layers == LAYERS
    assert info.expert_bytes == LAYERS * s["E"] * 3 * s["H"] * s["I"]  # one byte a weight (the scales aside)


def test_glm5_3_big_fp8_config_quantizes_whole_blocks(tmp_path):
    """GLM-5.3-Flash's block-FP8 release as a config: vLLM's Fp8Config reads it with nothing skipped (vLLM's GLM-5.3
    model builds the KDA and MLA projections unquantized itself); what it quantizes (experts, shared expert, dense MLPs)
    has whole 128 x 128 blocks; the experts priced at one byte a weight. (vLLM's GLM-5.3 builds on CUDA only.)"""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from lvllm.testing import glm5_next
    path = make_checkpoint("glm5_next", str(tmp_path / "glm"), size="big", layers=LAYERS, quant="fp8")
    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    qc = Fp8Config.from_config(raw["quantization_config"])
    assert qc.is_checkpoint_fp8_serialized and qc.weight_block_size == [128, 128] and not qc.ignored_layers
    s = glm5_next.SHAPES["big"]
    assert all(w % 128 == 0 for w in (s["H"], s["I"], s["dense_I"]))
    info = read_checkpoint(path)
    assert info.quant_method == "fp8" and info.moe_layers == LAYERS - s["dense"]
    assert info.expert_bytes == (LAYERS - s["dense"]) * s["E"] * 3 * s["H"] * s["I"]


def test_fp8_is_written_big_only_for_the_fp8_releases(tmp_path):
    with pytest.raises(ValueError, match="block fp8"):
        make_checkpoint("qwen4_exp", str(tmp_path / "q"), size="big", quant="fp8")
