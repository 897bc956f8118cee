"""mxfp8 experts (OCP MX FP8: e4m3 codes, an e8m0 scale per output row and 32 inputs; ModelOpt MXFP8, MiniMax-M3's
release; vLLM's ModelOptMxFp8FusedMoE tensors) against the fp32 reference on the dequantized weights, on every ISA
tier this CPU has. code x 2^k is exact in bf16, so the engine computes with exactly the checkpoint's weights."""
import pytest
import torch

import lk_moe
from lk_moe.reference import dequantize_mxfp8, random_routing
from lvllm.testing.quantizers import quantize_mxfp8

from .conftest import assert_matches_reference


def make_mxfp8_experts(E, H, I, seed=0, spread=0):
    """Random experts in mxfp8; spread: each row's 32-input groups scaled by 2^[-spread, spread] first, so the e8m0
    scales of one block's rows and segments differ (a scale taken from the wrong row or segment shows)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    if spread:
        for w in (w13, w2):
            k = torch.randint(-spread, spread + 1, (*w.shape[:2], w.shape[2] // 32), generator=g).float()
            w.mul_(torch.exp2(k).repeat_interleave(32, dim=-1))
    q13, s13 = quantize_mxfp8(w13)
    q2, s2 = quantize_mxfp8(w2)
    tensors = dict(w13_weight=q13, w2_weight=q2, w13_weight_scale=s13, w2_weight_scale=s2)
    return tensors, dequantize_mxfp8(q13, s13), dequantize_mxfp8(q2, s2)


@pytest.mark.parametrize("H,I", [(6144, 3072), (2048, 768), (2048, 384), (288, 96)])  # MiniMax-M3, Qwen3-30B, TP=2
def test_mxfp8_every_tier(tier, H, I):
    E, K = (2, 2) if H > 4096 else (8, 4)
    tensors, d13, d2 = make_mxfp8_experts(E, H, I, seed=H + I, spread=3)
    layer = lk_moe.MoELayer.from_checkpoint("mxfp8", tensors)
    assert layer.format == "mxfp8"
    for M in (1, 3, 16, 70) if H > 4096 else (1, 3, 16, 70, 300):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


def test_mxfp8_swigluoai_as_minimax_m3(tier):
    """MiniMax-M3's experts: swigluoai on [gate; up] rows (vLLM's swigluoai_uninterleave), alpha 1.702, limit 7."""
    E, H, I, K = 4, 512, 256, 2
    tensors, d13, d2 = make_mxfp8_experts(E, H, I, seed=11, spread=2)
    layer = lk_moe.MoELayer.from_checkpoint("mxfp8", tensors, activation="swigluoai", swiglu_limit=7.0)
    for M in (1, 40):
        x = (torch.randn(M, H) * 4).bfloat16()  # pre-activations past the clamps
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w, activation="swigluoai")


# scale bytes [lo, hi): 2^-20..2^4; 2^-127..2^-122; 2^117..2^123 (the avx2 panels' value-by-value path from 2^120),
# there with codes below 8 in magnitude (magnitude bytes < 0x50): larger ones times 2^123 are no fp32 number
@pytest.mark.parametrize("lo,hi,top", [(107, 132, 0x7F), (0, 6, 0x7F), (244, 251, 0x50)])
def test_every_code_and_scale_extremes(tier, lo, hi, top):
    """Every finite e4m3 code (subnormals included) under scales at both ends of e8m0's range, as the reference
    computes them (inputs sized so the products stay finite, and normal: the bf16 dot-product tiers, avx512_bf16's
    VDPBF16PS and AMX-BF16, read subnormal bf16 inputs as zero whatever MXCSR says)."""
    E, H, I, K = 4, 256, 128, 2
    g = torch.Generator().manual_seed(3)
    codes = torch.cat([torch.arange(0, top), torch.arange(128, 128 + top)]).to(torch.uint8)
    def draw(*shape):
        return codes[torch.randint(0, len(codes), shape, generator=g)].view(torch.float8_e4m3fn)
    q13, q2 = draw(E, 2 * I, H), draw(E, H, I)
    s13 = torch.randint(lo, hi, (E, 2 * I, H // 32), generator=g).to(torch.uint8)
    s2 = torch.full((E, H, I // 32), 127, dtype=torch.uint8)  # unit: the activation's magnitude stays in range
    layer = lk_moe.MoELayer.from_checkpoint(
        "mxfp8", dict(w13_weight=q13, w2_weight=q2, w13_weight_scale=s13, w2_weight_scale=s2))
    d13, d2 = dequantize_mxfp8(q13, s13), dequantize_mxfp8(q2, s2)
    scale = 2.0 ** -((lo + hi) // 2 - 127)  # inputs that take gate / up back to ~unit size
    for M in (1, 5, 40):
        r = torch.randn(M, H, generator=g)
        amp = min(max(1e-3 * scale, 2.0 ** -120), 1e27)
        x = (r.sign() * r.abs().clamp(min=0.125) * amp).bfloat16()  # |x| >= 2^-123: normal
        ids, w = random_routing(M, E, K, generator=g)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


@pytest.mark.parametrize("where", ["w13 code", "w2 code", "w13 scale", "w2 scale"])
def test_a_nan_reaches_the_output(tier, where):
    """e4m3's NaN codes and the e8m0 NaN scale (255) are NaN in the result: a broken checkpoint shows."""
    E, H, I = 2, 256, 128
    tensors, _, _ = make_mxfp8_experts(E, H, I, seed=5)
    proj, what = where.split()
    key = f"{proj}_weight" + ("_scale" if what == "scale" else "")
    t = tensors[key].view(torch.uint8).clone()
    t[1, 7, 3] = 255 if what == "scale" else 0x7F
    tensors[key] = t if what == "scale" else t.view(torch.float8_e4m3fn)
    layer = lk_moe.MoELayer.from_checkpoint("mxfp8", tensors)
    for M in (1, 16, 200):
        x = torch.randn(M, H).bfloat16()
        for expert in (0, 1):
            ids = torch.full((M, 1), expert, dtype=torch.int32)
            y = layer.forward(x, ids, torch.ones(M, 1))
            assert bool(torch.isnan(y).any()) == (expert == 1), (where, M, expert)


def test_mxfp8_memory_is_the_checkpoint_bytes():
    tensors, _, _ = make_mxfp8_experts(16, 2048, 768)
    layer = lk_moe.MoELayer.from_checkpoint("mxfp8", tensors)
    source = sum(t.numel() * t.element_size() for t in tensors.values())
    assert layer.expert_bytes == source and layer.nbytes <= 1.001 * source  # 1 + 1/32 bytes a weight


def test_mxfp8_bad_tensors_are_named():
    tensors, _, _ = make_mxfp8_experts(2, 256, 128)
    with pytest.raises(ValueError, match="needs tensor\\(s\\) w2_weight_scale"):
        lk_moe.MoELayer.from_checkpoint("mxfp8", {k: v for k, v in tensors.items() if k != "w2_weight_scale"})
    with pytest.raises(TypeError, match="w13_weight must be float8_e4m3fn for mxfp8"):
        lk_moe.MoELayer.from_checkpoint("mxfp8", dict(tensors, w13_weight=tensors["w13_weight"].float()))
    with pytest.raises(TypeError, match="w2_weight_scale must be uint8"):
        lk_moe.MoELayer.from_checkpoint("mxfp8", dict(tensors, w2_weight_scale=tensors["w2_weight_scale"].float()))
    with pytest.raises(ValueError, match="w13_weight_scale must .*\\[2, 256, 8\\]"):
        lk_moe.MoELayer.from_checkpoint("mxfp8", dict(tensors, w13_weight_scale=tensors["w13_weight_scale"][:, :, :4].contiguous()))
    with pytest.raises(ValueError, match="interleaved gate/up rows"):
        lk_moe.MoELayer.from_checkpoint("mxfp8", tensors, interleaved=True)


def test_panel_scale_range_keeps_every_product_exact_in_bf16():
    """The AVX-512 prefill panels (csrc/cpu/kernels/fp8.cpp mx_bf16_panel_block) store code x 2^(e - 127) as bf16 for
    scale bytes 10..246: every e4m3 code times every such scale is a normal bf16 number, exactly; one step past either
    end is not (so those tasks keep the per-segment path)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    codes = codes[torch.isfinite(codes) & (codes != 0)]
    for e in range(10, 247):
        p = codes * 2.0 ** (e - 127)
        assert torch.equal(p.bfloat16().float(), p) and bool((p.abs() >= 2.0 ** -126).all()), e
    assert not bool(((codes * 2.0 ** (9 - 127)).abs() >= 2.0 ** -126).all())
    assert not bool(torch.isfinite((codes * 2.0 ** (247 - 127)).bfloat16()).all())
