"""nvfp4 experts (ModelOpt NVFP4, as vLLM 0.33.0's ModelOptNvFp4FusedMoE holds them after loading and
before process_weights_after_loading: uint8 e2m1 code pairs, float8_e4m3fn block scales per 16 inputs,
fp32 global scales per expert projection [E, 2] (gate, up) / [E], optional fp32 input scales) against
an independent decoder and the fp32 reference on the dequantized weights, on every ISA tier this CPU has.

Tolerance of the layer tests (conftest.assert_matches_reference, applied unchanged): the engine turns
code x block scale into bf16 exactly (an e2m1 value has 2 significant bits, an e4m3 scale 4: the product
has <= 6 and lies inside bf16's range), accumulates in fp32 and multiplies the sums by the global scale
in fp32. The reference multiplies the same activations with weights code x scale x global rounded to
fp32 once. So the two differ by fp32 roundings (~1e-7 relative: inside the 1e-5 * mag term) plus what
the engine rounds to bf16 on purpose, as GPU kernels do: the SwiGLU output (u * mag, u = 2^-8) and the
output (u * |ref|). Per element |out - ref| <= 1.01 u (mag + |ref|) + 1e-5 mag, and the relative RMS
error <= 2^-8. A wrong nibble order, scale, global scale (gate and up differ here) or block breaks both
by orders of magnitude."""
import functools
import math
import os

import pytest
import torch

import lk_moe
from lk_moe.reference import (dequantize_nvfp4, dequantize_nvfp4_experts, moe_torch_baseline_nvfp4,
                              random_routing)

from .conftest import (assert_int8_budget, assert_matches_reference, assert_nonfinite_input_propagates,
                       check_int8_decode, int8_activations, vllm_dequantize_nvfp4, with_changes)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # magnitudes of codes 0..7 (code | 8: negative)
NAMES = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2",
         "w2_weight_scale_2")


# ------------------------------------------------------------------ an independent decoder
def e2m1_value(code: int) -> float:
    """From the bits: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    e, m = (code >> 1) & 3, code & 1
    v = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -v if code & 8 else v


def e4m3fn_value(b: int) -> float:
    """From the bits: sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0; 0x7F/0xFF NaN."""
    if b & 0x7F == 0x7F:
        return math.nan
    e, m = (b >> 3) & 15, b & 7
    v = m * 2.0 ** -9 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)
    return -v if b & 0x80 else v


E2M1_BY_CODE = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
E4M3_BY_BYTE = torch.tensor([e4m3fn_value(b) for b in range(256)], dtype=torch.float64)


def decode_independent(packed: torch.Tensor, scale_bytes: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """Element k of a row = byte k // 2, low nibble when k is even; group k // 16; the exact
    product in float64 (<= 30 significant bits) rounded to fp32 once. gs: [..., 1] per row."""
    K = packed.shape[-1] * 2
    k = torch.arange(K)
    nib = (packed[..., k // 2].long() >> (4 * (k % 2))) & 15
    v = E2M1_BY_CODE[nib] * E4M3_BY_BYTE[scale_bytes[..., k // 16].long()] * gs.double()
    return v.float()


def random_nvfp4(shape, K, target_rms, gen, gs):
    """Random codes [*shape, K/2] and positive fp8 block scales around the value giving entries of rms
    ~target_rms with the global scale gs of each row (shape `shape`; uniform codes have rms 2.93)."""
    codes = torch.randint(0, 256, (*shape, K // 2), generator=gen, dtype=torch.uint8)
    base = target_rms / 2.93 / gs[..., None]
    jitter = torch.exp2(torch.rand(*shape, K // 16, generator=gen) * 1.5 - 0.75)
    scale = (base * jitter).to(torch.float8_e4m3fn)
    return codes, scale


@functools.lru_cache(maxsize=None)
def make_nvfp4(E, H, I, h_std=1.0, seed=0, input_scales=True):
    """vLLM's tensors (gate and up global scales differ) and the dense fp32 weights they encode."""
    g = torch.Generator().manual_seed(seed)
    g13 = torch.exp2(torch.rand(E, 2, generator=g) * 4 - 9)  # 2^-9 .. 2^-5, gate != up
    g2 = torch.exp2(torch.rand(E, generator=g) * 4 - 9)
    c13, s13 = random_nvfp4((E, 2 * I), H, h_std / H ** 0.5, g, g13.repeat_interleave(I, dim=1))
    c2, s2 = random_nvfp4((E, H), I, 1.0 / I ** 0.5, g, g2[:, None].expand(E, H))
    t = dict(w13_weight=c13, w2_weight=c2, w13_weight_scale=s13, w2_weight_scale=s2, w13_weight_scale_2=g13,
             w2_weight_scale_2=g2)
    if input_scales:
        t.update(w13_input_scale=torch.rand(E, 2, generator=g) * 0.01,
                 w2_input_scale=torch.rand(E, generator=g) * 0.01)
    d13 = decode_independent(c13, s13.view(torch.uint8), g13.repeat_interleave(I, dim=1)[:, :, None])
    d2 = decode_independent(c2, s2.view(torch.uint8), g2[:, None, None])
    return t, d13, d2


def _layer(tensors, int8_act=False, **kw):
    """An nvfp4 layer; by default with exact bf16 activations (the rounding-bound tests)."""
    with int8_activations(int8_act):
        return lk_moe.MoELayer.from_checkpoint("nvfp4", tensors, **kw)


# ------------------------------------------------------------------ (a) dequantization, bit for bit
def test_format_by_hand():
    # byte 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); 0x9A: code 10 (-1.0), code 9 (-0.5)
    codes = torch.tensor([[0x21, 0x9A] + [0x00] * 6], dtype=torch.uint8)
    scale = torch.tensor([[0x3C]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # e4m3 0x3C = 1.5
    got = dequantize_nvfp4(codes, scale, 2.0)
    assert got[0, :4].tolist() == [1.5, 3.0, -3.0, -1.5]
    every = torch.arange(16, dtype=torch.uint8)
    one = torch.tensor([[0x38]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # 1.0
    got = dequantize_nvfp4((every[0::2] | (every[1::2] << 4)).view(1, 8), one, 1.0)
    assert got[0].tolist() == E2M1 + [-v for v in E2M1]
    assert [e4m3fn_value(b) for b in (0x01, 0x08, 0x7E)] == [2.0 ** -9, 2.0 ** -6, 448.0]
    nan = torch.tensor([[0x7F]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert math.isnan(dequantize_nvfp4(torch.full((1, 8), 0x22, dtype=torch.uint8), nan, 1.0)[0, 0].item())


def _random_exhaustive(E, N, K, seed):
    """Every code, every finite e4m3 byte (signs and subnormals included), global scales with full
    24-bit mantissas: the products need real rounding to fp32."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (E, N, K // 2), generator=g, dtype=torch.uint8)
    sb = torch.randint(0, 256, (E, N, K // 16), generator=g, dtype=torch.uint8)
    sb = torch.where((sb & 0x7F) == 0x7F, sb ^ 0x01, sb)  # no NaN (checked by hand above)
    gs = torch.rand(E, generator=g) * 1e-2 + 1e-4
    return codes, sb, gs


@pytest.mark.parametrize("K", [16, 48, 160])
def test_reference_dequantization_is_exact(K):
    codes, sb, gs = _random_exhaustive(3, 40, K, K)
    want = decode_independent(codes, sb, gs[:, None, None])
    got = dequantize_nvfp4(codes, sb.view(torch.float8_e4m3fn), gs[:, None, None])
    assert got.dtype == torch.float32 and got.shape == (3, 40, K)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit (signed zeros too)


@pytest.mark.parametrize("E,H,I", [(2, 64, 32), (3, 176, 80), (2, 512, 256)])
def test_engine_dequantization_is_exact(E, H, I):
    """The engine's packed copy (codes, fp8 block scales, per-shard global scales, H and I not multiples
    of 32 included) decodes to the independent decoder's values bit for bit."""
    c13, sb13, _ = _random_exhaustive(E, 2 * I, H, 1)
    c2, sb2, g2 = _random_exhaustive(E, H, I, 2)
    g13 = torch.rand(E, 2) * 1e-2 + 1e-4
    t = dict(w13_weight=c13, w2_weight=c2, w13_weight_scale=sb13.view(torch.float8_e4m3fn),
             w2_weight_scale=sb2.view(torch.float8_e4m3fn), w13_weight_scale_2=g13, w2_weight_scale_2=g2)
    layer = _layer(t)
    assert (layer.format, layer.num_experts, layer.hidden_size, layer.intermediate_size) == ("nvfp4", E, H, I)
    w13, w2 = layer.dequantized()
    want13 = decode_independent(c13, sb13, g13.repeat_interleave(I, dim=1)[:, :, None])
    want2 = decode_independent(c2, sb2, g2[:, None, None])
    assert torch.equal(w13.view(torch.int32), want13.view(torch.int32))
    assert torch.equal(w2.view(torch.int32), want2.view(torch.int32))
    ref13, ref2 = dequantize_nvfp4_experts(t)
    assert torch.equal(ref13.view(torch.int32), want13.view(torch.int32))
    assert torch.equal(ref2.view(torch.int32), want2.view(torch.int32))


def test_nibble_order_matches_vllm():
    """vLLM's own NVFP4 decoder (nvfp4_emulation_utils.dequantize_to_dtype: its CPU path through
    break_fp4_bytes, or on a CUDA machine its Triton kernel) agrees with ours; global scale 1, so every
    product is exact on both sides."""
    codes, sb, _ = _random_exhaustive(1, 24, 64, 5)
    sb = sb & 0x7F  # vLLM's emulation path is for scales as ModelOpt writes them (positive)
    theirs = vllm_dequantize_nvfp4(codes[0], sb[0].view(torch.float8_e4m3fn), torch.ones(1))
    ours = dequantize_nvfp4(codes[0], sb[0].view(torch.float8_e4m3fn), 1.0)
    assert torch.equal(theirs, ours)


# ------------------------------------------------------------------ (b) the layer on every tier
MS = (1, 5, 64, 600)


@pytest.mark.parametrize("H,I,E,K", [(96, 64, 3, 2),        # small, exact multiples of 32
                                     (176, 80, 4, 3),       # H, I multiples of 16 only (a padded group)
                                     (2048, 768, 3, 2)])    # Qwen3-30B-A3B expert shape, few experts
def test_nvfp4_every_tier(tier, H, I, E, K):
    tensors, d13, d2 = make_nvfp4(E, H, I)
    layer = _layer(tensors)
    assert layer.format == "nvfp4" and layer.hidden_size == H and layer.intermediate_size == I
    ms = MS if H < 2048 or tier != "generic" else (1, 5, 64)  # the scalar tier is slow at 2048 x 768 x 600 rows
    for M in ms:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)


def test_nvfp4_fp16_activations_and_unused_slots(tier):
    E, H, I = 4, 256, 192
    tensors, d13, d2 = make_nvfp4(E, H, I)
    layer = _layer(tensors)
    x = torch.randn(7, H).half()
    ids, w = random_routing(7, E, 2)
    ids[2, 1] = -1
    out = layer.forward(x, ids, w)
    assert out.dtype == torch.float16
    assert_matches_reference(out, x, d13, d2, ids, w)


# ------------------------------------------------------------------ (b') int8 activations (decode)
# Budget: conftest.assert_int8_budget (derivation there). The e2m1 codes become exact integers (2 x
# e2m1), the fp8 block scales and global scales are applied in fp32, so the only extra error is the
# int8 rounding of the activations per 32 inputs (two weight blocks of 16 share one activation scale).
# Measured (this data): rel RMS 0.0121-0.0123 at M = 1, 5, 16 on the Qwen3-30B-A3B shape,
# 0.011-0.014 on the small shapes (exact path 0.0022-0.0025).
@pytest.mark.parametrize("H,I,E,K", [(176, 80, 4, 3),       # H, I multiples of 16 only (a padded group)
                                     (2048, 768, 3, 2)])    # Qwen3-30B-A3B expert shape
def test_nvfp4_int8_activations_every_tier(tier, H, I, E, K):
    tensors, d13, d2 = make_nvfp4(E, H, I)
    layer = _layer(tensors, int8_act=True)
    ms = (1, 5, 16, 64) if H < 2048 or tier != "generic" else (1, 5)
    check_int8_decode(layer, tier, E, K, ms, lambda out, x, ids, w: assert_int8_budget(out, x, d13, d2, ids, w),
                      lambda out, x, ids, w: assert_matches_reference(out, x, d13, d2, ids, w))


def test_nvfp4_int8_activations_fp16_unused_slots_and_switch():
    """fp16 in/out and an unused slot on the int8 path; LK_INT8_ACT=0 and its first name
    LK_WNA16_INT8_ACT=0 both give the exact path (bit for bit the same output)."""
    E, H, I = 4, 256, 192
    tensors, d13, d2 = make_nvfp4(E, H, I)
    x = torch.randn(7, H).half()
    ids, w = random_routing(7, E, 2)
    ids[2, 1] = -1
    out = _layer(tensors, int8_act=True).forward(x, ids, w)
    assert out.dtype == torch.float16
    assert_int8_budget(out, x, d13, d2, ids, w)
    exact = _layer(tensors).forward(x, ids, w)
    assert_matches_reference(exact, x, d13, d2, ids, w)
    with int8_activations(False, name="LK_WNA16_INT8_ACT"):
        alias = lk_moe.MoELayer.from_checkpoint("nvfp4", tensors)
    assert torch.equal(alias.forward(x, ids, w), exact)
    if lk_moe.isa().startswith("avx512") or lk_moe.isa() == "amx":
        assert not torch.equal(out, exact)  # the switch switches
    with int8_activations(False):
        os.environ["LK_INT8_ACT"] = "maybe"
        with pytest.raises(ValueError, match="LK_INT8_ACT='maybe' is not a switch: use auto, 1/0"):
            lk_moe.MoELayer.from_checkpoint("nvfp4", tensors)


def test_nvfp4_int8_activations_nonfinite_input_propagates():
    tensors, *_ = make_nvfp4(4, 256, 192)
    assert_nonfinite_input_propagates(_layer(tensors, int8_act=True), 256)


def test_gate_and_up_global_scales_are_each_used():
    """vLLM's GPU kernels keep w13_weight_scale_2[:, 0] for both shards; the engine must not."""
    E, H, I = 2, 64, 32
    tensors, d13, d2 = make_nvfp4(E, H, I)
    assert not torch.equal(tensors["w13_weight_scale_2"][:, 0], tensors["w13_weight_scale_2"][:, 1])
    w13, _ = _layer(tensors).dequantized()
    assert torch.equal(w13, d13)
    same = dict(tensors, w13_weight_scale_2=tensors["w13_weight_scale_2"][:, :1].repeat(1, 2).contiguous())
    w13s, _ = _layer(same).dequantized()
    assert torch.equal(w13s[:, :I], d13[:, :I]) and not torch.equal(w13s[:, I:], d13[:, I:])


def test_nvfp4_memory_within_checkpoint_bytes():
    E, H, I = 8, 2048, 768
    tensors, d13, d2 = make_nvfp4(E, H, I)
    layer = _layer(tensors)
    src = sum(t.numel() * t.element_size() for t in tensors.values())
    assert layer.expert_bytes == src
    assert layer.nbytes <= 1.05 * src, (layer.nbytes, src)
    no_inputs = {k: tensors[k] for k in NAMES}
    assert _layer(no_inputs).expert_bytes == sum(t.numel() * t.element_size() for t in no_inputs.values())
    assert layer.nbytes <= 1.05 * _layer(no_inputs).expert_bytes


def test_baseline_matches_reference():
    E, H, I = 3, 96, 64
    tensors, d13, d2 = make_nvfp4(E, H, I)
    x = torch.randn(9, H)
    ids, w = random_routing(9, E, 2)
    base = moe_torch_baseline_nvfp4(x, tensors, ids, w)
    from lk_moe.reference import moe_reference
    torch.testing.assert_close(base, moe_reference(x, d13, d2, ids, w), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ (c) bad inputs
def test_nvfp4_rejects_bad_inputs():
    tensors, *_ = make_nvfp4(2, 96, 64)

    def bad(**kw):
        return with_changes(tensors, **kw)

    # missing tensors
    for name in NAMES:
        with pytest.raises(ValueError, match=name):
            _layer(bad(**{name: None}))
    with pytest.raises(ValueError, match="w2_input_scale is missing"):
        _layer(bad(w2_input_scale=None))
    # wrong dtypes
    for name, wrong in (("w13_weight", torch.int8), ("w2_weight", torch.float8_e4m3fn),
                        ("w13_weight_scale", torch.uint8), ("w2_weight_scale", torch.bfloat16),
                        ("w13_weight_scale_2", torch.bfloat16), ("w2_weight_scale_2", torch.float64),
                        ("w13_input_scale", torch.float16), ("w2_input_scale", torch.bfloat16)):
        t = tensors[name]
        arg = t.view(wrong) if t.element_size() == torch.empty(0, dtype=wrong).element_size() else t.to(wrong)
        with pytest.raises(ValueError, match=f"{name} must be"):
            _layer(bad(**{name: arg}))
    # wrong shapes
    with pytest.raises(ValueError, match="w13_weight must be"):
        _layer(bad(w13_weight=tensors["w13_weight"][0].contiguous()))
    with pytest.raises(ValueError, match="w2_weight must have shape"):
        _layer(bad(w2_weight=tensors["w2_weight"][:1].contiguous()))
    with pytest.raises(ValueError, match="w13_weight_scale must have shape"):
        _layer(bad(w13_weight_scale=tensors["w13_weight_scale"][:, :, :2].contiguous()))
    with pytest.raises(ValueError, match="w2_weight_scale must have shape"):
        _layer(bad(w2_weight_scale=tensors["w2_weight_scale"][:, :10].contiguous()))
    with pytest.raises(ValueError, match=r"w13_weight_scale_2 must have shape \[E, 2\]"):
        _layer(bad(w13_weight_scale_2=tensors["w13_weight_scale_2"][:, 0].contiguous()))  # after vLLM's post-load step
    with pytest.raises(ValueError, match="w13_weight_scale_2 is \\[E, 1\\]: non-gated"):
        _layer(bad(w13_weight_scale_2=tensors["w13_weight_scale_2"][:, :1].contiguous()))
    with pytest.raises(ValueError, match="w2_weight_scale_2 must have shape"):
        _layer(bad(w2_weight_scale_2=tensors["w2_weight_scale_2"][:, None].contiguous()))
    with pytest.raises(ValueError, match="w13_input_scale must be"):
        _layer(bad(w13_input_scale=tensors["w13_input_scale"][:1].contiguous()))
    with pytest.raises(ValueError, match="w2_input_scale must be"):
        _layer(bad(w2_input_scale=tensors["w2_input_scale"][:, None].contiguous()))
    # odd sizes: H or I not a multiple of the group size 16
    with pytest.raises(ValueError, match="w13_weight .* gives H = 88, not a multiple"):
        _layer(bad(w13_weight=tensors["w13_weight"][:, :, :44].contiguous()))
    with pytest.raises(ValueError, match="w13_weight .* gives I = 60, not a multiple"):
        _layer(bad(w13_weight=tensors["w13_weight"][:, :120].contiguous()))
    # layout and type
    with pytest.raises(ValueError, match="w13_weight must be contiguous"):
        _layer(bad(w13_weight=tensors["w13_weight"].transpose(0, 1).contiguous().transpose(0, 1)))
    with pytest.raises(TypeError, match="w13_input_scale must be a torch.Tensor"):
        _layer(bad(w13_input_scale=[1.0, 2.0]))
    with pytest.raises(ValueError, match="activation 'gelu'"):
        _layer(tensors, activation="gelu")
    layer = _layer(tensors)
    with pytest.raises(ValueError, match="x must have shape"):
        layer.forward(torch.randn(2, 64).bfloat16(), *random_routing(2, 2, 1))
    assert lk_moe.MoELayer.tensor_names("nvfp4") == (NAMES, ("w13_input_scale", "w2_input_scale"))


def test_int8_activations_are_off_unless_asked_for():
    """LK_INT8_ACT unset or auto: the 4-bit formats decode with 15-bit activations, bit for bit LK_INT8_ACT=0;
    LK_INT8_ACT=1 turns int8 on for all of them; the first name LK_WNA16_INT8_ACT=1 for wna16_int4 only."""
    from .test_wna16 import make_int4_experts
    if not (lk_moe.isa().startswith("avx512") or lk_moe.isa() == "amx"):
        pytest.skip("the int8-activation decode runs on the AVX-512 tiers")
    E, H, I = 4, 256, 192
    fp4, *_ = make_nvfp4(E, H, I)
    int4 = make_int4_experts(E, H, I, 64, False)[0]
    x = torch.randn(3, H).bfloat16()
    ids, w = random_routing(3, E, 2)

    def out(fmt, tensors, env):
        names = ("LK_INT8_ACT", "LK_WNA16_INT8_ACT")
        before = {n: os.environ.pop(n, None) for n in names}
        os.environ.update(env)
        try:
            return lk_moe.MoELayer.from_checkpoint(fmt, tensors).forward(x, ids, w)
        finally:
            for n in names:
                os.environ.pop(n, None)
                if before[n] is not None:
                    os.environ[n] = before[n]

    for fmt, t in (("nvfp4", fp4), ("wna16_int4", int4)):
        exact, on = out(fmt, t, {"LK_INT8_ACT": "0"}), out(fmt, t, {"LK_INT8_ACT": "1"})
        assert not torch.equal(exact, on)
        for env in ({}, {"LK_INT8_ACT": "auto"}, {"LK_INT8_ACT": "AUTO"}):
            assert torch.equal(out(fmt, t, env), exact), (fmt, env)
        assert torch.equal(out(fmt, t, {"LK_WNA16_INT8_ACT": "1"}), on if fmt == "wna16_int4" else exact)