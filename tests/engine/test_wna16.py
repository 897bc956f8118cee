"""wna16_int4 experts (compressed-tensors WNA16 int4, as vLLM's CompressedTensorsWNA16[Marlin]MoEMethod
holds them after loading: K-first int32 packing, bf16/fp16 group scales, optional packed zero points)
against the fp32 reference on the dequantized weights, on every ISA tier this CPU has."""
import functools

import pytest
import torch

import lk_moe
from lk_moe.reference import dequantize_wna16_int4, random_routing, unpack_int4
from lvllm.testing.quantizers import pack_int4, quantize_int4 as quantize_int4_codes

from .conftest import (INT8_PREFILL_TIERS, assert_int8_budget as int8_budget, assert_matches_reference,
                       assert_nonfinite_input_propagates, check_int8_decode, int8_activations, rounds_weights)


# ------------------------------------------------------------------ vLLM's tensors
def quantize_int4(w: torch.Tensor, gs: int, asym: bool, scale_dtype=torch.bfloat16):
    """fp32 [E, N, K] -> vLLM's K-first tensors (packed [E, K/8, N], scale [E, K/gs, N], zero point
    [E, K/gs, N/8] or None) and the exact dequantized fp32 [E, N, K] ((q - zp) * scale in fp32)."""
    E, N, K = w.shape
    q, scale, zp = quantize_int4_codes(w, gs, asym, scale_dtype)
    deq = ((q.view(E, N, K // gs, gs) - zp[..., None]) * scale.float()[..., None]).view(E, N, K)
    # Checkpoint orientation: weight_packed [N, K/8] (along K), weight_zero_point [N/8, K/gs] (along N),
    # weight_scale [N, K/gs]; vLLM's loader transposes each to K-first.
    packed = pack_int4(q + 8).transpose(1, 2).contiguous()
    zero = pack_int4((zp + 8).transpose(1, 2)).contiguous() if asym else None
    return packed, scale.transpose(1, 2).contiguous(), zero, deq


@functools.lru_cache(maxsize=None)
def make_int4_experts(E, H, I, gs, asym, scale_dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    p13, s13, z13, d13 = quantize_int4(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, gs, asym, scale_dtype)
    p2, s2, z2, d2 = quantize_int4(torch.randn(E, H, I, generator=g) / I ** 0.5, gs, asym, scale_dtype)
    tensors = dict(w13_weight_packed=p13, w2_weight_packed=p2, w13_weight_scale=s13, w2_weight_scale=s2)
    if asym:
        tensors.update(w13_weight_zero_point=z13, w2_weight_zero_point=z2)
    return tensors, d13, d2


def build(tensors, int8_act=False, **kw):
    """A wna16_int4 layer; by default with exact bf16 activations (the rounding-bound tests)."""
    with int8_activations(int8_act):
        return lk_moe.MoELayer.from_checkpoint("wna16_int4", tensors, **kw)


@functools.lru_cache(maxsize=None)
def make_layer(E, H, I, gs, asym, scale_dtype=torch.bfloat16, int8_act=False):
    tensors, d13, d2 = make_int4_experts(E, H, I, gs, asym, scale_dtype)
    return build(tensors, int8_act), d13, d2


# ------------------------------------------------------------------ (a) the reference dequantization
def test_pack_convention_by_hand():
    # codes 1..8 in element order -> nibbles 1..8 from the least significant one: 0x87654321
    word = pack_int4(torch.arange(1, 9))
    assert word.item() == 0x87654321 - 2 ** 32
    assert unpack_int4(word.view(1), 0).tolist() == list(range(1, 9))


@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("gs", [32, 128])
def test_reference_dequantization_is_exact(gs, asym):
    E, N, K = 3, 200, 256  # N = 200: zero points pack 25 words per group row
    w = torch.randn(E, N, K)
    for scale_dtype in (torch.bfloat16, torch.float16):
        packed, scale, zero, deq = quantize_int4(w, gs, asym, scale_dtype)
        assert packed.shape == (E, K // 8, N) and packed.dtype == torch.int32
        assert scale.shape == (E, K // gs, N)
        if asym:
            assert zero.shape == (E, K // gs, N // 8)
        got = dequantize_wna16_int4(packed, scale, zero)
        assert got.dtype == torch.float32 and got.shape == (E, N, K)
        assert torch.equal(got, deq)  # bit for bit
        assert (got - w).abs().max() < scale.float().max() * 0.51 + 1e-6  # and it is a quantization of w


# ------------------------------------------------------------------ (b) the layer on every tier
MS = (1, 5, 64, 600)


@pytest.mark.parametrize("asym", [False, True], ids=["sym", "asym"])
@pytest.mark.parametrize("gs", [32, 128])
@pytest.mark.parametrize("H,I,E,K", [(2048, 768, 4, 2),    # Qwen3-30B-A3B expert shape, fewer experts
                                     (1152, 384, 5, 3)])   # TP=2 shard of I, odd H-block count (72)
def test_wna16_every_tier(tier, H, I, E, K, gs, asym):
    layer, d13, d2 = make_layer(E, H, I, gs, asym)
    assert layer.format == "wna16_int4"
    for M in MS:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w,
                                 weights_rounded=rounds_weights("wna16_int4", gs))


def test_wna16_group32_amx_prefill_rounds_code_times_scale_to_bf16_once():
    """The amx tier's group-32 prefill (16+ rows an expert) runs its tiles over bf16(code x scale): the
    exact-math bound holds against the reference on those rounded weights, and every rounding is the
    nearest bf16 (a truncation, a double rounding or a scale applied twice breaks the tight bound)."""
    if "amx" not in lk_moe.supported_isas():
        pytest.skip("no AMX on this CPU")
    before = lk_moe.isa()
    lk_moe.set_isa("amx")
    try:
        for asym in (False, True):
            layer, d13, d2 = make_layer(4, 2048, 768, 32, asym)
            x = torch.randn(600, 2048).bfloat16()  # ~300 rows an expert: every expert on the AMX tiles
            ids, w = random_routing(600, 4, 2)
            out = layer.forward(x, ids, w)
            assert_matches_reference(out, x, d13.bfloat16(), d2.bfloat16(), ids, w)
            assert_matches_reference(out, x, d13, d2, ids, w, weights_rounded=True)
    finally:
        lk_moe.set_isa(before)


@pytest.mark.parametrize("gs,asym", [(32, False), (128, True)], ids=["g32-sym", "g128-asym"])
def test_wna16_decode_takes_15_bit_activations(tier, gs, asym, acts_setting):
    """Decode chunks (<= 16 tokens) on every tier but generic, by default: x and the activation as q15 rows
    (test_fp4_q15.q15 emulates them in torch), every code x q product summed exactly in integers. The exact-
    math bound holds (bf16's error), and against the q15-emulating reference the relative RMS error is the
    output's bf16 rounding alone (measured 0.00165; bound 2^-9): a lost low half (lo) or a wrong 128 x hi
    shows there. The tight element bound of the fp4 formats does not carry over: int4's fp32 group-scale
    products make a few activations round to the other bf16 neighbour than the reference's (one element
    measured at 4e-5 mag). Not the vdpbf16ps tile's output, not the int8 rows' (their error is 5x)."""
    from .test_fp4_q15 import q15
    from lk_moe.reference import moe_reference
    layer, d13, d2 = make_layer(4, 2048, 768, gs, asym)
    int8_layer = make_layer(4, 2048, 768, gs, asym, int8_act=True)[0]
    for M in (1, 4, 5, 16):
        x = torch.randn(M, 2048).bfloat16()
        ids, w = random_routing(M, 4, 2)
        out = layer.forward(x, ids, w)
        assert_matches_reference(out, x, d13, d2, ids, w)
        if tier == "generic":  # no q15 rows there: the exact tiles
            continue
        ref = moe_reference(q15(x), d13, d2, ids, w, act_round=lambda a: q15(a.bfloat16()))
        rel = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
        assert rel <= 2 ** -9, f"relative RMS {rel:.3g} against the q15 reference"
        lk_moe._C._set_fp4_decode_acts("bf16")
        assert not torch.equal(layer.forward(x, ids, w), out)
        lk_moe._C._set_fp4_decode_acts("q15")
        with pytest.raises(AssertionError, match="relative RMS"):
            assert_matches_reference(int8_layer.forward(x, ids, w), x, d13, d2, ids, w)


def test_wna16_fp16_scales_and_activations(tier):
    layer, d13, d2 = make_layer(4, 512, 256, 64, True, torch.float16)
    for M in (1, 3, 40):
        x = torch.randn(M, 512).half()
        ids, w = random_routing(M, 4, 2)
        out = layer.forward(x, ids, w)
        assert out.dtype == torch.float16
        assert_matches_reference(out, x, d13, d2, ids, w)


def test_wna16_channel_groups(tier):
    """Channel strategy (one scale per row: gs = K, here larger than the engine's 256-input segment)."""
    E, H, I = 3, 512, 320
    g = torch.Generator().manual_seed(5)
    p13, s13, _, d13 = quantize_int4(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, H, False)
    p2, s2, _, d2 = quantize_int4(torch.randn(E, H, I, generator=g) / I ** 0.5, I, False)
    layer = build(dict(w13_weight_packed=p13, w2_weight_packed=p2, w13_weight_scale=s13, w2_weight_scale=s2))
    for M in (1, 9):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, 2)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


# ------------------------------------------------------------------ (b') int8 activations (decode)
# Budget and its derivation: conftest.assert_int8_budget. Measured for wna16_int4: rel RMS of the
# layer output 0.0120-0.0126 (2^-6.4) for every group size, sym/asym, M = 1, 5, 16 on the
# Qwen3-30B-A3B shape (phase 1 alone ~0.008, phase 2 alone ~0.009, torch emulation), against
# 0.0033-0.0036 for the exact bf16 path. Why this is the default: the int4 weights themselves are
# ~11% (RMS) away from the weights they quantize (step max|w| / 7.5 over 128 Gaussian weights,
# uniform rounding), so 1.2% more from the activations adds < 0.1% to the model's error against its
# unquantized original; llama.cpp runs its 4-bit CPU matmuls the same way.


def assert_int8_budget(out, x, d13, d2, ids, w):
    return int8_budget(out, x, d13.bfloat16(), d2.bfloat16(), ids, w)


@pytest.mark.parametrize("asym", [False, True], ids=["sym", "asym"])
@pytest.mark.parametrize("gs", [32, 128])
@pytest.mark.parametrize("H,I,E,K", [(2048, 768, 4, 2), (1152, 384, 5, 3)])
def test_wna16_int8_activations_every_tier(tier, H, I, E, K, gs, asym):
    layer, d13, d2 = make_layer(E, H, I, gs, asym, int8_act=True)
    check_int8_decode(layer, tier, E, K, MS, lambda out, x, ids, w: assert_int8_budget(out, x, d13, d2, ids, w),
                      lambda out, x, ids, w: assert_matches_reference(out, x, d13, d2, ids, w))


def test_int8_prefill_runs_on_the_int8_tiles_where_they_are_faster(tier):
    """LK_INT8_ACT=1, a prefill-sized chunk (64 tokens): on avx512 / avx512_bf16 the int8 tiles (its output
    differs from the exact path's by the activations' rounding, within the int8 budget); on amx (AMX-BF16
    panels) and the tiers without int8 kernels the exact path, bit for bit."""
    E, H, I, K, M = 4, 1024, 384, 2, 64
    tensors, d13, d2 = make_int4_experts(E, H, I, 32, True, torch.bfloat16)
    exact, int8 = build(tensors, False), build(tensors, True)
    x = torch.randn(M, H).bfloat16()
    ids, w = random_routing(M, E, K)
    out_exact, out_int8 = exact.forward(x, ids, w), int8.forward(x, ids, w)
    if tier in INT8_PREFILL_TIERS:
        assert not torch.equal(out_exact, out_int8)
        assert int8_budget(out_int8, x, d13.bfloat16(), d2.bfloat16(), ids, w) > 2.0 ** -9
    else:
        assert torch.equal(out_exact, out_int8)


def test_wna16_int8_activations_fp16_and_channel(tier):
    """fp16 scales and inputs, zero points, and the channel strategy (gs = K > 256) on the int8 path."""
    layer, d13, d2 = make_layer(4, 512, 256, 64, True, torch.float16, int8_act=True)
    for M in (1, 3, 16):
        x = torch.randn(M, 512).half()
        ids, w = random_routing(M, 4, 2)
        out = layer.forward(x, ids, w)
        assert out.dtype == torch.float16
        assert_int8_budget(out, x.bfloat16(), d13, d2, ids, w)
    E, H, I = 3, 512, 320
    g = torch.Generator().manual_seed(5)
    p13, s13, _, c13 = quantize_int4(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, H, False)
    p2, s2, _, c2 = quantize_int4(torch.randn(E, H, I, generator=g) / I ** 0.5, I, False)
    layer = build(dict(w13_weight_packed=p13, w2_weight_packed=p2, w13_weight_scale=s13, w2_weight_scale=s2), True)
    for M in (1, 9):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, 2)
        assert_int8_budget(layer.forward(x, ids, w), x, c13, c2, ids, w)


def test_wna16_int8_activations_nonfinite_input_propagates():
    layer, _, _ = make_layer(4, 512, 256, 64, True, torch.float16, int8_act=True)
    assert_nonfinite_input_propagates(layer, 512)


@pytest.mark.parametrize("gs,asym", [(32, True), (128, False)])
def test_wna16_memory_stays_4bit(gs, asym):
    """Packed layer within 1.05x of the checkpoint bytes (32 experts of the Qwen3-30B-A3B shape, so
    that the 2 MiB rounding of each host buffer is small; random codes: only the sizes matter)."""
    E, H, I = 32, 2048, 768
    t = dict(w13_weight_packed=torch.randint(-2 ** 31, 2 ** 31 - 1, (E, H // 8, 2 * I), dtype=torch.int32),
             w2_weight_packed=torch.randint(-2 ** 31, 2 ** 31 - 1, (E, I // 8, H), dtype=torch.int32),
             w13_weight_scale=torch.rand(E, H // gs, 2 * I).bfloat16(), w2_weight_scale=torch.rand(E, I // gs, H).bfloat16())
    if asym:
        t.update(w13_weight_zero_point=torch.randint(0, 2 ** 31 - 1, (E, H // gs, 2 * I // 8), dtype=torch.int32),
                 w2_weight_zero_point=torch.randint(0, 2 ** 31 - 1, (E, I // gs, H // 8), dtype=torch.int32))
    layer = lk_moe.MoELayer.from_checkpoint("wna16_int4", t)
    assert layer.expert_bytes == sum(v.numel() * v.element_size() for v in t.values())
    assert layer.expert_bytes < E * 3 * H * I * 0.6  # about half a byte per weight
    assert layer.nbytes <= 1.05 * layer.expert_bytes


def test_wna16_split_across_numa_slices(tmp_path):
    from .fake_sysfs import make_sysfs
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    pool = lk_moe.make_pool(threads=3, binding="NONE", sysfs_root=root, allowed=list(range(6)))
    tensors, d13, d2 = make_int4_experts(4, 512, 384, 32, True)
    layer = build(tensors, pool=pool)
    assert layer.num_slices == 3
    for M in (1, 40):
        x = torch.randn(M, 512).bfloat16()
        ids, w = random_routing(M, 4, 2)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w,
                                 weights_rounded=rounds_weights("wna16_int4"))


def test_wna16_identity_g_idx_is_accepted():
    tensors, d13, d2 = make_int4_experts(2, 256, 128, 32, False)
    E, H, I = 2, 256, 128
    g_idx = dict(w13_weight_g_idx=(torch.arange(H) // 32).int().expand(E, H).contiguous(),
                 w2_weight_g_idx=(torch.arange(I) // 32).int().expand(E, I).contiguous(),
                 w13_weight_shape=torch.tensor([[2 * I, H]] * E).float(), w2_weight_shape=torch.tensor([[H, I]] * E).float())
    layer = build(dict(tensors, **g_idx))
    x = torch.randn(3, H).bfloat16()
    ids, w = random_routing(3, E, 2)
    assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


# ------------------------------------------------------------------ (c) bad inputs
def test_wna16_bad_tensors_are_named():
    tensors, _, _ = make_int4_experts(2, 256, 128, 32, True)

    def build(**change):
        t = dict(tensors, **change)
        return lk_moe.MoELayer.from_checkpoint("wna16_int4", {k: v for k, v in t.items() if v is not None})

    with pytest.raises(ValueError, match="needs tensor\\(s\\) w2_weight_scale"):
        build(w2_weight_scale=None)
    with pytest.raises(TypeError, match="w13_weight_packed must be int32"):
        build(w13_weight_packed=tensors["w13_weight_packed"].float())
    with pytest.raises(TypeError, match="w2_weight_scale must be bfloat16 or float16"):
        build(w2_weight_scale=tensors["w2_weight_scale"].float())
    with pytest.raises(TypeError, match="must have the same dtype"):
        build(w2_weight_scale=tensors["w2_weight_scale"].half())
    with pytest.raises(TypeError, match="w2_weight_zero_point must be int32"):
        build(w2_weight_zero_point=tensors["w2_weight_zero_point"].to(torch.uint8))
    with pytest.raises(ValueError, match="w13_weight_zero_point is missing"):
        build(w13_weight_zero_point=None)
    with pytest.raises(ValueError, match="w13_weight_packed must be \\[E, H/8, 2\\*I\\]"):
        build(w13_weight_packed=tensors["w13_weight_packed"][0])
    with pytest.raises(ValueError, match="w2_weight_packed must have shape \\[E, I/8, H\\]"):  # N-first (checkpoint) layout
        build(w2_weight_packed=tensors["w2_weight_packed"].transpose(1, 2).contiguous())
    with pytest.raises(ValueError, match="w13_weight_scale must be \\[E, H/group_size, 2\\*I\\]"):
        build(w13_weight_scale=tensors["w13_weight_scale"][:, :, :128].contiguous())
    with pytest.raises(ValueError, match="w2_weight_scale must be \\[E, I/group_size, H\\]"):
        build(w2_weight_scale=torch.ones(2, 3, 256, dtype=torch.bfloat16))  # 3 groups do not tile I = 128
    with pytest.raises(ValueError, match="w2_weight_zero_point must have shape"):
        build(w2_weight_zero_point=tensors["w2_weight_zero_point"][:, :, :8].contiguous())
    with pytest.raises(ValueError, match="w13_weight_packed must be contiguous"):
        build(w13_weight_packed=tensors["w13_weight_packed"].transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="group sizes 16 .* not supported"):
        build(w13_weight_scale=torch.ones(2, 16, 256, dtype=torch.bfloat16),
              w13_weight_zero_point=torch.zeros(2, 16, 32, dtype=torch.int32))
    perm = torch.randperm(256).expand(2, 256) // 32
    with pytest.raises(ValueError, match="w13_weight_g_idx is not the identity grouping.*act-order"):
        build(w13_weight_g_idx=perm.int().contiguous())
    with pytest.raises(TypeError, match="w2_weight_zero_point must be a torch.Tensor"):
        lk_moe.MoELayer.from_checkpoint("wna16_int4", dict(tensors, w2_weight_zero_point=[1, 2]))
    layer = build()
    with pytest.raises(ValueError, match="this layer has 4-bit weights .*use quant4_slices"):
        layer._impl.packed_slices()
