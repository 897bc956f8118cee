"""fp8_channel and int8_channel experts (compressed-tensors channel quantization as vLLM holds it:
weights [E, 2I, H] / [E, H, I], fp32 scales [E, 2I, 1] / [E, H, 1]) against the fp32 reference on
the dequantized weights, on every ISA tier this CPU has."""
import pytest
import torch

import lk_moe
from lk_moe.reference import random_routing
from lvllm.testing.experts import quantize_experts

from .conftest import assert_matches_reference


def make_channel_experts(fmt, E, H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    return quantize_experts(fmt, w13, torch.randn(E, H, I, generator=g) / I ** 0.5)


@pytest.mark.parametrize("fmt", ["fp8_channel", "int8_channel"])
@pytest.mark.parametrize("H,I", [(2048, 768), (2880, 720), (200, 72)])
def test_channel_formats_every_tier(tier, fmt, H, I):
    E, K = 6, 4
    tensors, d13, d2 = make_channel_experts(fmt, E, H, I, seed=H)
    layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors)
    assert layer.format == fmt
    assert layer.nbytes <= 1.02 * layer.expert_bytes + 4 * 2 * 1024 * 1024  # small shapes: page rounding
    for M in (1, 3, 16, 70):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


def test_channel_scales_may_be_2d():
    tensors, d13, d2 = make_channel_experts("int8_channel", 4, 256, 128)
    tensors = dict(tensors, w13_weight_scale=tensors["w13_weight_scale"][..., 0].contiguous(),
                   w2_weight_scale=tensors["w2_weight_scale"][..., 0].contiguous())
    layer = lk_moe.MoELayer.from_checkpoint("int8_channel", tensors)
    x = torch.randn(5, 256).bfloat16()
    ids, w = random_routing(5, 4, 2)
    assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


def test_channel_bad_tensors_are_named():
    tensors, _, _ = make_channel_experts("int8_channel", 2, 256, 128)
    with pytest.raises(TypeError, match="w13_weight must be float8_e4m3fn for fp8_channel"):
        lk_moe.MoELayer.from_checkpoint("fp8_channel", tensors)
    bad = dict(tensors, w2_weight_scale=torch.ones(2, 128, 1))
    with pytest.raises(ValueError, match="w2_weight_scale must be \\[E, H, 1\\]"):
        lk_moe.MoELayer.from_checkpoint("int8_channel", bad)
    with pytest.raises(ValueError, match="needs tensor\\(s\\) w13_weight_scale"):
        lk_moe.MoELayer.from_checkpoint("int8_channel", {k: v for k, v in tensors.items() if k != "w13_weight_scale"})


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel", "int8_channel"])
def test_byte_formats_split_across_numa_slices(tmp_path, fmt):
    """Scales follow their rows into each node's slice (synthetic 3-node machine)."""
    from .fake_sysfs import make_sysfs
    from .test_fp8_block import make_fp8_experts
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    pool = lk_moe.make_pool(threads=3, binding="NONE", sysfs_root=root, allowed=list(range(6)))
    E, H, I, K = 4, 512, 384, 2
    if fmt == "fp8_block":
        tensors, d13, d2 = make_fp8_experts(E, H, I)
    else:
        tensors, d13, d2 = make_channel_experts(fmt, E, H, I)
    layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, pool=pool)
    assert layer.num_slices == 3
    for M in (1, 40):
        x = torch.randn(M, H).half()  # fp16 activations too
        ids, w = random_routing(M, E, K)
        out = layer.forward(x, ids, w)
        assert out.dtype == torch.float16
        assert_matches_reference(out, x, d13, d2, ids, w)


def test_quantized_layers_refuse_gpu_copies_clearly():
    tensors, _, _ = make_channel_experts("int8_channel", 2, 256, 128)
    layer = lk_moe.MoELayer.from_checkpoint("int8_channel", tensors)
    with pytest.raises(ValueError, match="this layer has byte weights .* use quant_slices"):
        layer._impl.packed_slices()


@pytest.mark.parametrize("fmt", ["fp8_channel", "int8_channel"])
def test_channel_torch_baseline_is_the_dequantized_layer(fmt):
    """lk_moe.reference's per-channel dequantization (the benchmark's torch baseline) equals the
    quantizer's own decode bit for bit; the baseline is the bf16 torch baseline on those weights
    (the same GEMMs: equal up to the order of the fp32 sums)."""
    from lk_moe.reference import dequantize_per_channel, moe_torch_baseline, moe_torch_baseline_channel
    tensors, d13, d2 = make_channel_experts(fmt, 4, 256, 128)
    assert torch.equal(dequantize_per_channel(tensors["w13_weight"], tensors["w13_weight_scale"]), d13)
    assert torch.equal(dequantize_per_channel(tensors["w2_weight"], tensors["w2_weight_scale"][..., 0]), d2)
    x = torch.randn(5, 256).bfloat16()
    ids, w = random_routing(5, 4, 2)
    torch.testing.assert_close(moe_torch_baseline_channel(x, tensors, ids, w),
                               moe_torch_baseline(x, d13.bfloat16(), d2.bfloat16(), ids, w), rtol=2 ** -7, atol=1e-5)
