"""What the plugin tells the engine beyond the tensors: activation, its constants, real sizes."""
import enum
from types import SimpleNamespace

import pytest

from lvllm.hybrid_method import _format_args
from lvllm.policy import LayerPlan, UnsupportedMoELayer


class Act(enum.Enum):  # vLLM's MoEActivation values
    SILU = "silu"
    SWIGLUOAI = "swigluoai"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SITU = "situ"


def layer(act, **kw):
    return SimpleNamespace(activation=act, hidden_size=2880, intermediate_size_per_partition=1440, **kw)


def test_gpt_oss_layers_are_interleaved_swigluoai_with_real_sizes():
    args = _format_args(layer(Act.SWIGLUOAI, swiglu_alpha=None, swiglu_limit=None), LayerPlan("p", 1, "hybrid", "mxfp4"))
    assert args == {"activation": "swigluoai", "interleaved": True, "hidden_size": 2880, "intermediate_size": 1440}


def test_layer_constants_pass_through():
    args = _format_args(layer(Act.SWIGLUOAI, swiglu_alpha=1.5, swiglu_limit=9.0), LayerPlan("p", 1, "hybrid", "mxfp4"))
    assert args["swiglu_alpha"] == 1.5 and args["swiglu_limit"] == 9.0


def test_other_formats_need_nothing_more():
    assert _format_args(layer(Act.SILU), LayerPlan("p", 1, "hybrid", "bf16")) == {}
    assert _format_args(layer(Act.SILU), LayerPlan("p", 1, "hybrid", "mxfp4"))["interleaved"] is False


def test_a_swiglu_limit_with_silu_is_the_clamped_silu_for_every_format():
    """DeepSeek-V4-style experts (silu, layer.swiglu_limit): [gate; up] rows, the model's limit."""
    for fmt in ("bf16", "fp8_block", "wna16_int4", "nvfp4"):
        args = _format_args(layer(Act.SILU, swiglu_limit=10.0), LayerPlan("p", 1, "hybrid", fmt))
        assert args == {"activation": "silu_clamp", "swiglu_limit": 10.0}, fmt
    args = _format_args(layer(Act.SILU, swiglu_limit=10.0), LayerPlan("p", 1, "hybrid", "mxfp4"))
    assert args["activation"] == "silu_clamp" and args["swiglu_limit"] == 10.0 and args["interleaved"] is False


def test_situ_takes_its_constants_from_the_moe_config():
    """Kimi-K3's experts (MoEActivation.SITU): beta and linear beta from vLLM's FusedMoEConfig (None: up not clipped)."""
    for fmt, linear_beta, want in (("bf16", None, 0.0), ("mxfp4", 4.0, 4.0), ("fp8_block", 2.5, 2.5)):
        cfg = SimpleNamespace(activation_situ_beta=1.5, activation_situ_linear_beta=linear_beta)
        args = _format_args(layer(Act.SITU, moe_config=cfg), LayerPlan("p", 1, "hybrid", fmt))
        assert (args["activation"], args["situ_beta"], args["situ_linear_beta"]) == ("situ", 1.5, want), fmt
    with pytest.raises(UnsupportedMoELayer, match="without activation_situ_beta"):
        _format_args(layer(Act.SITU, moe_config=SimpleNamespace()), LayerPlan("p", 1, "hybrid", "bf16"))


def test_minimax_m3_swigluoai_is_the_engines_swigluoai_on_gate_then_up_rows():
    """MiniMax-M3's experts (MoEActivation.SWIGLUOAI_UNINTERLEAVE: swigluoai's math, w13 rows [gate; up], the
    layer's alpha and limit): the engine's swigluoai with its constants, on every format, not interleaved."""
    for fmt in ("bf16", "fp8_block", "nvfp4"):
        args = _format_args(layer(Act.SWIGLUOAI_UNINTERLEAVE, swiglu_alpha=1.702, swiglu_limit=7.0),
                            LayerPlan("p", 1, "hybrid", fmt))
        assert args == {"activation": "swigluoai", "swiglu_limit": 7.0, "swiglu_alpha": 1.702}, fmt
    args = _format_args(layer(Act.SWIGLUOAI_UNINTERLEAVE, swiglu_alpha=1.5, swiglu_limit=9.0),
                        LayerPlan("p", 1, "hybrid", "mxfp4"))
    assert (args["activation"], args["interleaved"], args["swiglu_alpha"], args["swiglu_limit"]) == (
        "swigluoai", False, 1.5, 9.0)
