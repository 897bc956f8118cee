"""lk_moe.formats, the one Python table of expert formats, agrees with the engine's C++ table and is
what its readers (MoELayer, the GPU paths, the plugin's policy) use; and every row, with each
activation it offers and with and without its optional tensors, builds a layer
whose forward is the plain-torch reference on the weights its tensors encode, on every ISA tier.
A new row is tested here once lvllm.testing.experts can quantize to it."""
from types import SimpleNamespace

import pytest
import torch

import lk_moe
from lk_moe import _C, formats, gpu_dequant
from lk_moe.reference import moe_reference, random_routing
from lvllm import policy
from lvllm.testing.experts import QUANTIZE, quantize_experts

from .conftest import (assert_int8_budget, assert_matches_reference, check_int8_decode, int8_activations, q8,
                       rounds_weights, runs_int8)


def test_the_python_table_is_the_engines():
    """The same rows in the same order; every row offers every activation the engine's kernels end in
    (gate_act_16: one activation step for all formats)."""
    assert [f.name for f in formats.TABLE] == list(_C.formats())
    for f in formats.TABLE:
        assert f.activations == ("silu", "silu_clamp", "situ", "swigluoai"), f.name


def test_rows_are_well_formed():
    for f in formats.TABLE:
        assert f.family in ("bf16", "byte", "four_bit"), f
        assert f.tensors[:2] in (("w13_weight", "w2_weight"), ("w13_weight_packed", "w2_weight_packed")), f
        assert not set(f.tensors) & set(f.optional), f
        assert f.activations and len(set(f.activations)) == len(f.activations), f
        assert f.biases == any(n.endswith("_bias") for n in f.optional), f


def test_readers_take_the_table():
    for f in formats.TABLE:
        assert lk_moe.MoELayer.tensor_names(f.name) == (f.tensors, f.optional)
    assert gpu_dequant.GPU_FORMATS == formats.GPU == policy.GPU_PREFILL_FORMATS
    assert gpu_dequant.BYTE_FORMATS + gpu_dequant.FOUR_BIT_FORMATS == tuple(
        f.name for f in formats.TABLE if f.family != "bf16")


def test_an_unknown_format_is_named_with_the_supported_ones():
    with pytest.raises(ValueError, match=r"unsupported expert format 'fp6'; supported: bf16, fp8_block"):
        formats.get("fp6")


def _cases():
    """(format, activation, optional tensors) for every row of the engine's table, with each
    activation its Python row offers (what MoELayer.from_checkpoint accepts)."""
    for name in _C.formats():
        row = formats.get(name)
        for act in row.activations:
            for optional in ((False, True) if row.optional else (False,)):
                yield name, act, optional


CASES = list(_cases())
# Kimi's SituGLU constants: beta below the gates' spread (tanh saturates for most of them), and a linear beta
# that soft-clips most ups (or none: 0)
SITU_BETA = 0.6
SITU_LINEAR_BETA = 0.8


def test_every_engine_row_has_a_quantizer():
    assert set(QUANTIZE) == set(_C.formats())


@pytest.mark.parametrize("int8_act", [False, True], ids=["bf16_act", "int8_act"])
@pytest.mark.parametrize("fmt,activation,optional", CASES,
                         ids=[f"{f}-{a}" + ("-optional" if o else "") for f, a, o in CASES])
def test_every_format_computes_the_reference(tier, fmt, activation, optional, int8_act):
    """Tolerances: conftest.assert_matches_reference's rigorous bound (the engine computes with the
    encoded weights exactly, rounding the activation and the output to bf16: u = 2^-8 of the
    magnitude, relative RMS <= 2^-8; the amx tier's int4 group-32 prefill also rounds each code x scale
    to bf16 once: its weights_rounded terms), and with LK_INT8_ACT on, conftest.assert_int8_budget for the
    chunks the int8 kernels take (4-bit formats: decode, M <= 16, on avx512/amx; prefill too on avx512 and
    avx512_bf16; relative RMS <= 2^-6, derivation there); the rest stays on the exact bound.
    Pre-activations of std ~3 for the clamped activations (swigluoai, silu_clamp), so their +-7 clamps
    are active for some columns."""
    E, H, I, K = 8, 256, 128, 4  # multiples of every format's block (fp8: 128, mxfp4: 32)
    g = torch.Generator().manual_seed(len(fmt) * 7 + len(activation))
    h_std = 3.0 if activation in ("swigluoai", "silu_clamp") else 1.0
    w13 = torch.randn(E, 2 * I, H, generator=g) * (h_std / H ** 0.5)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    tensors, d13, d2 = quantize_experts(fmt, w13, w2, optional)
    assert set(formats.get(fmt).tensors) <= set(tensors)
    situ = dict(situ_beta=SITU_BETA, situ_linear_beta=SITU_LINEAR_BETA) if activation == "situ" else {}
    with int8_activations(int8_act):
        layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, activation=activation, **situ)
    assert layer.format == fmt
    # from_checkpoint's default row order: gpt-oss's interleaved gate/up rows for mxfp4's swigluoai, gate rows
    # then up rows otherwise (MiniMax-M3's swigluoai experts, every other format)
    act = dict(activation=activation, interleaved=fmt == "mxfp4" and activation == "swigluoai",
               w13_bias=tensors.get("w13_bias"), w2_bias=tensors.get("w2_bias"), **situ)

    def exact(out, x, ids, w):
        assert_matches_reference(out, x, d13, d2, ids, w, weights_rounded=rounds_weights(fmt), **act)

    def int8(out, x, ids, w):
        assert_int8_budget(out, x, d13, d2, ids, w, **act)

    check_int8_decode(layer, tier, E, K, (1, 5, 40), int8 if int8_act else exact, exact)


def _rel_rms(out, ref):
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


INT8_FORMATS = ("wna16_int4", "mxfp4", "nvfp4", "int8_channel")  # the rows LK_INT8_ACT switches (Format::int8_act)
INT8_CASES = ([(f, 2048, 768) for f in INT8_FORMATS] + [(f, 256, 128) for f in INT8_FORMATS]
              + [("int8_channel", 2880, 720), ("int8_channel", 200, 72)])


@pytest.mark.parametrize("fmt,H,I", INT8_CASES, ids=[f"{f}-{h}x{i}" for f, h, i in INT8_CASES])
def test_int8_activations_are_the_q8_rounding(tier, fmt, H, I):
    """LK_INT8_ACT=1: the chunks conftest.runs_int8 names (decode on every tier but generic, prefill on avx2 / avx512 /
    avx512_bf16; one row tile, and several over a panel) run on the integer tiles: each within the int8 budget
    against the fp32 reference; over all of them the output carries the int8 rounding (its error more than 3x
    the exact layer's: 0.012 against 0.0024 measured) and is that rounding (the reference on x and activations
    rounded as conftest.q8 does is at least twice as close as the exact one; what is left is the output's bf16
    rounding and activations that round to the other q8 code after a one-ulp bf16 difference, 0.0015-0.005
    measured). The other chunks stay on the exact bound."""
    E, K = 6, 4
    g = torch.Generator().manual_seed(H + I + len(fmt))
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    tensors, d13, d2 = quantize_experts(fmt, w13, w2, False)
    with int8_activations(True):
        layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors)
    with int8_activations(False):
        exact = lk_moe.MoELayer.from_checkpoint(fmt, tensors)
    outs, exacts, refs, emus = [], [], [], []
    for M in (1, 3, 4, 16, 70):
        x = torch.randn(M, H, generator=g).bfloat16()
        ids, w = random_routing(M, E, K, generator=g)
        out = layer.forward(x, ids, w)
        if not runs_int8(tier, M):
            assert_matches_reference(out, x, d13, d2, ids, w, weights_rounded=rounds_weights(fmt))
            continue
        assert_int8_budget(out, x, d13, d2, ids, w)
        outs.append(out.float())
        exacts.append(exact.forward(x, ids, w).float())
        refs.append(moe_reference(x, d13, d2, ids, w))
        emus.append(moe_reference(q8(x), d13, d2, ids, w, act_round=lambda a: q8(a.bfloat16())))
    if not outs:
        assert tier == "generic", tier
        return
    out, ref = torch.cat(outs), torch.cat(refs)
    assert _rel_rms(out, ref) > 3 * _rel_rms(torch.cat(exacts), ref), "no int8 rounding: the integer tiles did not run"
    assert _rel_rms(out, torch.cat(emus)) < 0.5 * _rel_rms(out, ref), "the error is not the q8 rounding"


def _check_activation(fmt, seed, activation, constants, engine_constants, other, why):
    """One activation with its constants on a format (bf16 activations everywhere: the exact bound), prefill and
    decode sizes: the engine layer holds `engine_constants` (its _impl.swiglu pair) and matches the fp32 reference;
    that reference is far from `other` (the same activation with other constants, or plain silu), so what the
    constants do really ran."""
    from lk_moe.reference import moe_reference
    E, H, I, K = 8, 256, 128, 4
    g = torch.Generator().manual_seed(seed + len(fmt))
    w13 = torch.randn(E, 2 * I, H, generator=g) * (2.0 / H ** 0.5)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    tensors, d13, d2 = quantize_experts(fmt, w13, w2, False)
    with int8_activations(False):
        layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, activation=activation, **constants)
    assert layer.activation == activation and tuple(layer._impl.swiglu) == pytest.approx(engine_constants)
    ref_args = dict(constants, activation=activation)
    for M in (1, 5, 40):
        x = torch.randn(M, H, generator=g).bfloat16()
        ids, w = random_routing(M, E, K, generator=g)
        out = layer.forward(x, ids, w)
        assert_matches_reference(out, x, d13, d2, ids, w, weights_rounded=rounds_weights(fmt), **ref_args)
        ref = moe_reference(x, d13, d2, ids, w, **ref_args)
        assert (moe_reference(x, d13, d2, ids, w, **other) - ref).norm() > 0.3 * ref.norm(), why


SILU_CLAMP_LIMIT = 0.75  # below the pre-activations' std: most gates and ups are clamped


@pytest.mark.parametrize("fmt", [f.name for f in formats.TABLE])
def test_silu_clamp_is_the_clamped_reference(tier, fmt):
    """silu with vLLM's swiglu_limit (DeepSeek-V4) on every format and tier, with a limit that clamps most
    pre-activations: the clamped reference, far from plain silu (so the clamp really ran)."""
    _check_activation(fmt, 11, "silu_clamp", dict(swiglu_limit=SILU_CLAMP_LIMIT), (1.702, SILU_CLAMP_LIMIT),
                      dict(activation="silu"), "the limit clamps too little to test it")


@pytest.mark.parametrize("linear_beta", [0.0, SITU_LINEAR_BETA])
@pytest.mark.parametrize("fmt", [f.name for f in formats.TABLE])
def test_situ_is_the_reference_situ(tier, fmt, linear_beta):
    """Kimi-K3's SituGLU on every format and tier, with and without the soft clip of the up projection: vLLM's
    formula in fp32 (lk_moe.reference.situ), far from plain silu (so the tanh terms really ran)."""
    situ = dict(situ_beta=SITU_BETA, situ_linear_beta=linear_beta)
    _check_activation(fmt, 17, "situ", situ, (SITU_BETA, linear_beta), dict(activation="silu"),
                      "situ too close to silu to test it")


SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT = 1.3, 0.9  # not gpt-oss's: the constants must travel; the limit clamps


@pytest.mark.parametrize("fmt", [f.name for f in formats.TABLE])
def test_swigluoai_on_every_format_with_its_constants(tier, fmt):
    """swigluoai with gate rows then up rows (MiniMax-M3's experts; gpt-oss interleaves them in mxfp4 only) on
    every format and tier, with constants other than gpt-oss's: far from the default constants' result (so alpha
    and limit were used)."""
    consts = dict(swiglu_alpha=SWIGLUOAI_ALPHA, swiglu_limit=SWIGLUOAI_LIMIT, interleaved=False)
    _check_activation(fmt, 23, "swigluoai", consts, (SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT),
                      dict(activation="swigluoai", interleaved=False), "the constants change too little to test them")


def test_only_mxfp4_takes_interleaved_rows():
    w13 = torch.randn(2, 64, 32).bfloat16()
    w2 = torch.randn(2, 32, 32).bfloat16()
    with pytest.raises(ValueError, match="interleaved gate/up rows are an mxfp4 layout"):
        lk_moe.MoELayer.from_checkpoint("bf16", dict(w13_weight=w13, w2_weight=w2), activation="swigluoai",
                                        interleaved=True)


@pytest.mark.parametrize("alpha,limit", [(float("nan"), 7.0), (1.702, -1.0), (1.702, float("inf"))])
def test_swigluoai_needs_finite_constants(alpha, limit):
    w13 = torch.randn(2, 64, 32).bfloat16()
    w2 = torch.randn(2, 32, 32).bfloat16()
    with pytest.raises(ValueError, match="activation 'swigluoai' needs a finite swiglu_alpha"):
        lk_moe.MoELayer(w13, w2, activation="swigluoai", swiglu_alpha=alpha, swiglu_limit=limit)


def test_situ_reference_is_vllms_formula():
    """lk_moe.reference.situ against vLLM's SituAndMul.forward_native where vLLM is installed."""
    activation = pytest.importorskip("vllm.model_executor.layers.activation")
    x = torch.randn(64, 2 * 48, generator=torch.Generator().manual_seed(3)) * 3
    from lk_moe.reference import situ
    for linear_beta in (None, SITU_LINEAR_BETA):
        ours = situ(x[:, :48], x[:, 48:], SITU_BETA, linear_beta)
        # its native forward on the constants alone (instantiating the CustomOp needs a vLLM config)
        theirs = activation.SituAndMul.forward_native(SimpleNamespace(beta=SITU_BETA, linear_beta=linear_beta), x)
        torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("beta,linear_beta", [(0.0, 0.0), (-1.0, 0.0), (float("nan"), 0.0), (1.0, -1.0),
                                              (1.0, float("inf"))])
def test_situ_needs_finite_constants(beta, linear_beta):
    w13 = torch.randn(2, 64, 32).bfloat16()
    w2 = torch.randn(2, 32, 32).bfloat16()
    with pytest.raises(ValueError, match="activation 'situ' needs situ_beta > 0 and situ_linear_beta >= 0"):
        lk_moe.MoELayer(w13, w2, activation="situ", situ_beta=beta, situ_linear_beta=linear_beta)


@pytest.mark.parametrize("limit", [0.0, -1.0, float("inf"), float("nan")])
def test_silu_clamp_needs_a_finite_positive_limit(limit):
    w13 = torch.randn(2, 64, 32).bfloat16()
    w2 = torch.randn(2, 32, 32).bfloat16()
    with pytest.raises(ValueError, match="activation 'silu_clamp' needs swiglu_limit > 0"):
        lk_moe.MoELayer(w13, w2, activation="silu_clamp", swiglu_limit=limit)


def test_an_unknown_activation_names_the_supported_ones():
    w13 = torch.randn(2, 64, 32).bfloat16()
    w2 = torch.randn(2, 32, 32).bfloat16()
    with pytest.raises(ValueError, match=r"activation 'gelu' is not supported for bf16 \(supported: silu, silu_clamp, situ, swigluoai\)"):
        lk_moe.MoELayer(w13, w2, activation="gelu")


@pytest.mark.parametrize("H,I", [(7168, 256), (256, 2304)], ids=["wide-gate-up", "wide-down"])
@pytest.mark.parametrize("fmt", [f.name for f in formats.TABLE if f.family != "bf16"])
def test_prefill_panels_too_wide_to_pipeline(tier, fmt, H, I):
    """Inputs past 2048 (DeepSeek-V3's 7168 in gate/up, a 2304-wide down): one panel set per task (no pipelining on
    amx), and the bf16 panels on the avx512 tier (its fp32 ones stop at 2048 inputs), with 2048 or fewer on the other
    side; every tier's prefill (40 rows an expert: two AMX row tiles; 130: the fp8 fold) stays the reference's."""
    E, K = 2, 2
    g = torch.Generator().manual_seed(H + I + len(fmt))
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    tensors, d13, d2 = quantize_experts(fmt, w13, w2, False)
    layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors)
    for M in (40, 130):
        x = torch.randn(M, H, generator=g).bfloat16()
        ids, w = random_routing(M, E, K, generator=g)
        assert_matches_reference(layer.forward(x, ids, w), x, d13, d2, ids, w, weights_rounded=rounds_weights(fmt))
