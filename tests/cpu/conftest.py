import contextlib
import logging

import pytest
import torch

import lk_moe
from lk_moe.reference import moe_reference


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


def make_experts(E, H, I, dtype=torch.bfloat16, seed=0):
    """Random experts scaled like trained ones (unit-variance pre-activations)."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    return w13, w2


def assert_matches_reference(out, x, w13, w2, ids, weights):
    """Compare with the fp32 torch reference, element by element, with a rigorous bound.

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
    """
    x = x.bfloat16() if x.dtype == torch.float16 else x
    w13 = w13.bfloat16() if w13.dtype == torch.float16 else w13
    w2 = w2.bfloat16() if w2.dtype == torch.float16 else w2
    ref, mag = moe_reference(x, w13, w2, ids, weights, return_magnitude=True)
    assert out.shape == ref.shape
    out = out.float()
    assert torch.isfinite(out).all()
    u = 2.0 ** -8
    err = (out - ref).abs()
    bound = 1.01 * u * (mag + ref.abs()) + 1e-5 * mag
    worst = (err / bound.clamp_min(1e-30)).max().item()
    assert worst <= 1.0, f"error exceeds the rounding bound by {worst:.3g}x"
    rms = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    rel_rms = (err.pow(2).mean().sqrt() / rms).item()
    assert rel_rms <= 2 ** -8, f"relative RMS error {rel_rms:.4g} > 2^-8"
    return rel_rms, worst


def with_changes(tensors: dict, **changes) -> dict:
    """A copy of a from_checkpoint tensor dict with entries replaced (None: removed)."""
    t = dict(tensors)
    for k, v in changes.items():
        if v is None:
            t.pop(k)
        else:
            t[k] = v
    return t


@contextlib.contextmanager
def lvllm_log_records():
    """Collect (level, message) of what lvllm logs at INFO and above inside the block. vLLM's logging
    config (if vLLM was imported) stops propagation at "vllm": listen on lvllm's own logger."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelno, record.getMessage()))

    log = logging.getLogger("vllm.lvllm")
    handler, old_level = Keep(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
