"""When speculative decoding pays under hybrid (lvllm.speculation): the acceptance arithmetic, the
break-even rule, the engine measurement it is fed with, and the startup line."""
import logging
import types

import pytest

import lk_moe
from lvllm import speculation
from lvllm.config import from_env
from lvllm.runtime import WorkerRuntime

from ..engine.conftest import make_experts


def test_tokens_per_step():
    assert speculation.tokens_per_step(0.0, 3) == 1.0
    assert speculation.tokens_per_step(1.0, 3) == 4.0
    assert speculation.tokens_per_step(0.5, 3) == pytest.approx(1.875)
    with pytest.raises(ValueError):
        speculation.tokens_per_step(1.5, 3)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_break_even_acceptance(k):
    assert speculation.break_even_acceptance(0.9, k) == 0.0  # a verify step cheaper than a plain one
    assert speculation.break_even_acceptance(k + 1, k) is None  # needs more than every draft accepted
    for ratio in (1.2, (k + 2) / 2, k + 0.9):
        a = speculation.break_even_acceptance(ratio, k)
        assert 0.0 < a < 1.0 and speculation.tokens_per_step(a, k) == pytest.approx(ratio, rel=1e-9)


def test_expected_distinct_experts():
    # top-8 of 128: 4 tokens route to ~29 distinct experts, 3.6x one token's 8
    assert speculation.expected_distinct_experts(128, 8, 1) == pytest.approx(8.0)
    assert speculation.expected_distinct_experts(128, 8, 4) == pytest.approx(128 * (1 - (120 / 128) ** 4))


def test_measured_ratio_on_the_engine():
    """A verify step of 4 tokens on a real layer costs more than a plain step and less than 4 separate
    steps would with no shared work (loose: timing on a shared 2-core machine). The experts (64 of 3 MiB) outgrow the
    caches, so a step's time is its expert reads, as in a real model (~3.3x the experts for 4 tokens of top-8); with
    32 experts of 0.2 MiB the fixed costs ruled and a noisy run measured 0.93 (CI, 2026-12-05)."""
    w13, w2 = make_experts(64, 1024, 512)
    layer = lk_moe.MoELayer(w13, w2)
    ratio = speculation.measure_cost_ratio(speculation.engine_step_time(layer, top_k=8), k=3)
    assert 1.0 < ratio < 8.0, ratio


def test_advice_levels():
    level, text = speculation.advice(4.2, 3, "ngram")
    assert level == "warning" and "cannot pay for itself" in text and "k=3" in text and "(ngram)" in text
    level, text = speculation.advice(2.0, 3)
    a = speculation.break_even_acceptance(2.0, 3)
    assert level == "info" and "exceeds 2.00 tokens per step" in text and f"{a:.0%}" in text
    union = speculation.expected_distinct_experts(128, 8, 4) / 8  # 3.64x: 4 tokens' union of top-8 of 128
    level, text = speculation.advice(3.75, 3, "ngram", union)
    assert "(measured on this machine, uniform routing; its tokens route to 3.64x one token's expert bytes, so the " \
           "engine runs it at 0.97 of that floor)" in text


def test_startup_line(caplog):
    rt = WorkerRuntime(from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_STATS_INTERVAL": "0"}))
    assert rt.speculation is None  # no vLLM config in this process
    rt._log_speculation()  # nothing to say
    w13, w2 = make_experts(16, 256, 128)
    rt.monitor.first = types.SimpleNamespace(layer=lk_moe.MoELayer(w13, w2), top_k=4)
    rt.speculation = (2, "ngram")
    with caplog.at_level(logging.INFO, logger="vllm.lvllm"):
        rt._log_speculation()
    line = next(r.getMessage() for r in caplog.records if "speculative decoding (ngram) with k=2" in r.getMessage())
    union = speculation.expected_distinct_experts(16, 4, 3) / 4  # 3 tokens, top-4 of 16 experts: 2.58x
    assert f"its tokens route to {union:.2f}x one token's expert bytes" in line, line
