"""mxfp4 experts (OCP MX FP4, as vLLM's GptOssMxfp4MoEMethod / Mxfp4MoEMethod hold them after loading:
uint8 e2m1 code pairs, uint8 e8m0 scales per 32 inputs, optional bf16 biases, gpt-oss interleaved
gate/up rows, possibly padded H and I) against the fp32 reference on the dequantized weights, on every
ISA tier this CPU has, with swigluoai (gpt-oss) and silu."""
import functools
import math

import pytest
import torch

import lk_moe
from lk_moe.reference import dequantize_mxfp4, moe_reference, random_routing, swigluoai

from .conftest import (assert_int8_budget, assert_matches_reference, assert_nonfinite_input_propagates,
                       check_int8_decode, int8_activations, with_changes)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # magnitudes of codes 0..7 (code | 8: negative)


# ------------------------------------------------------------------ an independent encoder
def encode_mxfp4(mag_idx: torch.Tensor, neg: torch.Tensor, exps: torch.Tensor):
    """Codes and scales written straight from the format: element k of a row has code
    8 * neg + mag_idx (bit 3 = sign), element 2i in the low nibble of byte i, 2i + 1 in the high one;
    group g (inputs 32g .. 32g + 31) has the e8m0 byte exps + 127. Returns (uint8 [.., K/2] codes,
    uint8 [.., ceil(K/32)] scales, fp32 [.., K] values computed in float64 by plain arithmetic)."""
    code = (mag_idx + 8 * neg.long()).long()
    packed = (code[..., 0::2] + 16 * code[..., 1::2]).to(torch.uint8)
    scale = (exps + 127).to(torch.uint8)
    K = mag_idx.shape[-1]
    mags = torch.tensor(E2M1, dtype=torch.float64)[mag_idx]
    sign = 1.0 - 2.0 * neg.double()
    pow2 = torch.pow(2.0, exps.double()).repeat_interleave(32, dim=-1)[..., :K]
    return packed, scale, (sign * mags * pow2).float()


def random_mxfp4(shape, K, target_rms, gen):
    """Random codes [*shape, K] with group exponents around the scale that gives entries of rms
    ~target_rms (uniform codes have rms 2.93)."""
    mag = torch.randint(0, 8, (*shape, K), generator=gen)
    neg = torch.randint(0, 2, (*shape, K), generator=gen).bool()
    e0 = round(math.log2(target_rms / 2.93))
    exps = torch.randint(e0 - 1, e0 + 2, (*shape, (K + 31) // 32), generator=gen)
    return encode_mxfp4(mag, neg, exps)


@functools.lru_cache(maxsize=None)
def make_mxfp4(E, H, I, Hp=None, Ip=None, interleaved=True, bias=True, h_std=3.0, seed=0):
    """vLLM's tensors for real sizes H, I stored in padded [E, 2Ip, Hp/2] / [E, Hp, Ip/2] tensors (the
    padding filled with garbage codes, and NaN scales where a whole group is padding, to prove it is
    never read), plus the dense fp32 weights of the real sizes in the checkpoint's row order.
    Pre-activations get std ~h_std (so swigluoai's clamp at +-7 is active for some columns)."""
    Hp, Ip = Hp or H, Ip or I
    g = torch.Generator().manual_seed(seed)
    c13, s13, d13 = random_mxfp4((E, 2 * I), H, h_std / H ** 0.5, g)
    c2, s2, d2 = random_mxfp4((E, H), I, 1.0 / I ** 0.5, g)
    P13 = torch.randint(0, 256, (E, 2 * Ip, Hp // 2), generator=g, dtype=torch.uint8)
    S13 = torch.full((E, 2 * Ip, Hp // 32), 255, dtype=torch.uint8)
    P2 = torch.randint(0, 256, (E, Hp, Ip // 2), generator=g, dtype=torch.uint8)
    S2 = torch.full((E, Hp, Ip // 32), 255, dtype=torch.uint8)
    # real rows: interleaved gpt-oss rows sit first (2I of 2Ip); [gate; up] rows at 0 and Ip
    rows = list(range(2 * I)) if interleaved else list(range(I)) + list(range(Ip, Ip + I))
    for dst_w, dst_s, src_w, src_s, rr in ((P13, S13, c13, s13, rows), (P2, S2, c2, s2, list(range(H)))):
        rr = torch.tensor(rr)
        dst_w[:, rr, :src_w.shape[-1]] = src_w
        dst_s[:, rr, :src_s.shape[-1]] = src_s
    tensors = dict(w13_weight=P13, w13_weight_scale=S13, w2_weight=P2, w2_weight_scale=S2)
    b13 = b2 = None
    if bias:
        b13 = (torch.randn(E, 2 * I, generator=g) * 0.5).bfloat16()
        b2 = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
        B13 = (torch.randn(E, 2 * Ip, generator=g) * 100).bfloat16()  # garbage in the padding
        B2 = (torch.randn(E, Hp, generator=g) * 100).bfloat16()
        B13[:, rows] = b13
        B2[:, :H] = b2
        tensors.update(w13_bias=B13, w2_bias=B2)
    return tensors, d13, d2, b13, b2


# ------------------------------------------------------------------ (a) the reference dequantization
def test_format_by_hand():
    # byte 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); 0x9A: code 10 (-1.0), code 9 (-0.5)
    codes = torch.tensor([[0x21, 0x9A] + [0x00] * 14], dtype=torch.uint8)
    got = dequantize_mxfp4(codes, torch.tensor([[128]], dtype=torch.uint8))  # scale 2^1
    assert got[0, :4].tolist() == [1.0, 2.0, -2.0, -1.0]
    every = torch.arange(16, dtype=torch.uint8)
    got = dequantize_mxfp4((every[0::2] | (every[1::2] << 4)).view(1, 8), torch.tensor([[127]], dtype=torch.uint8))
    assert got[0].tolist() == E2M1 + [-v for v in E2M1]
    # e8m0 extremes: 2^-127 (a subnormal fp32) and NaN for 0xFF
    one = torch.tensor([[0x02] * 16], dtype=torch.uint8)  # code 2 = 1.0
    assert dequantize_mxfp4(one, torch.tensor([[0]], dtype=torch.uint8))[0, 0].item() == 2.0 ** -127
    assert math.isnan(dequantize_mxfp4(one, torch.tensor([[255]], dtype=torch.uint8))[0, 0].item())


@pytest.mark.parametrize("K", [32, 96, 176])
def test_reference_dequantization_is_exact(K):
    g = torch.Generator().manual_seed(K)
    mag = torch.randint(0, 8, (3, 40, K), generator=g)
    neg = torch.randint(0, 2, (3, 40, K), generator=g).bool()
    exps = torch.randint(-20, 20, (3, 40, (K + 31) // 32), generator=g)
    codes, scale, want = encode_mxfp4(mag, neg, exps)
    assert codes.shape == (3, 40, K // 2) and codes.dtype == torch.uint8
    got = dequantize_mxfp4(codes, scale)
    assert got.dtype == torch.float32 and got.shape == (3, 40, K)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit (signed zeros too)


# ------------------------------------------------------------------ (b) the layer on every tier
MS = (1, 5, 64, 600)


def _layer(tensors, int8_act=False, **kw):
    """An mxfp4 layer; by default gpt-oss's (swigluoai, the model's activation: MoELayer's default is
    silu for every format) with exact bf16 activations (the rounding-bound tests)."""
    kw.setdefault("activation", "swigluoai")
    with int8_activations(int8_act):
        return lk_moe.MoELayer.from_checkpoint("mxfp4", tensors, **kw)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "split"])
@pytest.mark.parametrize("H,I,Hp,Ip,E,K", [(96, 64, None, None, 3, 2),      # small, exact multiples of 32
                                           (176, 72, 256, 128, 4, 3),     # odd real sizes, vLLM-padded tensors
                                           (2880, 2880, None, None, 3, 2)])  # gpt-oss expert shape, few experts
def test_mxfp4_swigluoai_every_tier(tier, H, I, Hp, Ip, E, K, interleaved):
    if H == 2880 and not interleaved:
        pytest.skip("the row order is covered by the small shapes")
    tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I, Hp, Ip, interleaved)
    layer = _layer(tensors, hidden_size=H, intermediate_size=I, interleaved=interleaved)
    assert layer.format == "mxfp4" and layer.hidden_size == H and layer.intermediate_size == I
    ms = MS if H < 2880 or tier != "generic" else (1, 5, 64)  # the scalar tier is slow at 2880^2 x 600 rows
    for M in ms:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w, activation="swigluoai",
                                     interleaved=interleaved, w13_bias=b13, w2_bias=b2)


def test_mxfp4_clamp_is_exercised():
    """The test data drives pre-activations past +-limit, so the clamps are really checked."""
    tensors, d13, d2, b13, b2 = make_mxfp4(3, 96, 64)
    x = torch.randn(64, 96)
    h = torch.einsum("mh,enh->emn", x, d13) + b13.float()[:, None]
    assert (h > 7).float().mean() > 0.01 and (h < -7).float().mean() > 0.01


def test_mxfp4_silu_without_biases(tier):
    """DeepSeek-V4-style experts: silu, no biases, [gate; up] rows (the default for silu)."""
    E, H, I = 4, 256, 192
    tensors, d13, d2, _, _ = make_mxfp4(E, H, I, interleaved=False, bias=False, h_std=1.0)
    layer = _layer(tensors, activation="silu")
    for M in MS:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, 2)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w)  # the conftest helper as is
    # fp16 activations in and out
    x = torch.randn(7, H).half()
    ids, w = random_routing(7, E, 2)
    out = layer.forward(x, ids, w)
    assert out.dtype == torch.float16
    assert_matches_reference(out, x, d13, d2, ids, w)


def test_mxfp4_silu_interleaved_and_custom_constants(tier):
    E, H, I = 3, 128, 96
    tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I, interleaved=True, h_std=2.0)
    layer = _layer(tensors, activation="silu", interleaved=True)
    x = torch.randn(9, H).bfloat16()
    ids, w = random_routing(9, E, 2)
    assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w, activation="silu",
                                 interleaved=True, w13_bias=b13, w2_bias=b2)
    layer = _layer(tensors, swiglu_alpha=1.0, swiglu_limit=2.5)
    assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w, activation="swigluoai",
                                 interleaved=True, w13_bias=b13, w2_bias=b2, swiglu_alpha=1.0, swiglu_limit=2.5)


def test_mxfp4_zero_scale_byte_groups_are_zero_weights(tier):
    """An e8m0 byte 0 (2^-127, an fp32 subnormal: what quantizers write for an all-zero block) is packed as codes 0
    with scale 1.0, so no kernel multiplies by a subnormal (microcode assists on Intel cores): the layer equals, bit
    for bit, one whose such groups hold codes 0 at scale 1.0, and matches the reference with those weights 0 (they
    differ from it by at most 6 x 2^-127 each), on every path (M = 1: decode, 5: a chunk, 64 / 600: prefill)."""
    E, H, I = 4, 256, 192
    tensors, d13, d2, _, _ = make_mxfp4(E, H, I, interleaved=False, bias=False, h_std=1.0)
    g = torch.Generator().manual_seed(7)
    zeroed = {}
    for name, dense in (("w13", d13), ("w2", d2)):
        codes, scale = tensors[f"{name}_weight"].clone(), tensors[f"{name}_weight_scale"].clone()
        mask = torch.rand(scale.shape, generator=g) < 0.15  # groups at byte 0
        blank = mask & (torch.rand(scale.shape, generator=g) < 0.5)  # of which all-zero blocks
        scale[mask] = 0
        codes.view(*codes.shape[:-1], -1, 16)[blank] = 0
        zeroed[name] = (codes, scale, mask)
        dense = dense.clone()
        dense.view(*dense.shape[:-1], -1, 32)[mask] = 0.0
        zeroed[name + "_dense"] = dense
    with_zero_bytes = {f"{n}_weight": zeroed[n][0] for n in ("w13", "w2")}
    with_zero_bytes.update({f"{n}_weight_scale": zeroed[n][1] for n in ("w13", "w2")})
    as_packed = {k: v.clone() for k, v in with_zero_bytes.items()}
    for n in ("w13", "w2"):
        mask = zeroed[n][2]
        as_packed[f"{n}_weight"].view(*mask.shape, 16)[mask] = 0
        as_packed[f"{n}_weight_scale"][mask] = 127
    layer = _layer(with_zero_bytes, activation="silu")
    twin = _layer(as_packed, activation="silu")
    for got, want in zip(layer._impl.quant4_slices(), twin._impl.quant4_slices()):  # packed: no byte-0 scale left
        for k in ("w13", "s13", "w2", "s2"):
            assert torch.equal(got[k], want[k]), k
    for M in MS:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, 2)
        out = layer.forward(x, ids, w)
        assert torch.equal(out, twin.forward(x, ids, w))
        assert_matches_reference(out, x, zeroed["w13_dense"], zeroed["w2_dense"], ids, w)


def test_mxfp4_unused_slots_and_memory():
    E, H, I = 3, 2880, 2880
    tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I)
    layer = _layer(tensors)
    src = sum(t.numel() * t.element_size() for t in tensors.values())
    assert layer.expert_bytes == src
    assert layer.nbytes <= 1.05 * src, (layer.nbytes, src)
    # padded tensors: the padding is dropped, so the engine holds less than the checkpoint
    tensors_p, *_ = make_mxfp4(4, 176, 72, 256, 128)
    layer_p = _layer(tensors_p, hidden_size=176, intermediate_size=72)
    assert layer_p.nbytes < sum(t.numel() * t.element_size() for t in tensors_p.values())
    x = torch.randn(3, H).bfloat16()
    ids, w = random_routing(3, E, 2)
    ids[1, 1] = -1
    out = layer.forward(x, ids, w)
    ids_ref = ids.clone()
    assert_matches_reference(out, x, d13, d2, ids_ref, w, activation="swigluoai", interleaved=True,
                                 w13_bias=b13, w2_bias=b2)


# ------------------------------------------------------------------ (b') int8 activations (decode)
# Budget: conftest.assert_int8_budget (derivation there). The e2m1 codes become exact integers (2 x
# e2m1) and the e8m0 scales are applied in fp32, so the only extra error is the int8 rounding of the
# activations per 32 inputs. Measured (this data, biases, swigluoai): rel RMS 0.0108-0.0110 at M = 1,
# 5, 16 on the gpt-oss shape, 0.0095-0.0113 on the small and padded shapes (exact path 0.0022-0.0026).
@pytest.mark.parametrize("H,I,Hp,Ip,E,K", [(176, 72, 256, 128, 4, 3), (2880, 2880, None, None, 3, 2)])
def test_mxfp4_int8_activations_every_tier(tier, H, I, Hp, Ip, E, K):
    tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I, Hp, Ip)
    layer = _layer(tensors, int8_act=True, hidden_size=H, intermediate_size=I)
    act = dict(activation="swigluoai", interleaved=True, w13_bias=b13, w2_bias=b2)
    ms = (1, 5, 16, 64) if H < 2880 or tier != "generic" else (1, 5)
    check_int8_decode(layer, tier, E, K, ms, lambda out, x, ids, w: assert_int8_budget(out, x, d13, d2, ids, w, **act),
                      lambda out, x, ids, w: assert_matches_reference(out, x, d13, d2, ids, w, **act))


def test_mxfp4_int8_activations_silu_fp16_and_switch():
    """silu without biases and fp16 in/out on the int8 path; LK_INT8_ACT=0 and its first name
    LK_WNA16_INT8_ACT=0 both give the exact path (bit for bit the same output)."""
    E, H, I = 4, 256, 192
    tensors, d13, d2, _, _ = make_mxfp4(E, H, I, interleaved=False, bias=False, h_std=1.0)
    layer = _layer(tensors, int8_act=True, activation="silu")
    x = torch.randn(5, H).half()
    ids, w = random_routing(5, E, 2)
    out = layer.forward(x, ids, w)
    assert out.dtype == torch.float16
    assert_int8_budget(out, x, d13, d2, ids, w)
    exact = _layer(tensors, activation="silu").forward(x, ids, w)
    assert_matches_reference(exact, x, d13, d2, ids, w)
    with int8_activations(False, name="LK_WNA16_INT8_ACT"):
        alias = lk_moe.MoELayer.from_checkpoint("mxfp4", tensors, activation="silu")
    assert torch.equal(alias.forward(x, ids, w), exact)
    if lk_moe.isa().startswith("avx512") or lk_moe.isa() == "amx":
        assert not torch.equal(out, exact)  # the switch switches


def test_mxfp4_int8_activations_nonfinite_input_propagates():
    tensors, *_ = make_mxfp4(4, 256, 192, interleaved=False, bias=False, h_std=1.0)
    assert_nonfinite_input_propagates(_layer(tensors, int8_act=True, activation="silu"), 256)


def test_swigluoai_reference_matches_vllm_definition():
    """reference.swigluoai on interleaved input equals the definition written out element by element."""
    h = torch.randn(5, 16) * 6
    gate, up = h[:, 0::2], h[:, 1::2]
    want = torch.empty_like(gate)
    for i in range(gate.shape[0]):
        for j in range(gate.shape[1]):
            gg, uu = min(gate[i, j].item(), 7.0), max(min(up[i, j].item(), 7.0), -7.0)
            want[i, j] = (uu + 1) * gg / (1 + math.exp(-1.702 * gg))
    torch.testing.assert_close(swigluoai(gate, up), want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ (d) bad inputs
def test_mxfp4_rejects_bad_inputs():
    tensors, *_ = make_mxfp4(2, 96, 64)

    def bad(**kw):
        return with_changes(tensors, **kw)

    with pytest.raises(ValueError, match="w2_weight_scale"):
        _layer(bad(w2_weight_scale=None))
    with pytest.raises(TypeError, match="w13_weight must be uint8"):
        _layer(bad(w13_weight=tensors["w13_weight"].to(torch.int8)))
    with pytest.raises(TypeError, match="w2_weight_scale must be uint8"):
        _layer(bad(w2_weight_scale=tensors["w2_weight_scale"].float()))
    with pytest.raises(ValueError, match="w13_weight_scale must have shape"):
        _layer(bad(w13_weight_scale=tensors["w13_weight_scale"][:, :, :2].contiguous()))
    with pytest.raises(ValueError, match="w2_weight must be"):
        _layer(bad(w2_weight=tensors["w2_weight"][:1].contiguous()))
    # w2 [E, I/2, H] (transposed) or with a hidden size other than w13's: named as w2_weight, not as its scales
    for w2 in (tensors["w2_weight"].transpose(1, 2).contiguous(), tensors["w2_weight"][:, :64].contiguous()):
        with pytest.raises(ValueError, match=r"w2_weight must be \[E, H, I/2\] = \[2, 96, 32\] to match w13_weight"):
            _layer(bad(w2_weight=w2))
    with pytest.raises(TypeError, match="w13_bias must be bfloat16"):
        _layer(bad(w13_bias=tensors["w13_bias"].float()))
    with pytest.raises(ValueError, match="w2_bias must have shape"):
        _layer(bad(w2_bias=tensors["w2_bias"][:, :10].contiguous()))
    with pytest.raises(ValueError, match="w2_bias is missing"):
        _layer(bad(w2_bias=None))
    with pytest.raises(TypeError, match="w13_bias must be a torch.Tensor"):
        _layer(bad(w13_bias=[1, 2]))
    with pytest.raises(ValueError, match="w13_weight must be contiguous"):
        _layer(bad(w13_weight=tensors["w13_weight"].transpose(0, 1).contiguous().transpose(0, 1)))
    with pytest.raises(ValueError, match="hidden_size 200"):
        _layer(tensors, hidden_size=200)
    with pytest.raises(ValueError, match="intermediate_size 80"):
        _layer(tensors, intermediate_size=80)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        _layer(tensors, activation="gelu")
    layer = _layer(tensors)
    with pytest.raises(ValueError, match="x must have shape"):
        layer.forward(torch.randn(2, 64).bfloat16(), *random_routing(2, 2, 1))
