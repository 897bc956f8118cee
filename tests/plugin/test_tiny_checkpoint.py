"""The tiny checkpoints are real ones: transformers loads every architecture with no missing or
unexpected weights (where transformers is installed: CI has it with vLLM), and the quantized
layouts decode back to the weights they encode."""
import json

import pytest
import torch

from lk_moe.reference import dequantize_nvfp4, dequantize_per_channel
from lvllm.testing.checkpoint_quant import _w8a8_channel_config, decode_mxfp4, decode_projection, write_dequantized_twin
from lvllm.testing.quantizers import quantize_mxfp4, quantize_nvfp4, quantize_w8a8_channel
from lvllm.testing.tiny_checkpoint import ARCHS, CONFIG_ONLY, LANGUAGE_MODEL_ONLY, VL_TEXT, make_checkpoint

from ..engine.conftest import vllm_dequantize_nvfp4

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


# Checkpoints transformers cannot load as written: its MiniMax-M3 text model (MiniMaxM3VLForCausalLM) holds other
# names than vLLM's MiniMaxM3SparseForCausalLM checkpoint: the e2e oracle renames them (tests/e2e_harness/test_oracle.py
# checks every tensor is placed); transformers has no Kimi-K3 and no DeepSeek-V4.1: vLLM's own loader places every
# tensor of their checkpoints (test_plugin_loads_checkpoints.py)
TRANSFORMERS_CANNOT_LOAD = ("gpt_oss", "minimax_m3", "kimi_k3", "deepseek_v41")


@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in TRANSFORMERS_CANNOT_LOAD and a not in CONFIG_ONLY])
def test_transformers_loads_every_weight(tmp_path, arch):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    path = make_checkpoint(arch, str(tmp_path / arch))
    ids = torch.tensor([list(range(3, 40))])
    model_type = transformers.AutoConfig.from_pretrained(path).model_type
    vl = arch in VL_TEXT or arch in LANGUAGE_MODEL_ONLY
    if not vl and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        # GLM-5.3: transformers has its text model without a causal-LM head; the checkpoint's lm_head over it
        from safetensors.torch import load_file
        model, info = transformers.AutoModel.from_pretrained(path, output_loading_info=True, dtype=torch.bfloat16)
        assert info.pop("unexpected_keys") == {"lm_head.weight"} and not any(info.values()), info
        logits = model(ids).last_hidden_state @ load_file(f"{path}/model.safetensors")["lm_head.weight"].T
    else:
        auto = transformers.AutoModelForImageTextToText if vl else transformers.AutoModelForCausalLM
        model, info = auto.from_pretrained(path, output_loading_info=True, dtype=torch.bfloat16)
        if arch in LANGUAGE_MODEL_ONLY:  # a release written without its vision tower's weights (GLM-5.3-Flash's)
            tower = {k for k in info["missing_keys"] if k.startswith("model.visual.")}
            assert tower and tower == set(info.pop("missing_keys")), info
        assert not any(info.values()), info
        logits = model(ids).logits
    assert torch.isfinite(logits).all() and 1.0 < logits.float().std() < 10.0
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert len(ids if isinstance(ids, list) else ids["input_ids"]) > 3


# arch -> (the image placeholder as the release's chat template writes it, image height x width, patch side):
# either way 4 x 6 patches merged 2 x 2 -> 6 image tokens in the prompt
VL_PROMPTS = {"qwen3_5_moe_vl": ("<|vision_start|><|image_pad|><|vision_end|>", (64, 96)),
              "kimi_k25": ("<|media_begin|>image<|media_content|><|media_pad|><|media_end|>", (56, 84))}


@pytest.mark.parametrize("arch", list(VL_TEXT))
def test_vision_language_checkpoint_takes_an_image(tmp_path, arch):
    """The released layout of a vision-language MoE: transformers' own processor (from the checkpoint's
    processor files and tokenizer) turns a prompt and an image into the model's inputs, and the model
    (vision tower + text model) runs them."""
    pytest.importorskip("PIL")
    import numpy as np
    from PIL import Image
    path = make_checkpoint(arch, str(tmp_path / arch))
    proc = transformers.AutoProcessor.from_pretrained(path)
    cfg = json.load(open(f"{path}/config.json"))
    assert proc.image_token_id == cfg["image_token_id"]
    placeholder, (h, w) = VL_PROMPTS[arch]
    image = Image.fromarray((np.random.default_rng(0).random((h, w, 3)) * 255).astype(np.uint8))
    text = f"<|im_start|>user\n{placeholder}what is it<|im_end|>\n<|im_start|>assistant\n"
    inputs = proc(text=[text], images=[image], return_tensors="pt")
    assert int((inputs["input_ids"] == cfg["image_token_id"]).sum()) == 6
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    logits = model(**inputs).logits
    assert torch.isfinite(logits).all() and 1.0 < logits.float().std() < 10.0


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
    with pytest.raises(ValueError, match="as mxfp4 .*, fp8 .* or nvfp4"):
        make_checkpoint("deepseek_v4", str(tmp_path / "d"), quant="w4a16")
    base = json.load(open(make_checkpoint("deepseek_v4", str(tmp_path / "vb"), size="big", quant="fp8")
                          + "/config.json"))
    assert base["expert_dtype"] == "fp8" and base["quantization_config"]["weight_block_size"] == [128, 128]
    nv = json.load(open(make_checkpoint("qwen3_moe", str(tmp_path / "n"), quant="nvfp4") + "/config.json"))
    qc = nv["quantization_config"]
    assert (qc["quant_method"], qc["quant_algo"], qc["group_size"]) == ("modelopt", "NVFP4", 16)


def test_nvfp4_encoder_round_trip():
    w = torch.randn(8, 64) * 3
    q, sf, gs = quantize_nvfp4(w)
    assert (q.dtype, sf.dtype, gs.dtype, tuple(q.shape), tuple(sf.shape), gs.dim()) == \
        (torch.uint8, torch.float8_e4m3fn, torch.float32, (8, 32), (8, 4), 0)
    assert torch.isclose(gs, w.abs().max() / (6 * 448))  # ModelOpt: amax / (6 * 448), not the reciprocal
    deq = dequantize_nvfp4(q, sf, gs)
    # e2m1 spacing near a group's largest value is 1/6 of it (4 -> 6), the fp8 scale adds 2^-4: within 1/4
    assert ((deq - w).abs() <= w.abs().reshape(8, 4, 16).amax(-1).repeat_interleave(16, 1) / 4 + 1e-6).all()


def test_nvfp4_checkpoint_as_vllm_reads_it(tmp_path):
    """ModelOpt names and dtypes per expert projection; vLLM 0.33's ModelOpt config parses the
    quantization_config (NVFP4, group 16, the bf16 modules excluded) and its own NVFP4 decoder agrees
    with dequantize_nvfp4."""
    from safetensors.torch import load_file
    path = make_checkpoint("qwen3_moe", str(tmp_path / "n"), quant="nvfp4", experts_only=True)
    t = load_file(f"{path}/model.safetensors")
    p = "model.layers.1.mlp.experts.3.up_proj."
    assert (t[p + "weight"].dtype, t[p + "weight_scale"].dtype) == (torch.uint8, torch.float8_e4m3fn)
    assert t[p + "weight_scale_2"].shape == () and t[p + "input_scale"].shape == ()
    assert t["model.layers.1.self_attn.q_proj.weight"].dtype == torch.bfloat16
    modelopt = pytest.importorskip("vllm.model_executor.layers.quantization.modelopt")
    cfg = modelopt.ModelOptNvFp4Config.from_config(json.load(open(f"{path}/config.json"))["quantization_config"])
    assert cfg.quant_method == "NVFP4" and cfg.group_size == 16 and cfg.is_checkpoint_nvfp4_serialized
    assert cfg.is_layer_excluded("model.layers.1.self_attn.q_proj") and not cfg.is_layer_excluded("model.layers.1.mlp.experts")
    theirs = vllm_dequantize_nvfp4(t[p + "weight"], t[p + "weight_scale"], t[p + "weight_scale_2"])
    ours = dequantize_nvfp4(t[p + "weight"], t[p + "weight_scale"], t[p + "weight_scale_2"])
    # vLLM multiplies code * (scale * global): the same value up to the order of two fp32 roundings
    torch.testing.assert_close(theirs, ours, rtol=2.5e-7, atol=0)


@pytest.mark.parametrize("quant", ["fp8_channel", "int8_channel"])
def test_w8a8_channel_encoder_round_trip(quant):
    """Codes and bf16 per-row scales decode to the weights within one rounding of the code: int8 half a
    step (scale / 2); e4m3 (3 mantissa bits) 2^-4 relative, 2^-10 of the scale at the subnormals. The
    decoder agrees exactly with compressed-tensors' own dequantize for the scheme the config declares."""
    w = torch.randn(16, 256) * torch.logspace(-3, 1, 16)[:, None]  # rows of very different ranges
    q, scale = quantize_w8a8_channel(w, quant)
    want_dtype = torch.float8_e4m3fn if quant == "fp8_channel" else torch.int8
    assert (q.dtype, scale.dtype, tuple(q.shape), tuple(scale.shape)) == (want_dtype, torch.bfloat16, (16, 256), (16, 1))
    deq = dequantize_per_channel(q[None], scale[None])[0]
    s = scale.float()
    if quant == "int8_channel":
        bound = s / 2 + 1e-7 * w.abs()
        assert q.abs().max() == 127 or (w.abs().amax(1, keepdim=True) / s).max() < 127.5
    else:
        bound = torch.maximum(w.abs() * 2 ** -4, s * 2 ** -10) * (1 + 1e-6)
    # the bf16 scale may round a row's amax just past the largest code: that element clamps (bf16: 2^-8)
    bound = bound + (w.abs() - q.float().abs().amax(1, keepdim=True) * s).clamp(min=0)
    assert ((deq - w).abs() <= bound).all()
    ct_forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    from compressed_tensors.quantization import QuantizationArgs
    args = QuantizationArgs(**_w8a8_channel_config({}, quant)["config_groups"]["group_0"]["weights"])
    theirs = ct_forward.dequantize(q, s, args=args, dtype=torch.float32)
    assert torch.equal(theirs, deq)


@pytest.mark.parametrize("quant,moe_scheme", [("fp8_channel", "_is_fp8_w8a8"), ("int8_channel", "_is_dynamic_token_w8a8")])
def test_w8a8_channel_checkpoint_as_vllm_reads_it(tmp_path, quant, moe_scheme):
    """compressed-tensors names, dtypes and shapes per expert projection (weight [N, K] in fp8/int8,
    weight_scale [N, 1] bf16, no input scales: dynamic per token); vLLM 0.33's compressed-tensors config
    parses the quantization_config, ignores the bf16 Linears, and finds the experts' scheme to be the one
    its MoE dispatcher turns into CompressedTensorsW8A8Fp8MoEMethod / CompressedTensorsW8A8Int8MoEMethod
    (tests/plugin/test_plugin_loads_checkpoints.py builds the methods through vLLM's loader)."""
    from safetensors.torch import load_file
    path = make_checkpoint("qwen3_moe", str(tmp_path / "c"), quant=quant, experts_only=True)
    t = load_file(f"{path}/model.safetensors")
    p = "model.layers.1.mlp.experts.3.down_proj."
    want_dtype = torch.float8_e4m3fn if quant == "fp8_channel" else torch.int8
    assert (t[p + "weight"].dtype, tuple(t[p + "weight"].shape)) == (want_dtype, (512, 256))
    assert (t[p + "weight_scale"].dtype, tuple(t[p + "weight_scale"].shape)) == (torch.bfloat16, (512, 1))
    assert not any(n.endswith(("input_scale", "zero_point")) for n in t)
    assert t["model.layers.1.self_attn.q_proj.weight"].dtype == torch.bfloat16
    qc = json.load(open(f"{path}/config.json"))["quantization_config"]
    assert "model.layers.1.mlp.gate" in qc["ignore"] and "lm_head" in qc["ignore"]
    ct = pytest.importorskip("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors")
    cfg = ct.CompressedTensorsConfig.from_config(qc)
    scheme = cfg.target_scheme_map["Linear"]
    assert getattr(cfg, moe_scheme)(scheme["weights"], scheme["input_activations"])
    assert not cfg._is_wNa16_group_channel(scheme["weights"], scheme["input_activations"])
    if quant == "int8_channel":  # the FP8 branch comes first in the dispatcher: int8 must not match it
        assert not cfg._is_fp8_w8a8(scheme["weights"], scheme["input_activations"])
    assert cfg.get_scheme_dict(torch.nn.Linear(1, 1), "model.layers.1.self_attn.q_proj") is None
    # vLLM's MoE dispatcher asks for "<experts>.0.gate_proj" etc. with the RoutedExperts module, which the
    # "Linear" target reaches through the alias it adds (_add_fused_moe_to_target_scheme_map).
    cfg._add_fused_moe_to_target_scheme_map()
    experts = type("RoutedExperts", (torch.nn.Module,), {})()
    assert cfg.get_scheme_dict(experts, "model.layers.1.mlp.experts.0.up_proj")["weights"] == scheme["weights"]


@pytest.mark.parametrize("quant", ["fp8", "w4a16", "nvfp4", "fp8_channel", "int8_channel", "mxfp8"])
def test_dequantized_twin_holds_the_decoded_experts(tmp_path, quant):
    """The e2e reference for quantized experts: a bf16 checkpoint whose experts are the decoded
    quantized ones (bf16-rounded), everything else unchanged, loadable as a plain bf16 model."""
    import torch
    from safetensors.torch import load_file

    src = make_checkpoint("qwen3_moe", str(tmp_path / "q"), quant=quant, experts_only=True)
    twin = write_dequantized_twin(src, str(tmp_path / "twin"))
    q, t = load_file(f"{src}/model.safetensors"), load_file(f"{twin}/model.safetensors")
    assert "quantization_config" not in json.load(open(f"{twin}/config.json"))
    base = "model.layers.0.mlp.experts.3.down_proj."
    assert t[base + "weight"].dtype == torch.bfloat16
    assert torch.equal(t[base + "weight"], decode_projection(q, base).to(torch.bfloat16))
    assert not any(n.endswith(("_scale", "_scale_inv", "_packed", "_scale_2")) for n in t)
    assert torch.equal(t["model.layers.0.self_attn.q_proj.weight"], q["model.layers.0.self_attn.q_proj.weight"])
    model, info = transformers.AutoModelForCausalLM.from_pretrained(twin, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_twin_refuses_quantized_non_expert_projections(tmp_path):
    src = make_checkpoint("qwen3_moe", str(tmp_path / "q"), quant="fp8")  # attention FP8 too
    with pytest.raises(ValueError, match="outside the routed experts"):
        write_dequantized_twin(src, str(tmp_path / "twin"))


# DeepSeek-V4's expert formats (lvllm.testing.deepseek_v4.RELEASE_FORMATS): the code and "scale" dtypes, the
# config's expert_dtype and moe_quant_algo, and how far a decoded weight may sit from the bf16 one it was made from
# (w, its block's largest |value| spread over the block): MXFP4 / NVFP4 round to the nearest e2m1 code (within a
# quarter of the group's largest value; NVFP4's fp8 block scale may round down, and its codes saturate at 6), FP8 to
# the nearest e4m3 (2^-4 relative, and the subnormal step 2^-9 of the block's scale amax / 448).
V4_FORMATS = {
    "mxfp4": (torch.int8, torch.float8_e8m0fnu, "fp4", None, 32, lambda w, amax: amax / 4),
    "nvfp4": (torch.uint8, torch.float8_e4m3fn, "fp4", "NVFP4", 16, lambda w, amax: amax / 4),
    "fp8": (torch.float8_e4m3fn, torch.float32, "fp8", None, 128, lambda w, amax: w.abs() / 16 + amax / 448 / 512),
}


@pytest.mark.parametrize("quant", list(V4_FORMATS))
def test_deepseek_v4_experts_decode_and_twin(tmp_path, quant):
    """DeepSeek-V4's layouts of its experts under the release's names (codes in "weight", block scales in "scale"):
    each projection decodes to within its format's rounding of the bf16 weight it was made from, the config selects
    the format as vLLM's V4 quantization config reads it, and the bf16 twin holds the decoded experts, no scales, no
    quantization config, loadable by transformers."""
    from safetensors.torch import load_file
    code_dtype, scale_dtype, expert_dtype, algo, block, bound = V4_FORMATS[quant]
    src = make_checkpoint("deepseek_v4", str(tmp_path / "q"), quant=quant)
    ref = load_file(f"{make_checkpoint('deepseek_v4', str(tmp_path / 'b'))}/model.safetensors")
    q = load_file(f"{src}/model.safetensors")
    cfg = json.load(open(f"{src}/config.json"))
    qc = cfg["quantization_config"]
    assert cfg["expert_dtype"] == expert_dtype and qc.get("moe_quant_algo") == algo
    assert "layers.2.attn.fused_wqa_wkv" in qc["ignored_layers"]
    base = "layers.1.ffn.experts.5.w2."
    assert q[base + "weight"].dtype == code_dtype and q[base + "scale"].dtype == scale_dtype
    w = ref[base + "weight"].float()
    decoded = decode_projection(q, base)
    if quant == "fp8":  # 128 x 128 blocks: the tiny w2 [256, 128] has two, one per 128 rows
        amax = w.abs().reshape(-1, 128, w.shape[1]).amax(dim=(1, 2)).repeat_interleave(128)[:, None]
    else:
        amax = w.abs().reshape(w.shape[0], -1, block).amax(-1).repeat_interleave(block, 1)
    assert ((decoded - w).abs() <= bound(w, amax) + 1e-6).all()
    twin = write_dequantized_twin(src, str(tmp_path / "twin"))
    t = load_file(f"{twin}/model.safetensors")
    assert torch.equal(t[base + "weight"], decoded.to(torch.bfloat16))
    assert not any(n.endswith((".scale", "_scale_2", "input_scale")) for n in t)
    twin_cfg = json.load(open(f"{twin}/config.json"))
    assert "quantization_config" not in twin_cfg and "expert_dtype" not in twin_cfg
    model, info = transformers.AutoModelForCausalLM.from_pretrained(twin, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


# family -> (where its MTP layer's decoder block lives, a decoder layer of the target's its block is shaped like,
# where the tensors only an MTP layer has live, and those); every tiny checkpoint has 4 decoder layers, the last MoE
_DEEPSEEK_MTP = ("eh_proj", "enorm", "hnorm", "shared_head.norm", "shared_head.head", "embed_tokens")
_QWEN_MTP = ("fc", "norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden")
MTP_LAYOUTS = {
    "deepseek_v3": ("model.layers.4.", "model.layers.3.", "model.layers.4.", _DEEPSEEK_MTP),
    "glm4_moe": ("model.layers.4.", "model.layers.3.", "model.layers.4.", _DEEPSEEK_MTP),
    "glm_moe_dsa": ("model.layers.4.", "model.layers.3.", "model.layers.4.", _DEEPSEEK_MTP),
    # V4's block: layer 0's names (sliding-window attention: no compressor)
    "deepseek_v4": ("mtp.0.", "layers.0.", "mtp.0.", ("e_proj", "h_proj", "enorm", "hnorm", "norm", "hc_head_fn",
                                                      "hc_head_base", "hc_head_scale")),
    # Qwen's block: a full-attention layer, as the target's layer 3 (every 4th)
    "qwen3_next": ("mtp.layers.0.", "model.layers.3.", "mtp.", _QWEN_MTP),
    "qwen3_5_moe": ("mtp.layers.0.", "model.layers.3.", "mtp.", _QWEN_MTP),
    # Qwen3.8-Flash-Next's: a sparse-attention layer as the target's layer 3, with its own hyper-connection mixer
    "qwen4_exp": ("mtp.layers.0.", "model.layers.3.", "mtp.",
                  ("fc_embedding", "fc_hidden", "pre_fc_norm_embedding", "pre_fc_norm_hidden",
                   "hyper_connection_mixer.hc_norm", "hyper_connection_mixer.input_mix_weight_down",
                   "hyper_connection_mixer.input_mix_weight_up")),
    # GLM-5.3's: the target's sparse MLA layer 3 without its mHC mixers (hc_*), DeepSeek-V3's MTP-only tensors but the
    # head (the target's lm_head) and the embedding (the target's)
    "glm5_next": ("model.layers.4.", "model.layers.3.", "model.layers.4.", ("enorm", "hnorm", "eh_proj",
                                                                            "shared_head.norm")),
    # ... and as released, under model.language_model. (vLLM's MTP loader strips the prefix)
    "glm5_next_vl": ("model.language_model.layers.4.", "model.language_model.layers.3.", "model.language_model.layers.4.",
                     ("enorm", "hnorm", "eh_proj", "shared_head.norm")),
    # MiniMax-M3's module: a block-sparse attention MoE layer (the target's layer 1 on) under transformer_layer
    "minimax_m3": ("language_model.model.mtp.layers.0.transformer_layer.", "language_model.model.layers.1.",
                   "language_model.model.mtp.layers.0.",
                   ("enorm", "hnorm", "eh_proj", "final_layernorm")),
}


@pytest.mark.parametrize("arch", list(MTP_LAYOUTS))
def test_mtp_layer_is_one_more_decoder_layer_of_the_family(tmp_path, arch):
    """mtp=1 as each family releases its MTP layer: the target's tensors unchanged, the MTP layer's block holding
    what one of the target's MoE decoder layers holds (names and shapes), the MTP-only tensors beside it, and the
    config's MTP layer count that vLLM's MTP model reads."""
    from safetensors.torch import load_file
    from lvllm.testing.tiny_checkpoint import MTP_FIELD
    plain = load_file(f"{make_checkpoint(arch, str(tmp_path / 'plain'))}/model.safetensors")
    path = make_checkpoint(arch, str(tmp_path / "mtp"), mtp=1)
    t = load_file(f"{path}/model.safetensors")
    config = json.load(open(f"{path}/config.json"))
    assert config.get("text_config", config)[MTP_FIELD[arch]] == 1
    assert all(torch.equal(t[n], plain[n]) for n in plain)
    block, like, at, own = MTP_LAYOUTS[arch]
    own = {at + o for o in own}
    added = {n: v.shape for n, v in t.items() if n not in plain}
    mtp_only = {n for n in added if n in own or n.rsplit(".", 1)[0] in own}
    assert {n if n in own else n.rsplit(".", 1)[0] for n in mtp_only} == own
    shaped = {n[len(like):]: v.shape for n, v in plain.items() if n.startswith(like)}
    if arch == "deepseek_v4":  # layer 0 is hash-routed (a token -> experts table), the MTP layer by a gate bias
        shaped.pop("ffn.gate.tid2eid")
        shaped["ffn.gate.bias"] = t["layers.1.ffn.gate.bias"].shape
    if arch.startswith("glm5_next"):  # vLLM builds MTP layers without mHC streams
        shaped = {n: v for n, v in shaped.items() if not n.startswith("hc_")}
    assert all(n.startswith(block) for n in set(added) - mtp_only)
    assert {n[len(block):]: s for n, s in added.items() if n not in mtp_only} == shaped


def test_kimi_k25_big_is_kimi_k2s_text_shape(tmp_path):
    """Kimi-K2.5's --size big text model is Kimi-K2's (moonshotai/Kimi-K2-Instruct's config.json): 384 experts top-8,
    64 heads, one dense layer, one routing group, vocabulary 163840, routed scaling 2.827; transformers' own config
    class reads it."""
    path = make_checkpoint("kimi_k25", str(tmp_path / "big"), size="big", layers=2)
    text = transformers.AutoConfig.from_pretrained(path).text_config
    assert (text.n_routed_experts, text.num_experts_per_tok, text.num_attention_heads) == (384, 8, 64)
    assert (text.first_k_dense_replace, text.n_group, text.topk_group, text.vocab_size) == (1, 1, 1, 163840)
    assert text.routed_scaling_factor == pytest.approx(2.827)
