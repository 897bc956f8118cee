"""fp8_block experts (DeepSeek-V3 / Qwen3-FP8 style, vLLM Fp8MoEMethod tensors) against the fp32
reference on the dequantized weights, on every ISA tier this CPU has."""
import pytest
import torch

import lk_moe
from lk_moe.reference import dequantize_fp8_block, random_routing
from lvllm.testing.quantizers import quantize_fp8_block

from .conftest import assert_matches_reference, rounds_weights

def make_fp8_experts(E, H, I, seed=0, bn=128, bk=128):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    q13, s13 = quantize_fp8_block(w13, bn, bk)
    q2, s2 = quantize_fp8_block(w2, bn, bk)
    d13, d2 = dequantize_fp8_block(q13, s13, (bn, bk)), dequantize_fp8_block(q2, s2, (bn, bk))
    tensors = dict(w13_weight=q13, w2_weight=q2, w13_weight_scale_inv=s13, w2_weight_scale_inv=s2)
    return tensors, d13, d2


@pytest.mark.parametrize("H,I", [(2048, 768), (7168, 2048), (2048, 384)])  # Qwen3-30B FP8, DeepSeek-V3, TP=2 shard
def test_fp8_block_every_tier(tier, H, I):
    E, K = 8 if H < 4096 else 4, 4
    tensors, d13, d2 = make_fp8_experts(E, H, I, seed=H + I)
    layer = lk_moe.MoELayer.from_checkpoint("fp8_block", tensors)
    assert layer.format == "fp8_block"
    for M in (1, 3, 16, 70, 300):  # 300: >= 128 rows an expert, the amx tier's scale-folded panels
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w,
                                 weights_rounded=rounds_weights("fp8_block"))


def test_all_fp8_codes_convert_exactly(tier):
    """Weights drawn from every finite e4m3 code, subnormals included, with unit scales."""
    E, H, I, K = 4, 256, 128, 2
    g = torch.Generator().manual_seed(3)
    codes = torch.cat([torch.arange(0, 127), torch.arange(128, 255)]).to(torch.uint8)
    def draw(*shape):
        return codes[torch.randint(0, len(codes), shape, generator=g)].view(torch.float8_e4m3fn)
    q13, q2 = draw(E, 2 * I, H), draw(E, H, I)
    s13, s2 = torch.ones(E, 2 * I // 128, H // 128), torch.ones(E, H // 128, I // 128)
    layer = lk_moe.MoELayer.from_checkpoint(
        "fp8_block", dict(w13_weight=q13, w2_weight=q2, w13_weight_scale_inv=s13, w2_weight_scale_inv=s2))
    for M in (1, 2, 4, 5, 40, 300):  # decode tiles (codes by table on VBMI tiers), panels (amx, >= 128 rows: folded)
        x = (torch.randn(M, H) * 1e-3).bfloat16()  # small inputs keep the products of 448-sized weights finite
        ids, w = random_routing(M, E, K, generator=g)
        assert_matches_reference(layer.forward(x, ids, w), x, q13.float(), q2.float(), ids, w)


def test_negative_block_scales_flip_the_weights(tier):
    """A negative scale (no checkpoint writes one, the arithmetic allows it) negates its block's weights, in the
    decode tiles' fp32 scaling and in the amx tier's scale-folded tables alike."""
    E, H, I, K = 4, 256, 256, 2
    tensors, _, _ = make_fp8_experts(E, H, I, seed=7)
    for key in ("w13_weight_scale_inv", "w2_weight_scale_inv"):
        tensors[key] = -tensors[key]
    d13 = dequantize_fp8_block(tensors["w13_weight"], tensors["w13_weight_scale_inv"], (128, 128))
    d2 = dequantize_fp8_block(tensors["w2_weight"], tensors["w2_weight_scale_inv"], (128, 128))
    layer = lk_moe.MoELayer.from_checkpoint("fp8_block", tensors)
    for M in (1, 40, 300):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w,
                                 weights_rounded=rounds_weights("fp8_block"))


@pytest.mark.parametrize("nan_in", ["w13", "w2"])
def test_a_nan_code_in_the_weights_reaches_the_output(tier, nan_in):
    """e4m3's NaN codes (0x7f, 0xff) are NaN in every conversion: a broken checkpoint shows, never hidden."""
    E, H, I = 2, 256, 128
    tensors, _, _ = make_fp8_experts(E, H, I, seed=5)
    key = f"{nan_in}_weight"
    codes = tensors[key].view(torch.uint8).clone()
    codes[1, 7, 40] = 0xFF if nan_in == "w2" else 0x7F  # expert 1 only
    tensors[key] = codes.view(torch.float8_e4m3fn)
    layer = lk_moe.MoELayer.from_checkpoint("fp8_block", tensors)
    for M in (1, 3, 16, 200):
        x = torch.randn(M, H).bfloat16()
        for expert in (0, 1):
            ids = torch.full((M, 1), expert, dtype=torch.int32)
            y = layer.forward(x, ids, torch.ones(M, 1))
            assert bool(torch.isnan(y).any()) == (expert == 1), (M, expert)


def test_fp8_memory_is_one_byte_per_weight():
    tensors, _, _ = make_fp8_experts(16, 2048, 768)
    layer = lk_moe.MoELayer.from_checkpoint("fp8_block", tensors)
    assert layer.nbytes <= 1.02 * layer.expert_bytes
    assert layer.expert_bytes < 16 * 3 * 2048 * 768 * 1.01


def test_fp8_bad_tensors_are_named():
    tensors, _, _ = make_fp8_experts(2, 256, 128)
    with pytest.raises(ValueError, match="needs tensor\\(s\\) w2_weight_scale_inv"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", {k: v for k, v in tensors.items() if k != "w2_weight_scale_inv"})
    bad = dict(tensors, w13_weight=tensors["w13_weight"].float())
    with pytest.raises(TypeError, match="w13_weight must be float8_e4m3fn"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", bad)
    bad = dict(tensors, w2_weight_scale_inv=tensors["w2_weight_scale_inv"][:, :1].contiguous())
    with pytest.raises(ValueError, match="scale shapes"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", bad)
    bad = dict(tensors, w13_weight_scale_inv=torch.ones(2, 3, 2))  # 3 row blocks do not tile 2I = 256
    with pytest.raises(ValueError, match="cannot infer the fp8 block size"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", bad)
    with pytest.raises(ValueError, match="unsupported expert format 'mxfp6'"):
        lk_moe.MoELayer.from_checkpoint("mxfp6", tensors)
    t2, _, _ = make_fp8_experts(2, 192, 96, bn=48, bk=48)  # block width that is no multiple of 32
    with pytest.raises(ValueError, match="fp8 block size 48x48 does not fit"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", t2)


def test_explicit_block_size_for_untidy_shapes(tier):
    """An explicit block_size (256-row blocks straddling the gate and up rows of w13)."""
    E, H, I, K = 4, 256, 384, 2
    tensors, d13, d2 = make_fp8_experts(E, H, I, bn=256, bk=128)  # 2I = 768 = 3 x 256
    layer = lk_moe.MoELayer.from_checkpoint("fp8_block", tensors, block_size=(256, 128))
    x = torch.randn(9, H).bfloat16()
    ids, w = random_routing(9, E, K)
    assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w,
                             weights_rounded=rounds_weights("fp8_block"))
