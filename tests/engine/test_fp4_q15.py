"""mxfp4 / nvfp4 decode on 15-bit integer activations (q15 rows, the default for chunks of <= 16 tokens
on the AVX-512 tiers; csrc/cpu/kernels/fp4.cpp, dot_tile_fp4_int).

The engine rounds each 32-input group of x, and of the bf16 activation before the down projection, to
q * 2^e with |q| <= 16256 (8128 < max|v| / 2^e <= 16256), then sums code x q in integers exactly. The
reference here emulates that rounding independently in torch (`q15`), so engine and reference take
the same products, and only the fp32 summation order and the bf16 rounding of the output are left:
|out - ref| <= 1.01 u |ref| + 2e-5 mag (u = 2^-8; mag as in conftest.assert_matches_reference; the
fp32 term also covers an activation rounding to the other bf16 neighbour where the engine's exp()
polynomial and torch's differ at a tie: a few terms of size u |w2| |act| in a sum of I such terms).
The vdpbf16ps tile (benchmark setting 'bf16') fails that tight bound (it does not round the
activations), and the plain bound of the other fp4 tests holds for both.
"""
from __future__ import annotations

import pytest
import torch

import lk_moe
from lk_moe.reference import moe_reference, random_routing

from .conftest import assert_matches_reference, assert_nonfinite_input_propagates, int8_activations
from .test_mxfp4 import make_mxfp4
from .test_nvfp4 import make_nvfp4

U = 2.0 ** -8
MS = (1, 4, 5, 16)  # decode chunks: one row tile, a full tile, a tile and a row, the largest q15 chunk


def q15(v: torch.Tensor) -> torch.Tensor:
    """v (any float dtype) rounded as the engine's q15 rows do, per 32 values along the last dim
    (zero-padded to a multiple of 32); fp32."""
    v = v.float()
    n = v.shape[-1]
    pad = (-n) % 32
    g = torch.nn.functional.pad(v, (0, pad)).reshape(*v.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    _, k = torch.frexp(amax)
    e = k - 14
    e = torch.where(torch.ldexp(amax, -e) > 16256, e + 1, e)
    d = torch.ldexp(torch.ones_like(amax), e)
    q = torch.round(g / d) * d  # round half to even, like vcvtps2dq
    return torch.where(amax > 0, q, g).reshape(*v.shape[:-1], n + pad)[..., :n]


def assert_q15_exact(out, x, w13, w2, ids, w, **act):
    """The tight bound of the module docstring against the q15-emulating reference."""
    ref, mag = moe_reference(q15(x), w13, w2, ids, w, return_magnitude=True,
                             act_round=lambda a: q15(a.bfloat16()), **act)
    out = out.float()
    assert out.shape == ref.shape and torch.isfinite(out).all()
    err = (out - ref).abs()
    worst = (err / (1.01 * U * ref.abs() + 2e-5 * mag).clamp_min(1e-30)).max().item()
    assert worst <= 1.0, f"error exceeds the q15 bound by {worst:.3g}x"
    return worst


def _cases(fmt, H, I, E):
    """A layer without int8 activations (whatever LK_INT8_ACT says), its dense weights and act options."""
    with int8_activations(False):
        if fmt == "mxfp4":
            tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I)
            act = dict(activation="swigluoai", interleaved=True, w13_bias=b13, w2_bias=b2)
            layer = lk_moe.MoELayer.from_checkpoint("mxfp4", tensors, hidden_size=H, intermediate_size=I,
                                                    activation="swigluoai", interleaved=True)
        else:
            tensors, d13, d2 = make_nvfp4(E, H, I)
            act = {}
            layer = lk_moe.MoELayer.from_checkpoint("nvfp4", tensors)
    return layer, d13, d2, act


@pytest.mark.parametrize("fmt,H,I,E,K", [("mxfp4", 96, 64, 3, 2), ("mxfp4", 2880, 2880, 3, 2),
                                         ("nvfp4", 176, 80, 4, 3), ("nvfp4", 2048, 768, 3, 2)])
def test_q15_decode_is_the_emulated_rounding_every_tier(tier, fmt, H, I, E, K, acts_setting):
    layer, d13, d2, act = _cases(fmt, H, I, E)
    for M in MS:
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        lk_moe._C._set_fp4_decode_acts("q15")
        out = layer.forward(x, ids, w)
        assert_matches_reference(out, x, d13, d2, ids, w, **act)  # the plain bound of every fp4 path
        if tier == "generic":  # no q15 rows there: the exact tiles, bit for bit either setting
            lk_moe._C._set_fp4_decode_acts("bf16")
            assert torch.equal(layer.forward(x, ids, w), out)
            continue
        assert_q15_exact(out, x, d13, d2, ids, w, **act)


def test_bf16_tile_does_not_meet_the_q15_bound(acts_setting):
    """The tight bound tells the two tiles apart: the vdpbf16ps tile keeps the activations unrounded."""
    if lk_moe.isa() == "generic":
        pytest.skip("no q15 rows on this tier")
    layer, d13, d2, act = _cases("mxfp4", 2880, 2880, 3)
    x = torch.randn(4, 2880).bfloat16()
    ids, w = random_routing(4, 3, 2)
    lk_moe._C._set_fp4_decode_acts("bf16")
    out = layer.forward(x, ids, w)
    assert_matches_reference(out, x, d13, d2, ids, w, **act)
    with pytest.raises(AssertionError, match="q15 bound"):
        assert_q15_exact(out, x, d13, d2, ids, w, **act)


def test_q15_wide_and_tiny_groups(acts_setting):
    """Groups spanning 2^20 (their small inputs really get rounded), tiny groups (the scale 2^-e needs
    two factors below ~2^-113) and all-zero groups, through the same tight bound."""
    if lk_moe.isa() == "generic":
        pytest.skip("no q15 rows on this tier")
    lk_moe._C._set_fp4_decode_acts("q15")
    H, I, E = 176, 80, 4
    layer, d13, d2, act = _cases("nvfp4", H, I, E)
    x = torch.randn(4, H)
    x[0, ::32] = 2.0 ** 10  # one large input per group, the rest ~2^10 .. 2^20 times smaller
    x[0, 1::32] = 2.0 ** -10
    x[1] = x[1] * 2.0 ** -120  # every group below 2^-113
    x[2, :64] = 0.0  # two all-zero groups
    x = x.bfloat16()
    assert (q15(x[0]) != x[0].float()).any()  # the rounding is exercised
    ids, w = random_routing(4, E, 3)
    out = layer.forward(x, ids, w)
    assert_q15_exact(out, x, d13, d2, ids, w, **act)
    assert_matches_reference(out, x, d13, d2, ids, w)


def test_q15_nonfinite_input_propagates(acts_setting):
    lk_moe._C._set_fp4_decode_acts("q15")
    layer, *_ = _cases("nvfp4", 176, 80, 4)
    assert_nonfinite_input_propagates(layer, 176)


def test_fp4_decode_acts_setting_is_checked(acts_setting):
    assert lk_moe._C._fp4_decode_acts() == "q15"  # the default
    with pytest.raises(ValueError, match="q15 or bf16"):
        lk_moe._C._set_fp4_decode_acts("int8")
