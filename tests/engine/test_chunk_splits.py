"""The forward's two work splits against the fp32 reference, at M around their boundaries, per ISA tier.

(a) Activation chunks: ForwardJob::prepare (csrc/cpu/moe_layer.cpp) caps the tokens of one pass at
kChunkBudget / per-token scratch (~21.7k tokens at the Qwen3-30B shape), and run() loops over chunks
with a last, partial one. No other test reaches M that large, so the cap is forced small through the
_set_chunk_tokens test hook.
(b) Down-phase token ranges: plan_chunk splits a chunk's tokens into token_ranges_ ranges
(ceil(tc / 1024), doubled while there are too few work units: small H and two threads double it for
tc >= 32) of ceil(tc / token_ranges_) tokens each; uneven splits leave the last range short.

The outputs are written into a NaN-filled tensor, so a row the engine skips fails the finiteness check
instead of depending on what the allocator left there. Small shapes keep the whole file cheap: H=96
(6 blocks of 16 columns: too few units for two threads, so the ranges double), H=200 (padded to kp1,
so x is copied per chunk), formats whose chunk plans differ: bf16, wna16_int4 (exact and with int8
decode activations, which switch per chunk: chunks of <= 16 tokens on the AVX-512 tiers), int8_channel.
"""
import contextlib
import functools

import pytest
import torch

import lk_moe
from lk_moe.reference import random_routing

from .conftest import assert_int8_budget, assert_matches_reference, int8_activations, make_experts, runs_int8
from .test_channel_formats import make_channel_experts
from .test_mxfp4 import make_mxfp4
from .test_wna16 import make_int4_experts

E, K = 4, 2  # >= 16 slots per expert from M = 32 on: prefill-sized (wide) chunks, whose ranges double
GPT_OSS_ACT = dict(activation="swigluoai", interleaved=True)


@pytest.fixture(scope="module")
def pool():
    """Two workers: the range doubling depends on the thread count, so it is fixed here."""
    return lk_moe.make_pool(threads=2, binding="NONE")


@contextlib.contextmanager
def chunk_tokens(n: int):
    before = lk_moe._C._chunk_tokens()
    lk_moe._C._set_chunk_tokens(n)
    try:
        yield
    finally:
        lk_moe._C._set_chunk_tokens(before)


@functools.lru_cache(maxsize=None)
def _experts(fmt: str, H: int, I: int):
    """(tensors or None, reference w13, reference w2, moe_reference options) of E experts in fmt."""
    if fmt == "bf16":
        w13, w2 = make_experts(E, H, I, seed=H)
        return None, w13, w2, {}
    if fmt == "wna16_int4":
        return (*make_int4_experts(E, H, I, 32, True), {})
    if fmt == "mxfp4":  # gpt-oss style: swigluoai, interleaved rows, biases (added per row in phase 2)
        tensors, d13, d2, b13, b2 = make_mxfp4(E, H, I)
        return tensors, d13, d2, dict(GPT_OSS_ACT, w13_bias=b13, w2_bias=b2)
    return (*make_channel_experts(fmt, E, H, I, seed=H), {})


class Case:
    """A layer of fmt and its checks against the fp32 reference."""

    def __init__(self, fmt, H, I, pool, int8_act=False):
        tensors, self.d13, self.d2, self.act = _experts(fmt, H, I)
        with int8_activations(int8_act):
            if tensors is None:
                self.layer = lk_moe.MoELayer(self.d13, self.d2, pool=pool)
            else:
                kw = GPT_OSS_ACT if fmt == "mxfp4" else {}
                self.layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, pool=pool, **kw)
        # Chunks of <= 16 tokens on the AVX-512 tiers: int8 decode activations (LK_INT8_ACT) or, for
        # the 4-bit formats, q15 ones (the default); both within the int8 budget, the rest exact.
        self.switches = int8_act or fmt in ("mxfp4", "wna16_int4")

    def forward(self, x, ids, w):
        """Into a NaN-filled tensor: a row the engine skips fails the finiteness check."""
        out = torch.full(x.shape, float("nan"), dtype=x.dtype)
        return self.layer.forward_into(out, x, ids, w)

    def check(self, M, tier, chunk=0, x_dtype=torch.bfloat16):
        """A forward of M random tokens, with activation chunks of at most `chunk` tokens (0: as
        computed), each chunk's rows checked by the bound its path meets."""
        g = torch.Generator().manual_seed(M)
        x = torch.randn(M, self.layer.hidden_size, generator=g).to(x_dtype)
        ids, w = random_routing(M, E, K, generator=g)
        with chunk_tokens(chunk):
            out = self.forward(x, ids, w)
        unwritten = (~torch.isfinite(out.float())).all(dim=1).nonzero().flatten().tolist()
        assert not unwritten, (f"M={M}, chunk={chunk or 'computed'}: {len(unwritten)} rows left unwritten "
                               f"(rows {unwritten[:3]}{'...' if len(unwritten) > 3 else ''})")
        step = chunk or M
        for t0 in range(0, M, step):
            r = slice(t0, min(M, t0 + step))
            loose = self.switches and runs_int8(tier, r.stop - r.start)
            args = (out[r], x[r], self.d13, self.d2, ids[r], w[r])
            try:
                if loose:
                    assert_int8_budget(*args, **self.act)
                elif self.act:
                    assert_matches_reference(*args, **self.act)
                else:
                    assert_matches_reference(*args)
            except AssertionError as e:
                raise AssertionError(f"M={M}, chunk={chunk or 'computed'}, rows {r.start}-{r.stop - 1}: "
                                     f"{str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------ (a) activation chunks
CHUNK = 48
# below, at and past one chunk; several whole chunks; whole chunks and a partial one (of 1 and of 29 rows)
CHUNK_MS = (47, 48, 49, 96, 145, 221)
CASES = [("bf16", 96, 64, torch.bfloat16), ("bf16", 200, 72, torch.float16),  # x read in place / copied
         ("wna16_int4", 96, 64, torch.bfloat16), ("int8_channel", 200, 72, torch.bfloat16),
         ("mxfp4", 96, 64, torch.bfloat16)]


@pytest.mark.parametrize("fmt,H,I,x_dtype", CASES, ids=[f"{c[0]}-H{c[1]}-{str(c[3])[6:]}" for c in CASES])
def test_activation_chunks(tier, pool, fmt, H, I, x_dtype):
    case = Case(fmt, H, I, pool)
    for M in CHUNK_MS:
        case.check(M, tier, CHUNK, x_dtype)


def test_activation_chunks_switch_int8_decode(tier, pool):
    """int8 activations switch per chunk: of 40, 40 and 5 tokens, the prefill chunks run the exact bf16 path on
    amx and the int8 tiles on avx512 / avx512_bf16 (INT8_PREFILL_TIERS), the last one the int8 path on every
    AVX-512 tier; generic and avx2 stay exact throughout."""
    Case("wna16_int4", 96, 64, pool, int8_act=True).check(85, tier, 40)


def test_chunks_and_ranges_together(pool):
    """Chunks of 1101 tokens (two uneven token ranges each: 551 + 550) and a partial one of 99 (one range,
    doubled: 50 + 49), on the best tier."""
    Case("bf16", 96, 64, pool).check(2301, lk_moe.isa(), 1101)


def test_chunk_hook_is_a_cap():
    """0 restores the computed size; a cap above M changes nothing; negative caps are refused."""
    assert lk_moe._C._chunk_tokens() == 0
    w13, w2 = make_experts(E, 96, 64)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(30, 96).bfloat16()
    ids, w = random_routing(30, E, K)
    base = layer.forward(x, ids, w)
    with chunk_tokens(10 ** 9):
        assert torch.equal(layer.forward(x, ids, w), base)
    with pytest.raises(ValueError, match="chunk tokens"):
        lk_moe._C._set_chunk_tokens(-1)
    assert lk_moe._C._chunk_tokens() == 0


# ------------------------------------------------------------------ (b) down-phase token ranges
# 2 ranges (doubled) at 32..1024: odd M splits unevenly; ceil(M / 1024) = 2 at 1025..2048, 3 at 3001.
RANGE_MS = (33, 37, 1023, 1025, 1031, 2047, 3001)
RANGE_CASES = [("bf16", 96, 64), ("wna16_int4", 96, 64), ("int8_channel", 200, 72), ("mxfp4", 96, 64)]


@pytest.mark.parametrize("fmt,H,I", RANGE_CASES, ids=[f"{c[0]}-H{c[1]}" for c in RANGE_CASES])
def test_down_token_ranges(tier, pool, fmt, H, I):
    case = Case(fmt, H, I, pool)
    for M in RANGE_MS:
        case.check(M, tier)


def test_int_acts_hook_raises_the_integer_tiles_cap_and_refuses_nonsense():
    """benchmarks/prefill_formats.py's "+int": a 4-bit layer's 40-token chunk on the 15-bit integer tiles
    (bf16's accuracy, so the exact bound still holds) while the cap is raised; back to 16 after."""
    assert lk_moe._C._int_acts_max_tokens() == 16
    tensors, d13, d2 = make_int4_experts(E, 96, 64, 32, False)
    with int8_activations(False):
        layer = lk_moe.MoELayer.from_checkpoint("wna16_int4", tensors)
    x = torch.randn(40, 96).bfloat16()
    ids, w = random_routing(40, E, K)
    base = layer.forward(x, ids, w)
    lk_moe._C._set_int_acts_max_tokens(1 << 20)
    try:
        raised = layer.forward(x, ids, w)
    finally:
        lk_moe._C._set_int_acts_max_tokens(16)
    assert_matches_reference(raised, x, d13, d2, ids, w)
    if lk_moe.isa().startswith("avx512") or lk_moe.isa() == "amx":
        assert not torch.equal(raised, base)  # the q15 tiles ran: 15-bit rounding, not the panels' bf16
    for bad in (0, -1, (1 << 20) + 1):
        with pytest.raises(ValueError, match="int acts max tokens"):
            lk_moe._C._set_int_acts_max_tokens(bad)
    assert lk_moe._C._int_acts_max_tokens() == 16
