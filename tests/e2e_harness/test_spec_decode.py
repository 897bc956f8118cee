"""lvllm.testing.spec_decode: the draft counters read from vLLM's metrics and the repeating prompts that the n-gram
e2e test and the decode benchmark share."""
from types import SimpleNamespace

import pytest

from lvllm.testing.spec_decode import repeated, spec_counters


class _MetricsOf:
    """An object with vLLM's LLM.get_metrics() surface: a list of (name, value) metrics."""

    def __init__(self, metrics):
        self._metrics = [SimpleNamespace(name=n, value=v) for n, v in metrics]

    def get_metrics(self):
        return self._metrics


def test_spec_counters_sum_over_engines_and_ignore_other_metrics():
    llm = _MetricsOf([("vllm:spec_decode_num_drafts", 3), ("vllm:spec_decode_num_drafts", 4),
                      ("vllm:spec_decode_num_draft_tokens", 21), ("vllm:spec_decode_num_accepted_tokens", 9),
                      ("vllm:num_requests_running", 2)])
    assert spec_counters(llm) == {"drafts": 7, "draft_tokens": 21, "accepted_tokens": 9}


def test_spec_counters_are_zero_without_speculation():
    assert spec_counters(_MetricsOf([("vllm:num_requests_running", 1)])) == \
        {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}


def test_repeated_prompt_repeats_its_run_and_has_the_length_asked():
    run = [5, 9, 11]
    p = repeated(run, 10)
    assert p == [5, 9, 11, 5, 9, 11, 5, 9, 11, 5]
    assert repeated(run, 2) == [5, 9]
    assert repeated(run, 0) == []
    with pytest.raises(ValueError):
        repeated([], 4)


def test_generate_prompts_with_a_period_repeat_and_without_do_not():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from generate import prompts
    a, b = prompts(1000, [40, 17], period=8)
    assert a[:8] == a[8:16] == a[32:40] and len(a) == 40 and len(b) == 17 and b[:8] == b[8:16]
    (c,) = prompts(1000, [40])
    assert len(c) == 40 and c[:8] != c[8:16]
