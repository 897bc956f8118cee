import contextlib
import os

import pytest
import torch

import lk_moe
from lk_moe.reference import moe_reference, random_routing, routed_experts


@pytest.fixture(autouse=True)
def _seeded():
    """Every test draws the same random data on every run (no flaky tolerances)."""
    torch.manual_seed(1234)


@pytest.fixture(params=lk_moe.supported_isas())
def tier(request):
    """Runs the test once per ISA tier this CPU supports (the LK_ISA tiers), restoring the best after."""
    before = lk_moe.isa()
    lk_moe.set_isa(request.param)
    yield request.param
    lk_moe.set_isa(before)


@pytest.fixture
def acts_setting():
    """Restores the process-wide 4-bit decode activations setting (q15 / bf16, lk_moe._C._set_fp4_decode_acts)
    after a test that changes it."""
    before = lk_moe._C._fp4_decode_acts()
    yield
    lk_moe._C._set_fp4_decode_acts(before)


def make_experts(E, H, I, dtype=torch.bfloat16, seed=0):
    """Random experts scaled like trained ones (unit-variance pre-activations)."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    return w13, w2


def vllm_dequantize_nvfp4(codes, scales, global_scale):
    """vLLM 0.33's own NVFP4 decoder (nvfp4_emulation_utils.dequantize_to_dtype, unswizzled scales) as
    fp32 on the CPU. On a CUDA platform vLLM runs it as a Triton kernel that takes GPU tensors only, so
    the inputs go where vLLM's platform sends the call."""
    emu = pytest.importorskip("vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils")
    from vllm.platforms import current_platform
    dev = "cuda" if current_platform.is_cuda_alike() else "cpu"
    return emu.dequantize_to_dtype(codes.to(dev), scales.to(dev), global_scale.reshape(1).to(dev), torch.float32,
                                   block_size=16, swizzle=False).cpu()


def folded_weights_magnitude(x, w13, w2, ids, weights, activation="silu", swiglu_alpha=1.702, swiglu_limit=7.0,
                             w13_bias=None):
    """Per output element, sum_k |w_k| |w2_e| @ (1.1 |a_up| (|gate rows| @ |x|) + |a_gate| (|up rows| @ |x|)): what
    rounding every gate/up weight by at most u (relative) moves an output by, to first order ([gate; up] row order).
    silu: a_up = up, a_gate = silu(gate) (silu's slope is at most 1.1; silu(gate) * up is differentiated in each
    factor); silu_clamp under the same figure (its clamps only lower both slopes and both factors' magnitudes).
    swigluoai, (up' + 1) * g' * sigmoid(alpha g') with g' = min(gate, limit), up' = clamp(up, +-limit): a_up = up' + 1,
    a_gate = g' * sigmoid(alpha g') (d/dg of g sigmoid(alpha g) is silu's slope at alpha g, at most 1.1 for any alpha;
    the clamps zero a slope, never raise one)."""
    xf = x.float()
    I = w2.shape[2]
    mag = torch.zeros(x.shape[0], w2.shape[1])
    for e, tok, k in routed_experts(ids):
        w = w13[e].float()
        h, ah = xf[tok] @ w.t(), xf[tok].abs() @ w.abs().t()
        if w13_bias is not None:
            h = h + w13_bias[e].float()
        if activation == "swigluoai":
            g = h[:, :I].clamp(max=swiglu_limit)
            a_up, a_gate = h[:, I:].clamp(-swiglu_limit, swiglu_limit) + 1, g * torch.sigmoid(swiglu_alpha * g)
        else:
            a_up, a_gate = h[:, I:], torch.nn.functional.silu(h[:, :I])
        d = 1.1 * a_up.abs() * ah[:, :I] + a_gate.abs() * ah[:, I:]
        mag.index_add_(0, tok, (d @ w2[e].float().abs().t()) * weights[tok, k].abs().unsqueeze(1))
    return mag


def rounds_weights(fmt: str, group: int = 32) -> bool:
    """Whether the current tier's prefill rounds code x scale to bf16 for layers of this format (the amx
    tier's int4 group-32 panels, q4_folds, and fp8_block panels, fp8_folds; lvllm.testing.experts' int4 groups
    are 32)."""
    return lk_moe.isa() == "amx" and (fmt == "fp8_block" or (fmt == "wna16_int4" and group == 32))


def assert_matches_reference(out, x, w13, w2, ids, weights, weights_rounded=False, **act):
    """Compare with the fp32 torch reference, element by element, with a rigorous bound; act: the
    activation / bias options of moe_reference.

    The engine multiplies the same bf16 values with fp32 accumulation (fp16 inputs and weights are
    rounded to bf16 once, so the reference is taken on those rounded values). It differs from fp32
    math by (a) rounding the SwiGLU output to bf16 before the down projection, as GPU kernels do:
    each term of the down sum moves by at most u = 2^-8 (bf16 unit roundoff), so an output moves
    by at most u * mag, mag = sum_k |w_k| |w2_e| @ |act_e|; (b) rounding the result to bf16:
    at most u * |out|; (c) fp32 summation order and the exp() polynomial: ~1e-6 * mag.
    Bound per element: |out - ref| <= 1.01 * u * (mag + |ref|) + 1e-5 * mag.
    That bound is a worst case (correct layers reach ~0.1 of it), so the relative RMS error must
    also stay <= 2^-8 (random-signed roundings: measured 0.20-0.25% for a correct layer).
    A wrong expert, weight, slot or block breaks both by orders of magnitude.
    weights_rounded: the kernel rounds each weight (code x scale) to bf16 once, as vLLM's GPU kernels
    dequantize (the amx tier's int4 group-32 prefill, see csrc/cpu/kernels/int4.cpp q4_folds): each down
    term moves by u more (u * mag again) and each gate/up weight by u, which moves an output by at most
    u * folded_weights_magnitude (first order; the 1.01 covers the rest). The RMS limit grows by sqrt(2):
    the weights' roundings are a second random-signed source of the activation's size (measured 0.0035
    against 0.0023 without).
    The bound carries over to swigluoai and biases unchanged: the biases are added in fp32 on both
    sides, and the swigluoai clamps (min(gate, 7), clamp(up, -7, 7)) are 1-Lipschitz, so the kink at
    +-limit cannot amplify the fp32 summation-order differences of the pre-activations (covered by
    the 1e-5 * mag term).
    """
    x = x.bfloat16() if x.dtype == torch.float16 else x
    w13 = w13.bfloat16() if w13.dtype == torch.float16 else w13
    w2 = w2.bfloat16() if w2.dtype == torch.float16 else w2
    ref, mag = moe_reference(x, w13, w2, ids, weights, return_magnitude=True, **act)
    assert out.shape == ref.shape
    out = out.float()
    assert torch.isfinite(out).all()
    u = 2.0 ** -8
    err = (out - ref).abs()
    rounding = mag + ref.abs()
    if weights_rounded:
        activation = act.get("activation", "silu")
        assert activation in ("silu", "silu_clamp", "situ", "swigluoai") and not act.get("interleaved"), act
        consts = {k: act[k] for k in ("swiglu_alpha", "swiglu_limit", "w13_bias") if act.get(k) is not None}
        rounding = rounding + mag + folded_weights_magnitude(x, w13, w2, ids, weights, activation, **consts)
    bound = 1.01 * u * rounding + 1e-5 * mag
    worst = (err / bound.clamp_min(1e-30)).max().item()
    assert worst <= 1.0, f"error exceeds the rounding bound by {worst:.3g}x"
    rms = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    rel_rms = (err.pow(2).mean().sqrt() / rms).item()
    limit = 2 ** -8 * (2 ** 0.5 if weights_rounded else 1)
    assert rel_rms <= limit, f"relative RMS error {rel_rms:.4g} > {limit:.4g}"
    return rel_rms, worst


@contextlib.contextmanager
def int8_activations(on: bool, name: str = "LK_INT8_ACT"):
    """The int8-activation decode switch (LK_INT8_ACT, or its first name LK_WNA16_INT8_ACT) as a layer
    built inside sees it (read once, at construction); the other name is unset meanwhile."""
    names = ("LK_INT8_ACT", "LK_WNA16_INT8_ACT")
    before = {n: os.environ.get(n) for n in names}
    for n in names:
        os.environ.pop(n, None)
    os.environ[name] = "1" if on else "0"
    try:
        yield
    finally:
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


# Budget of the int8-activation path of the 4-bit formats and int8_channel (wna16_int4, mxfp4, nvfp4,
# int8_channel; LK_INT8_ACT=1, the chunks runs_int8 names): the activation rows (x, and the activation output
# before the down projection) are quantized per 32 inputs to symmetric int8 (d = max|x| / 127,
# llama.cpp's Q8_0 scheme), so each input moves by at most d / 2: uniform rounding, RMS d / sqrt(12)
# ~ max|x| / 440, i.e. ~2^-7.5 of the group's RMS for Gaussian-like x (max ~ 2.3 RMS over 32 values)
# and ~2^-7 for the heavier-tailed SwiGLU output (max ~ 3.7 RMS). The weight side is exact (integer
# codes; the scales are applied in fp32), so these roundings are the whole difference from the bf16
# path; they are random-signed and the two phases add in quadrature (the activation carries the
# phase-1 error into both factors): ~2^-6.5 relative RMS of the layer output expected (measured per
# format in its tests: 0.010-0.014). Budget: relative RMS <= 2^-6 (0.0156; grouping per 64 inputs or
# a wrong rounding would exceed it), and every element within 2^-4 * (mag + |ref|) (mag: the
# magnitude of assert_matches_reference's rounding analysis; a wrong block, scale, offset or zero
# point is off by O(1)). LK_INT8_ACT unset, auto or 0 (read when a layer is built) keeps bf16's error (15-bit
# activations, test_fp4_q15 / test_wna16); the generic tier never quantizes the activations, the amx tier
# only in decode chunks (<= 16 tokens): its prefill stays on AMX-BF16 panels. On avx2, avx512 and avx512_bf16
# LK_INT8_ACT=1 takes prefill chunks to the int8 tiles too (faster than their bf16 panels there:
# KernelTable::q8_prefill).
INT8_REL_RMS = 2.0 ** -6
INT8_PREFILL_TIERS = ("avx2", "avx512", "avx512_bf16")


def runs_int8(tier: str, rows: int) -> bool:
    """Whether a chunk of `rows` tokens of a layer built with LK_INT8_ACT=1 runs on int8 activations on `tier`:
    decode chunks (<= 16) on the tiers with the int8 kernels (all but generic), prefill ones on INT8_PREFILL_TIERS."""
    return tier != "generic" and (rows <= 16 or tier in INT8_PREFILL_TIERS)


def q8(v: torch.Tensor) -> torch.Tensor:
    """v rounded as the engine's q8 rows do (act_quant.cpp q8_row), per 32 values along the last dim (zero-padded
    to a multiple of 32): q = round_half_even(v x 127 / max|v|) times max|v| / 127; fp32."""
    v = v.float()
    n = v.shape[-1]
    g = torch.nn.functional.pad(v, (0, (-n) % 32)).reshape(*v.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(g * inv) * (amax / 127.0)).reshape(*v.shape[:-1], -1)[..., :n]


def assert_int8_budget(out, x, w13, w2, ids, weights, **act):
    """The int8-activation budget above against the fp32 reference on (w13, w2) as given; act: the
    activation / bias options of moe_reference. Returns the relative RMS error."""
    x = x.bfloat16() if x.dtype == torch.float16 else x
    ref, mag = moe_reference(x, w13, w2, ids, weights, return_magnitude=True, **act)
    assert out.shape == ref.shape
    err = (out.float() - ref).abs()
    rel_rms = (err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    worst = (err / (2.0 ** -4 * (mag + ref.abs())).clamp_min(1e-30)).max().item()
    assert rel_rms <= INT8_REL_RMS, f"relative RMS error {rel_rms:.4g} > {INT8_REL_RMS:.4g}"
    assert worst <= 1.0, f"an element is off by {worst:.3g}x the per-element bound"
    return rel_rms


def check_int8_decode(layer, tier: str, experts: int, top_k: int, ms, int8_check, exact_check):
    """Forwards of M random tokens for M in ms on a layer built with int8 activations: decode chunks
    (M <= 16) on the tiers with the int8 kernels (all but generic), and prefill chunks on INT8_PREFILL_TIERS,
    go to int8_check, the rest (amx prefill, generic: exact either way) to exact_check; both are
    called as check(out, x, ids, w)."""
    for M in ms:
        x = torch.randn(M, layer.hidden_size).bfloat16()
        ids, w = random_routing(M, experts, top_k)
        out = layer.forward(x, ids, w)
        (int8_check if runs_int8(tier, M) else exact_check)(out, x, ids, w)


def assert_nonfinite_input_propagates(layer, hidden: int):
    """A NaN in one token's input and an inf in another's make every output row non-finite that saw
    them (experts 0..3; the int8 activations carry them as a NaN scale, never as a finite code)."""
    x = torch.randn(2, hidden).bfloat16()
    x[0, 7] = float("nan")
    x[1, 100] = float("inf")
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    out = layer.forward(x, ids, torch.full((2, 2), 0.5))
    assert not torch.isfinite(out.float()).all(dim=1).any()


def with_changes(tensors: dict, **changes) -> dict:
    """A copy of a from_checkpoint tensor dict with entries replaced (None: removed)."""
    t = dict(tensors)
    for k, v in changes.items():
        if v is None:
            t.pop(k)
        else:
            t[k] = v
    return t
