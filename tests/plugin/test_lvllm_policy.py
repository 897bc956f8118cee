"""lvllm's layer policy and format mapping, over stand-ins that carry vLLM's class names and the
attributes the policy reads (the real classes are exercised in tests/e2e on the GPU machine)."""
import enum
from types import SimpleNamespace

import pytest

from lvllm.config import from_env
from lvllm.policy import UnsupportedMoELayer, engine_format, engine_tensor_names, layer_index_of, plan_for


def method(cls_name, **attrs):
    return type(cls_name, (), {})() if not attrs else type(cls_name, (), dict(attrs))()


class Strategy(enum.Enum):
    CHANNEL = "channel"
    BLOCK = "block"
    TENSOR = "tensor"


class Act(enum.Enum):
    SILU = "silu"
    SWIGLUOAI = "swigluoai"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    GELU = "gelu"


def moe_config(**over):
    par = SimpleNamespace(use_ep=False, dp_size=1, enable_eplb=False, use_all2all_kernels=False, pcp_size=1,
                          is_sequence_parallel=False)
    base = dict(activation=Act.SILU, has_bias=False, is_act_and_mul=True, is_lora_enabled=False,
                moe_parallel_config=par)
    for k, v in over.items():
        if hasattr(par, k):
            setattr(par, k, v)
        else:
            base[k] = v
    return SimpleNamespace(**base)


LAYER = SimpleNamespace(apply_router_weight_on_input=False)
ON = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0-1,5"})


def test_layer_index():
    assert layer_index_of("model.layers.7.mlp.experts") == 7
    assert layer_index_of("language_model.model.layers.12.mlp.experts") == 12
    assert layer_index_of("layers.3.block_sparse_moe.experts") == 3
    assert layer_index_of("model.mtp.experts") is None


def test_format_mapping():
    assert engine_format(method("UnquantizedFusedMoEMethod")) == ("bf16", None)
    assert engine_format(method("Fp8MoEMethod", block_quant=True, weight_block_size=[128, 128])) == \
        ("fp8_block", (128, 128))
    ct = SimpleNamespace(strategy=Strategy.CHANNEL)
    assert engine_format(method("CompressedTensorsW8A8Fp8MoEMethod", weight_quant=ct)) == ("fp8_channel", None)
    assert engine_format(method("CompressedTensorsW8A8Int8MoEMethod", weight_quant=ct)) == ("int8_channel", None)
    assert engine_format(method("CompressedTensorsWNA16MoEMethod", num_bits=4, wna16_backend="MARLIN",
                                weight_quant=SimpleNamespace(actorder=None))) == ("wna16_int4", None)


def test_fp8_block_follows_the_scale_grid_vllm_created():
    """With TP cutting a 128-row block, vLLM refines the scale grid (moe_block_shape) and upsamples the
    checkpoint's scales to it: the engine reads that grid, not the checkpoint's block."""
    m = method("Fp8MoEMethod", block_quant=True, weight_block_size=[128, 128], moe_block_shape=(64, 128))
    assert engine_format(m) == ("fp8_block", (64, 128))


@pytest.mark.parametrize("m,words", [
    (method("Fp8MoEMethod", block_quant=False), "per-tensor weight scales"),
    (method("CompressedTensorsW8A8Fp8MoEMethod", weight_quant=SimpleNamespace(strategy=Strategy.TENSOR)),
     "weight strategy 'tensor'"),
    (method("AutoGPTQMoEMethod"), "AutoGPTQMoEMethod is not supported by lk_moe yet"),
    (method("CompressedTensorsWNA16MoEMethod", num_bits=8), "8-bit weights"),
    (method("CompressedTensorsWNA16MoEMethod", num_bits=4, weight_quant=SimpleNamespace(actorder="group")),
     "act order"),
    (method("CompressedTensorsWNA16MoEMethod", num_bits=4, wna16_backend="FLASHINFER_TRTLLM"), "N-first"),
])
def test_unsupported_methods_are_named(m, words):
    with pytest.raises(UnsupportedMoELayer) as ei:
        engine_format(m)
    assert words in str(ei.value)


def test_resident_layers_keep_vllms_method():
    unq = method("UnquantizedFusedMoEMethod")
    p = plan_for("model.layers.5.mlp.experts", unq, LAYER, moe_config(), ON)
    assert p.kind == "gpu_resident" and p.layer_index == 5
    p = plan_for("model.layers.2.mlp.experts", unq, LAYER, moe_config(), ON)
    assert p.kind == "hybrid" and p.format == "bf16" and p.layer_index == 2
    # A resident layer may use a method the engine does not run: vLLM runs it.
    assert plan_for("model.layers.0.mlp.experts", method("GptOssMxfp4MoEMethod"), LAYER,
                    moe_config(activation=Act.SWIGLUOAI, has_bias=True), ON).kind == "gpu_resident"


def test_compressed_tensors_mxfp4_is_mxfp4_under_its_packed_names():
    m = method("CompressedTensorsW4A4Mxfp4MoEMethod")
    assert engine_format(m) == ("mxfp4", None)
    assert engine_tensor_names(m) == {"w13_weight": "w13_weight_packed", "w2_weight": "w2_weight_packed"}
    assert engine_tensor_names(method("Mxfp4MoEMethod")) == {}  # the engine's own names
    p = plan_for("model.layers.3.mlp.experts", m, LAYER, moe_config(), ON)
    assert (p.kind, p.format) == ("hybrid", "mxfp4")
    a8 = method("CompressedTensorsW4A8Mxfp4MoEMethod")  # FP8 activations: the engine keeps them bf16
    assert engine_format(a8) == ("mxfp4", None) and engine_tensor_names(a8) == engine_tensor_names(m)


def test_modelopt_nvfp4_maps_to_nvfp4():
    for algo in ("NVFP4", "W4A16_NVFP4"):
        m = method("ModelOptNvFp4FusedMoE", quant_config=SimpleNamespace(quant_method=algo))
        assert engine_format(m) == ("nvfp4", None)
        p = plan_for("model.layers.3.mlp.experts", m, LAYER, moe_config(), ON)
        assert (p.kind, p.format) == ("hybrid", "nvfp4")
    # every activation, no biases, gated: what the engine's nvfp4 layer computes
    p = plan_for("model.layers.3.mlp.experts", method("ModelOptNvFp4FusedMoE"), LAYER,
                 moe_config(activation=Act.SWIGLUOAI_UNINTERLEAVE), ON)
    assert (p.kind, p.format) == ("hybrid", "nvfp4")
    for over, words in ((dict(activation=Act.GELU), "activation 'gelu' with nvfp4 experts"),
                        (dict(has_bias=True), "expert biases with nvfp4 experts"),
                        (dict(is_act_and_mul=False), "non-gated experts")):
        with pytest.raises(UnsupportedMoELayer, match=words):
            plan_for("model.layers.3.mlp.experts", method("ModelOptNvFp4FusedMoE"), LAYER, moe_config(**over), ON)
    # the other ModelOpt MoE methods are not nvfp4
    assert engine_format(method("ModelOptMxFp8FusedMoE")) == ("mxfp8", None)


@pytest.mark.parametrize("cls", ["ModelOptMxFp8FusedMoE", "CompressedTensorsW8A8Mxfp8MoEMethod"])
def test_mxfp8_methods_take_minimax_m3_activation(cls):
    """MXFP8 experts (MiniMax-M3's release: swigluoai on [gate; up] rows, no biases) on the engine's mxfp8, the
    tensors under vLLM's own names; prefill streamed to the GPU like every other format's."""
    from lvllm.policy import gpu_prefill_min_batch
    p = plan_for("model.layers.3.mlp.experts", method(cls), LAYER, moe_config(activation=Act.SWIGLUOAI_UNINTERLEAVE),
                 ON)
    assert (p.kind, p.format) == ("hybrid", "mxfp8") and engine_tensor_names(method(cls)) == {}
    prefill_on = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "1024"})
    assert gpu_prefill_min_batch("mxfp8", prefill_on) == 1024 == gpu_prefill_min_batch("fp8_block", prefill_on)
    with pytest.raises(UnsupportedMoELayer, match="expert biases with mxfp8 experts"):
        plan_for("model.layers.3.mlp.experts", method(cls), LAYER, moe_config(has_bias=True), ON)


def test_mxfp4_takes_gpt_oss_activation_and_biases():
    gpt_oss = moe_config(activation=Act.SWIGLUOAI, has_bias=True)
    p = plan_for("model.layers.3.mlp.experts", method("GptOssMxfp4MoEMethod"), LAYER, gpt_oss, ON)
    assert (p.kind, p.format) == ("hybrid", "mxfp4")


@pytest.mark.parametrize("over,words", [
    (dict(activation=Act.GELU), "activation 'gelu' with bf16 experts"),
    (dict(has_bias=True), "expert biases with bf16 experts"),
    (dict(use_ep=True), "expert parallelism"),
    (dict(dp_size=2), "data parallelism"),
    (dict(enable_eplb=True), "EPLB"),
    (dict(is_lora_enabled=True), "LoRA"),
])
def test_unsupported_features_stop_with_the_layer_named(over, words):
    layer = SimpleNamespace(apply_router_weight_on_input=False, swiglu_limit=over.pop("layer_swiglu_limit", None))
    with pytest.raises(UnsupportedMoELayer) as ei:
        plan_for("model.layers.3.mlp.experts", method("UnquantizedFusedMoEMethod"), layer, moe_config(**over), ON)
    assert "model.layers.3.mlp.experts" in str(ei.value) and words in str(ei.value)


def test_silu_with_a_swiglu_limit_is_the_engines_clamped_silu():
    """DeepSeek-V4's routed experts: vLLM's silu with layer.swiglu_limit set run on lk_moe as silu_clamp."""
    from lvllm.policy import engine_activation
    layer = SimpleNamespace(apply_router_weight_on_input=False, swiglu_limit=10.0)
    p = plan_for("model.layers.3.mlp.experts", method("UnquantizedFusedMoEMethod"), layer, moe_config(), ON)
    assert (p.kind, p.format) == ("hybrid", "bf16")
    assert engine_activation(Act.SILU, 10.0) == ("silu_clamp", 10.0)
    assert engine_activation(Act.SILU, None) == ("silu", None)
    assert engine_activation(Act.SWIGLUOAI, None) == ("swigluoai", None)
    assert engine_activation(Act.SWIGLUOAI_UNINTERLEAVE, 7.0) == ("swigluoai", 7.0)


def test_minimax_m3_swigluoai_runs_on_every_format_with_beta_one_only():
    """MiniMax-M3's swigluoai (gate rows then up rows) is hybrid for bf16 and FP8 block experts; a beta other
    than 1.0 (the engine computes up + 1) stops startup naming the layer."""
    cfg = moe_config(activation=Act.SWIGLUOAI_UNINTERLEAVE)
    ok = SimpleNamespace(apply_router_weight_on_input=False, swiglu_limit=7.0, swiglu_alpha=1.702, swiglu_beta=1.0)
    for m in (method("UnquantizedFusedMoEMethod"), method("Fp8MoEMethod", block_quant=True, weight_block_size=[128, 128])):
        p = plan_for("model.layers.3.block_sparse_moe.experts", m, ok, cfg, ON)
        assert p.kind == "hybrid", p
    bad = SimpleNamespace(apply_router_weight_on_input=False, swiglu_limit=7.0, swiglu_alpha=1.702, swiglu_beta=0.5)
    with pytest.raises(UnsupportedMoELayer, match=r"model.layers.3.block_sparse_moe.experts.*swiglu_beta=0.5"):
        plan_for("model.layers.3.block_sparse_moe.experts", method("UnquantizedFusedMoEMethod"), bad, cfg, ON)


def test_gpu_prefill_per_format():
    """Every engine format streams to the GPU for prefill (bf16 as is, the byte and 4-bit formats
    dequantized there); a format without a GPU path would keep CPU prefill (the runtime warns once per
    format, see test_lvllm_progress), never a load failure."""
    from lvllm.policy import GPU_PREFILL_FORMATS, gpu_prefill_min_batch
    cfg = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "1024"})
    m = method("Fp8MoEMethod", block_quant=True, weight_block_size=[128, 128])
    p = plan_for("model.layers.3.mlp.experts", m, LAYER, moe_config(), cfg)
    assert p.format == "fp8_block" and gpu_prefill_min_batch(p.format, cfg) == 1024
    for fmt in ("bf16", "fp8_block", "fp8_channel", "int8_channel", "wna16_int4", "mxfp4", "nvfp4"):
        assert gpu_prefill_min_batch(fmt, cfg) == 1024
    assert gpu_prefill_min_batch("fp6_someday", cfg) == 0
    p = plan_for("model.layers.3.mlp.experts", method("ModelOptNvFp4FusedMoE"), LAYER, moe_config(), cfg)
    assert p.format == "nvfp4" and p.kind == "hybrid"
    assert gpu_prefill_min_batch("fp8_block", ON) == ON.gpu_prefill_min_batch
    import lk_moe.gpu_dequant
    assert GPU_PREFILL_FORMATS == lk_moe.gpu_dequant.GPU_FORMATS  # the policy's literal matches lk_moe


def test_draft_model_layers_follow_the_draft_rule():
    """MTP / NextN layers of a speculative draft model: GPU-resident by default (LVLLM_DRAFT_MOE=gpu),
    hybrid with LVLLM_DRAFT_MOE=cpu; told apart by vLLM's model tag, an mtp. prefix or a number past the target's
    layers."""
    from lvllm.policy import is_draft_layer
    unq = method("UnquantizedFusedMoEMethod")
    assert is_draft_layer("mtp.layers.0.mlp.experts", 48) and is_draft_layer("model.mtp.layers.0.mlp.experts", None)
    assert is_draft_layer("model.layers.61.mlp.experts", 61) and not is_draft_layer("model.layers.60.mlp.experts", 61)
    assert not is_draft_layer("model.layers.61.mlp.experts", None)  # unknown target depth: a target layer
    # vLLM 0.33's DeepSeek-V4 MTP and DSpark drafts: model.layers.<num_hidden_layers + i> (vLLM builds a draft
    # under the target's VllmConfig, so target_layers is the target's count)
    assert is_draft_layer("model.layers.43.ffn.experts", 43) and is_draft_layer("model.layers.45.ffn.experts", 43)
    assert not is_draft_layer("model.layers.42.ffn.experts", 43)
    # vLLM's model tag while a proposer builds its draft: a draft numbering its layers from 0 (DSpark, a separate
    # draft model) is still a draft; the target's tag ("backbone") and Gemma's decoder halves are not
    assert is_draft_layer("model.layers.0.mlp.experts", 43, "dspark_head")
    assert is_draft_layer("draft_model.model.layers.1.mlp.experts", 43, "draft_model")
    for tag in ("backbone", "self_decoder", "cross_decoder", None):
        assert not is_draft_layer("model.layers.0.mlp.experts", 43, tag)
    p = plan_for("model.layers.0.mlp.experts", unq, LAYER, moe_config(), ON, target_layers=43, model_tag="eagle_head")
    assert p.kind == "gpu_resident" and p.draft
    p = plan_for("model.layers.61.mlp.experts", unq, LAYER, moe_config(), ON, target_layers=61)
    assert p.kind == "gpu_resident" and p.draft and p.layer_index == 61
    p = plan_for("mtp.layers.0.mlp.experts", unq, LAYER, moe_config(), ON, target_layers=48)
    assert p.kind == "gpu_resident" and p.draft
    cpu = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_DRAFT_MOE": "cpu", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0"})
    p = plan_for("mtp.layers.0.mlp.experts", unq, LAYER, moe_config(), cpu, target_layers=48)
    assert p.kind == "hybrid" and p.draft and p.format == "bf16"  # not made resident by the target's layer 0
    p = plan_for("model.layers.0.mlp.experts", unq, LAYER, moe_config(), cpu, target_layers=48)
    assert p.kind == "gpu_resident" and not p.draft
