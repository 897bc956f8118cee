"""The re-classed vLLM method keeps its class name and isinstance, and answers the runner's
questions as the hybrid path needs (runs where the pinned vLLM is importable; no GPU needed)."""
import pytest

from lvllm import pins

vllm = pytest.importorskip("vllm")
if vllm.__version__ != pins.VLLM:
    pytest.skip(f"vLLM {vllm.__version__} is not the pinned {pins.VLLM}", allow_module_level=True)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (  # noqa: E402
    UnquantizedFusedMoEMethod,
)

from lvllm.hybrid_method import hybrid_class_for, make_hybrid  # noqa: E402
from lvllm.policy import LayerPlan  # noqa: E402


def _bare_method():
    m = object.__new__(UnquantizedFusedMoEMethod)  # no vLLM config needed for these checks
    nn.Module.__init__(m)
    m.moe, m.moe_kernel, m.moe_quant_config = None, None, None
    return m


def test_reclass_keeps_name_and_type():
    m = _bare_method()
    make_hybrid(m, None, LayerPlan("model.layers.1.mlp.experts", 1, "hybrid", "bf16"), None)
    assert type(m).__name__ == "UnquantizedFusedMoEMethod" and isinstance(m, UnquantizedFusedMoEMethod)
    assert type(m) is hybrid_class_for(UnquantizedFusedMoEMethod)  # one class per base
    # vLLM's post-load step leaves the host tensors where they are (no GPU round trip)
    assert m.requires_device_loading is False and UnquantizedFusedMoEMethod.requires_device_loading is True


def test_runner_sees_a_plain_modular_method():
    m = _bare_method()
    make_hybrid(m, None, LayerPlan("model.layers.1.mlp.experts", 1, "hybrid", "bf16"), None)
    assert not m.is_monolithic and not m.supports_eplb and not m.supports_internal_mk
    assert not m.mk_can_overlap_shared_experts and not m.skip_forward_padding and not m.has_unpadded_output
    assert m.topk_indices_dtype is torch.int32
    assert m.get_fused_moe_quant_config(None) is None


def test_apply_before_loading_is_a_clear_error():
    m = _bare_method()
    make_hybrid(m, None, LayerPlan("model.layers.1.mlp.experts", 1, "hybrid", "bf16"), None)
    x = torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="before its weights were loaded"):
        m.apply(None, x, torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.int32), None, None)


def test_host_tensors_are_not_padded_for_gpu_backends():
    """vLLM's MXFP4 method pads H and I for its GPU kernels; the hybrid keeps the real sizes."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod
    m = object.__new__(GptOssMxfp4MoEMethod)  # a plain class (not a torch module)
    make_hybrid(m, None, LayerPlan("model.layers.1.mlp.experts", 1, "hybrid", "mxfp4"), None)
    par = SimpleNamespace(**{a: False for a in ("use_deepep_ht_kernels", "use_deepep_ll_kernels",
                                                "use_deepep_v2_kernels", "use_nixl_ep_kernels", "use_mori_kernels",
                                                "use_all2all_kernels", "use_fi_nvl_two_sided_kernels",
                                                "use_fi_nvl_one_sided_kernels")})
    assert m.maybe_roundup_sizes(2880, 2880, torch.bfloat16, par) == (2880, 2880)
