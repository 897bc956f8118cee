"""MiniMax-M3's and GLM-5.3's generated configs (lvllm.testing.minimax_m3, .glm5_next, .glm5_next_vl; config + tokenizer, tiny and
the release's shape) as the config classes vLLM 0.33.0 uses and its model registry read them, and as lvllm's readers
(doctor, auto-fit, the benchmarks) count them: MoE layers from moe_layer_freq flags / mlp_layer_types. Both models
build on CUDA only."""
import json

import pytest

from lvllm.autofit_inputs import describe_model
from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, read_checkpoint
from lvllm.testing import glm5_next, glm5_next_vl, minimax_m3
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")

ARCHS = {"minimax_m3": ("MiniMaxM3SparseForConditionalGeneration", minimax_m3.SHAPES),
         "glm5_next": ("Glm5NextForCausalLM", glm5_next.SHAPES),
         "glm5_next_vl": ("Glm5NextForConditionalGeneration", glm5_next_vl.SHAPES)}


@pytest.fixture(scope="module", params=[(a, size) for a in ARCHS for size in ("tiny", "big")],
                ids=lambda p: "-".join(p))
def ckpt(request, tmp_path_factory):
    arch, size = request.param
    path = make_checkpoint(arch, str(tmp_path_factory.mktemp(arch) / "ckpt"), size=size)
    with open(f"{path}/config.json") as f:
        raw = json.load(f)
    return arch, ARCHS[arch][1][size], path, raw


def test_vllm_registry_resolves_it(ckpt):
    arch, s, path, _ = ckpt
    from vllm.config import ModelConfig
    mc = ModelConfig(model=path, skip_tokenizer_init=True)
    assert mc.architectures == [ARCHS[arch][0]]
    text = mc.hf_text_config
    assert (getattr(text, "num_local_experts", None) or text.n_routed_experts) == s["E"]


def test_minimax_m3_config_class_reads_its_experts(ckpt):
    arch, s, _, raw = ckpt
    if arch != "minimax_m3":
        pytest.skip("MiniMax-M3 only")
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3Config
    text = MiniMaxM3Config(**{k: v for k, v in raw.items() if k != "model_type"}).text_config
    assert (text.num_local_experts, text.num_experts_per_tok, text.intermediate_size) == (s["E"], s["K"], s["I"])
    # vLLM builds its experts with swigluoai_uninterleave from these: the engine's swigluoai on [gate; up] rows
    assert (text.hidden_act, text.swiglu_alpha, text.swiglu_beta, text.swiglu_limit) == ("swigluoai", 1.702, 1.0, 7.0)
    assert list(text.moe_layer_freq) == [0] * s["dense"] + [1] * (s["L"] - s["dense"])


def test_glm5_next_config_class_reads_its_experts(ckpt):
    arch, s, _, raw = ckpt
    if arch != "glm5_next":
        pytest.skip("GLM-5.3 only")
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    cfg = Glm5NextTextConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (s["E"], s["K"], s["I"])
    assert (cfg.hidden_act, cfg.swiglu_limit) == ("silu", 10.0)  # the engine's silu_clamp
    assert raw["layer_types"][:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.layer_types[:3] == ["linear_attention"] * 3 and cfg.layer_types[3] != "linear_attention"


def test_readers_count_their_moe_layers(ckpt):
    arch, s, path, _ = ckpt
    info = read_checkpoint(path)
    assert info.architecture == ARCHS[arch][0] and info.moe_layers == s["L"] - s["dense"]
    assert expert_shape(info.config) == (s["E"], s["H"], s["I"]) and experts_per_token(info.config) == s["K"]
    assert info.expert_bytes == (s["L"] - s["dense"]) * s["E"] * 3 * s["H"] * s["I"] * 2  # bf16
    model = describe_model(info, tp=1, max_model_len=4096)
    # swigluoai (MiniMax-M3) is one of the GPU expert cache's activations, silu_clamp (GLM-5.3) is not
    assert model.top_k == s["K"] and (model.slot_bytes > 0) == (arch == "minimax_m3")


def test_minimax_m3_tiny_norms_have_a_gain_of_one(tmp_path):
    """MiniMax-M3's norms are Gemma-style (x * (1 + weight)): vLLM's own norm starts at weight 0, a gain of 1. The tiny
    checkpoint's norms hold 0 likewise (weights of 1 doubled every norm's output: a model twice as steep in its logits,
    whose bf16 rounding differences count double in the switch-on vs off comparison)."""
    import torch
    from safetensors.torch import load_file
    from vllm.models.minimax_m3.nvidia.model import MiniMAXGemmaRMSNorm
    assert torch.count_nonzero(MiniMAXGemmaRMSNorm(8).weight) == 0
    path = make_checkpoint("minimax_m3", str(tmp_path / "ckpt"))
    with open(f"{path}/config.json") as f:
        assert json.load(f)["text_config"]["use_gemma_norm"] is True
    norms = {k: t for k, t in load_file(f"{path}/model.safetensors").items() if k.endswith("norm.weight")}
    s = minimax_m3.SHAPES["tiny"]
    assert len(norms) == 1 + 4 * s["L"] + 2 * (s["L"] - s["dense"])  # final; per layer 2 + q/k; indexer q/k
    assert all(torch.count_nonzero(t) == 0 for t in norms.values()), [k for k, t in norms.items() if t.any()]


def test_glm5_next_tiny_is_saved_in_the_hub_layout_without_a_text_conversion(monkeypatch):
    """transformers 5.17 (the GPU machine's) has GLM-5.3's checkpoint conversion under "glm5_next" only; its save of the
    text model kept the fused in-memory tensors (experts.gate_up_proj, one conv1d), which vLLM cannot load. Drop the
    text model's conversion here as 5.17 lacks it: the writer borrows the family's and saves the release's names."""
    from transformers import conversion_mapping as cm
    from lvllm.testing.hub_layout import saved_tensors
    cm.get_checkpoint_conversion_mapping("glm5_next")  # builds the cache
    monkeypatch.delitem(cm._checkpoint_conversion_mapping_cache, "glm5_next_text", raising=False)
    cfg = glm5_next.config(glm5_next.SHAPES["tiny"], 2048)
    fused = saved_tensors("Glm5NextTextModel", "Glm5NextTextConfig", cfg)
    assert "layers.1.mlp.experts.gate_up_proj" in fused  # what 5.17 wrote
    hub = saved_tensors("Glm5NextTextModel", "Glm5NextTextConfig", cfg, conversion_of="glm5_next")
    E = glm5_next.SHAPES["tiny"]["E"]
    for e in range(E):
        for p in ("gate_proj", "up_proj", "down_proj"):
            assert f"layers.1.mlp.experts.{e}.{p}.weight" in hub
    assert not [k for k in hub if k.endswith(("experts.gate_up_proj", "experts.down_proj", "self_attn.conv1d.weight"))]
    assert "layers.0.self_attn.q_conv1d.weight" in hub and "layers.0.hc_attn_fn" in hub


def test_glm5_next_release_layout_reaches_the_text_model_vllm_builds(tmp_path):
    """GLM-5.3-Flash's release layout (glm5_next_vl): vLLM 0.33.0's Glm5NextForConditionalGeneration maps every tensor
    (model.language_model.*, lm_head, the MTP layer after the decoder layers) onto the text model it builds under
    language_model., the same tensors as the text-only checkpoint's under vLLM's names there; its MTP loader's prefix
    rule takes the MTP layer back to the draft's model.layers.<L>. The tokenizer holds the config's vision tokens."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from vllm.models.glm5next import Glm5NextForConditionalGeneration
    vl = make_checkpoint("glm5_next_vl", str(tmp_path / "vl"), mtp=1)
    text = make_checkpoint("glm5_next", str(tmp_path / "text"), mtp=1)
    vl_t, text_t = load_file(f"{vl}/model.safetensors"), load_file(f"{text}/model.safetensors")
    mapper = Glm5NextForConditionalGeneration.hf_to_vllm_mapper
    mapped = {mapper.map_name(k): t for k, t in vl_t.items()}
    assert set(mapped) == {"language_model." + k for k in text_t}
    assert all(torch.equal(mapped["language_model." + k], t) for k, t in text_t.items())
    L = glm5_next.SHAPES["tiny"]["L"]
    assert any(k.startswith(f"model.language_model.layers.{L}.") for k in vl_t)  # the MTP layer, vLLM strips the prefix
    cfg = AutoConfig.from_pretrained(vl)  # transformers' Glm5NextConfig: the text and vision sub-configs
    assert cfg.text_config.n_routed_experts == glm5_next.SHAPES["tiny"]["E"] and cfg.vision_config.depth == 1
    with open(f"{vl}/tokenizer.json") as f:
        added = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    assert [added[t] for t in glm5_next_vl.VISION_TOKENS] == [getattr(cfg, f) for f in glm5_next_vl.TOKEN_ID_FIELDS]


def test_vllm_drafts_glm5_next_mtp_from_the_release_layout_only(tmp_path):
    """vLLM 0.33.0's speculative config turns GLM-5.3's MTP layer into its draft (Glm5NextMTPModel) from the release
    layout's config (model_type glm5_next) and from nothing else: the text-only layout (glm5_next_text) stops with
    "Unsupported speculative method: 'mtp'" in stock vLLM (session 36, on the H100), so the e2e suite drafts with the
    release layout. When a vLLM release maps the text-only type too, this test says so."""
    from vllm.config import ModelConfig
    from vllm.config.speculative import SpeculativeConfig
    for arch, drafted in (("glm5_next_vl", True), ("glm5_next", False)):
        path = make_checkpoint(arch, str(tmp_path / arch), mtp=1)
        hf = ModelConfig(model=path, skip_tokenizer_init=True).hf_config
        over = SpeculativeConfig.hf_config_override(hf)
        assert (over.model_type == "glm5_next_mtp") is drafted, (arch, over.model_type)
        if drafted:
            assert over.architectures == ["Glm5NextMTPModel"] and over.n_predict == 1


def test_minimax_m3_mxfp8_release_is_read_as_mxfp8(tmp_path):
    """MiniMax-M3's MXFP8 release (`--quant mxfp8`): the routed experts' e4m3 codes with e8m0 scales under
    weight_scale_inv, MiniMax's own config tag, the rest bf16; vLLM's quantization config parser takes it as ModelOpt
    MXFP8 and doctor / auto-fit as the engine's mxfp8 at 33/32 bytes a weight."""
    import torch
    from safetensors.torch import load_file
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMxFp8Config
    path = make_checkpoint("minimax_m3", str(tmp_path / "m3"), quant="mxfp8")
    qc = json.load(open(f"{path}/config.json"))["quantization_config"]
    assert qc["quant_method"] == "mxfp8" and all(".experts." not in n for n in qc["ignored_layers"])
    t = load_file(f"{path}/model.safetensors")
    codes = {n for n, v in t.items() if v.dtype == torch.float8_e4m3fn}
    assert codes and all(".block_sparse_moe.experts." in n for n in codes)
    assert all(t[n[:-len("weight")] + "weight_scale_inv"].dtype == torch.uint8 for n in codes)
    cfg = ModelOptMxFp8Config.from_config(qc)
    assert cfg.get_name() == "modelopt_mxfp8" and cfg.is_checkpoint_mxfp8_serialized
    info = read_checkpoint(path)
    model = describe_model(info, tp=1, max_model_len=4096)
    s = minimax_m3.SHAPES["tiny"]
    # GPU prefill streams the codes; the cache holds its experts dequantized (bf16 slots)
    assert info.quant_method == "mxfp8" and (model.fmt, model.gpu_prefill) == ("mxfp8", True)
    assert model.slot_bytes == 3 * s["H"] * s["I"] * 2
    weights = (s["L"] - s["dense"]) * s["E"] * 3 * s["H"] * s["I"]
    assert info.expert_bytes == weights * 33 // 32
