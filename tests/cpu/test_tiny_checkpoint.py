"""The tiny checkpoints are real ones: transformers loads every architecture with no missing or
unexpected weights (where transformers is installed: CI has it with vLLM), and the quantized
layouts decode back to the weights they encode."""
import json

import pytest
import torch

from lvllm.tiny_checkpoint import ARCHS, decode_mxfp4, make_checkpoint, quantize_mxfp4

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "gpt_oss"])
def test_transformers_loads_every_weight(tmp_path, arch):
    path = make_checkpoint(arch, str(tmp_path / arch))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                                    dtype=torch.bfloat16)
    assert not any(info.values()), info
    logits = model(torch.tensor([list(range(3, 40))])).logits
    assert torch.isfinite(logits).all() and 1.0 < logits.float().std() < 10.0
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert len(ids if isinstance(ids, list) else ids["input_ids"]) > 3


def test_gpt_oss_mxfp4_matches_transformers(tmp_path):
    pytest.importorskip("accelerate")
    from safetensors.torch import load_file
    path = make_checkpoint("gpt_oss", str(tmp_path / "gpt_oss"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    t = load_file(f"{path}/model.safetensors")
    b, sc = t["model.layers.0.mlp.experts.gate_up_proj_blocks"], t["model.layers.0.mlp.experts.gate_up_proj_scales"]
    ours = decode_mxfp4(b, sc)
    theirs = model.model.layers[0].mlp.experts.gate_up_proj.float().transpose(1, 2)  # HF keeps [E, H, 2I]
    assert torch.equal(ours, theirs)


def test_mxfp4_encoder_round_trip():
    w = torch.randn(4, 128) * 3
    b, sc = quantize_mxfp4(w)
    deq = decode_mxfp4(b, sc)
    # e2m1 has 1 mantissa bit: nearest rounding is within 1/4 of the group's largest value
    assert ((deq - w).abs() <= w.abs().reshape(4, 4, 32).amax(-1).repeat_interleave(32, 1) / 4 + 1e-6).all()


def test_quantized_variants_declare_their_format(tmp_path):
    fp8 = json.load(open(make_checkpoint("qwen3_moe", str(tmp_path / "f"), quant="fp8") + "/config.json"))
    assert fp8["quantization_config"]["weight_block_size"] == [128, 128]
    w4 = json.load(open(make_checkpoint("deepseek_v3", str(tmp_path / "w"), quant="w4a16") + "/config.json"))
    assert w4["quantization_config"]["format"] == "pack-quantized"
    with pytest.raises(ValueError, match="MXFP4"):
        make_checkpoint("gpt_oss", str(tmp_path / "g"), quant="fp8")
