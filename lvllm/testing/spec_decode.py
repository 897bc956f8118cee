"""What the e2e tests and the decode benchmark share about speculative decoding: vLLM's own draft counters and
prompts that repeat (so n-gram drafts find matches)."""
from __future__ import annotations

# vLLM's speculative-decoding counters (its /metrics names) and their short names here
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}


def spec_counters(llm) -> dict:
    """vLLM's own speculative-decoding counters so far, summed over engines, by short name."""
    out = dict.fromkeys(SPEC_COUNTERS.values(), 0)
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[m.name]] += m.value
    return out


def repeated(run: list, n: int) -> list:
    """The first n tokens of `run` repeated: a prompt whose continuation an n-gram lookup can draft."""
    if not run:
        raise ValueError("repeated: an empty run")
    return (run * (n // len(run) + 1))[:n]
