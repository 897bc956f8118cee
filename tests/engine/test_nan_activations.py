"""lk_moe never masks a NaN: one in a token's input, or in one gate or one up row of an expert (a NaN
weight code or scale), makes every output row that used it NaN, for every activation (silu,
swigluoai), every expert format, every ISA tier, decode chunks (bf16, q15 and int8 activations) and
prefill, while the other rows stay finite. vLLM's own activations (torch.clamp, silu) propagate NaN,
so a finite row here would be a wrong answer presented as a right one: a SIMD min/max returns its
second operand when one is NaN, so a clamp written value-first drops the NaN."""
import pytest
import torch

import lk_moe

from .conftest import int8_activations, make_experts
from .test_channel_formats import make_channel_experts
from .test_fp8_block import make_fp8_experts
from .test_mxfp4 import make_mxfp4
from .test_nvfp4 import make_nvfp4
from .test_wna16 import make_int4_experts

E, H, I, K = 3, 256, 128, 2
FP8_NAN = 0x7F  # e4m3fn NaN (as is 0xFF)


def _fp8_poison(t, name, e, r):
    t[name].view(torch.uint8)[e, r, 5] = FP8_NAN


def _make(fmt, act):
    """(tensors, poison(tensors, expert, row)) for format fmt: poison puts a NaN into row `row` of
    expert `expert`'s w13 as the layer computes it (rows 0..I-1 gate, I..2I-1 up), through the
    format's own NaN encoding (a code where the format has a NaN code, else a scale)."""
    if fmt == "bf16":
        w13, w2 = make_experts(E, H, I)
        def poison(t, e, r):
            t["w13_weight"][e, r, 5] = float("nan")
        return dict(w13_weight=w13, w2_weight=w2), poison
    if fmt == "fp8_block":
        return make_fp8_experts(E, H, I)[0], lambda t, e, r: _fp8_poison(t, "w13_weight", e, r)
    if fmt == "fp8_channel":
        return make_channel_experts(fmt, E, H, I)[0], lambda t, e, r: _fp8_poison(t, "w13_weight", e, r)
    if fmt == "int8_channel":
        def poison(t, e, r):
            t["w13_weight_scale"][e, r, 0] = float("nan")
        return make_channel_experts(fmt, E, H, I)[0], poison
    if fmt == "wna16_int4":
        def poison(t, e, r):  # K-first scales [E, H/gs, 2I]
            t["w13_weight_scale"][e, 0, r] = float("nan")
        return make_int4_experts(E, H, I, 32, asym=True)[0], poison
    if fmt == "nvfp4":
        def poison(t, e, r):
            t["w13_weight_scale"].view(torch.uint8)[e, r, 0] = FP8_NAN
        return make_nvfp4(E, H, I)[0], poison
    assert fmt == "mxfp4"
    interleaved = act == "swigluoai"  # gpt-oss rows gate_0, up_0, gate_1, ...

    def poison(t, e, r):
        row = (2 * r if r < I else 2 * (r - I) + 1) if interleaved else r
        t["w13_weight_scale"][e, row, 0] = 255  # e8m0 NaN
    return make_mxfp4(E, H, I, interleaved=interleaved, bias=interleaved, h_std=3.0)[0], poison


CASES = [("mxfp4", "swigluoai"), ("mxfp4", "silu"), ("bf16", "silu"), ("fp8_block", "silu"),
         ("fp8_channel", "silu"), ("int8_channel", "silu"), ("wna16_int4", "silu"), ("nvfp4", "silu")]


def _routing(M):
    """Token 0 uses experts (0, 1), the last token (2, 0); the others (1, 2) only."""
    ids = torch.tensor([[1, 2]] * M, dtype=torch.int32)
    ids[0] = torch.tensor([0, 1])
    if M > 1:
        ids[-1] = torch.tensor([2, 0])
    return ids, torch.full((M, K), 0.5)


@pytest.mark.parametrize("int8_act", [False, True], ids=["q15-or-bf16-acts", "int8-acts"])
@pytest.mark.parametrize("where", ["x", "gate", "up"])
@pytest.mark.parametrize("fmt,act", CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_nan_reaches_the_output(tier, fmt, act, where, int8_act):
    tensors, poison = _make(fmt, act)
    tensors = {k: v.clone() for k, v in tensors.items()}  # the makers cache their tensors
    if where != "x":
        poison(tensors, 0, 17 if where == "gate" else I + 17)
    with int8_activations(int8_act):
        layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, activation=act)
    for M in (1, 5, 40):  # decode chunks (<= 16 tokens: integer activations on AVX-512) and prefill
        x = torch.randn(M, H).bfloat16()
        ids, w = _routing(M)
        if where == "x":
            x[0, 7] = float("nan")
            bad = torch.zeros(M, dtype=torch.bool)
            bad[0] = True
        else:
            bad = (ids == 0).any(dim=1)
        out = layer.forward(x, ids, w).float()
        assert torch.isnan(out[bad]).all(), f"M={M}: a NaN ({where}) was turned into finite numbers"
        assert torch.isfinite(out[~bad]).all(), f"M={M}: rows that never saw the NaN are not finite"
