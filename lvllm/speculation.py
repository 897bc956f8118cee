"""When speculative decoding pays under hybrid, measured on this machine.

A verify step computes k + 1 tokens of each request (the last accepted one and k drafts). On the GPU
that costs about one decode step; on the CPU engine it reads the routed experts of all k + 1 tokens,
and their union grows almost linearly with the tokens (top-8 of 128 experts: 4 tokens route to ~3.6x
the experts of one). Speculation pays when the tokens a verify step yields, on average, exceed what
it costs in plain decode steps:

    cost ratio r = T(k + 1) / T(1)          (CPU expert time of a verify step vs a plain step)
    tokens per step = 1 + a + a^2 + ... + a^k   (a: the chance each draft token is accepted, i.i.d.;
                                                 vLLM reports this as the mean acceptance length)

so the break-even mean acceptance length is r, and past r >= k + 1 no acceptance rate can pay. The
startup summary prints r (measured on the engine with the model's own layer and routing drawn
uniformly, a pessimistic model: consecutive tokens of real text share some experts) and warns when the
configured k cannot pay. Draft cost is left out (n-gram drafts cost nothing; an MTP draft layer on the
GPU costs little next to the CPU experts).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional


def tokens_per_step(acceptance: float, k: int) -> float:
    """Expected tokens a verify step yields: 1 + a + ... + a^k."""
    if not 0.0 <= acceptance <= 1.0 or k < 0:
        raise ValueError("acceptance must be in [0, 1] and k >= 0")
    return float(sum(acceptance ** i for i in range(k + 1)))


def break_even_acceptance(ratio: float, k: int) -> Optional[float]:
    """The per-token acceptance rate at which a verify step yields `ratio` tokens (speculation breaks
    even); None when even full acceptance (k + 1 tokens) cannot reach it. ratio <= 1 needs none: 0.0."""
    if k < 1 or not ratio > 0:
        raise ValueError("k must be >= 1 and ratio > 0")
    if ratio <= 1.0:
        return 0.0
    if ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tokens_per_step(mid, k) < ratio:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_distinct_experts(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens route to when each draws top_k of `experts` uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def measure_cost_ratio(step_time: Callable[[int], float], k: int) -> float:
    """T(k + 1) / T(1) from a timing function of the token count."""
    return step_time(k + 1) / step_time(1)


def engine_step_time(layer, top_k: int, reps: int = 7, seed: int = 0) -> Callable[[int], float]:
    """A timing function on one lk_moe.MoELayer: median seconds of a forward of M tokens with uniform
    random routing (fresh routing every rep, so no rep finds the previous one's experts in cache)."""
    import torch
    from lk_moe.reference import random_routing

    g = torch.Generator().manual_seed(seed)
    x_all = torch.randn(64, layer.hidden_size, generator=g).to(torch.bfloat16)

    def timed(M: int) -> float:
        times = []
        for _ in range(reps):
            ids, w = random_routing(M, layer.num_experts, top_k, generator=g)
            t = time.perf_counter()
            layer.forward(x_all[:M], ids, w)
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    return timed


def advice(ratio: float, k: int, method: str = "", union: Optional[float] = None) -> tuple:
    """(level, text) for the startup log: "info" when k can pay, "warning" when it cannot. union: the bytes of
    the verify step's expert union against one token's (expected_distinct_experts / top_k), the floor of
    `ratio` for a bandwidth-bound engine: how close the multi-token call comes to reading each expert once."""
    what = f"speculative decoding{f' ({method})' if method else ''} with k={k} draft tokens"
    a = break_even_acceptance(ratio, k)
    floor = (f"; its tokens route to {union:.2f}x one token's expert bytes, so the engine runs it at "
             f"{union / ratio:.2f} of that floor" if union else "")
    base = (f"lk_moe: {what}: a verify step ({k + 1} tokens per request) costs {ratio:.2f}x a plain decode "
            f"step's CPU expert time (measured on this machine, uniform routing{floor})")
    if a is None:
        return "warning", (base + f"; it cannot pay for itself here: even with every draft accepted a step yields "
                           f"{k + 1} tokens. Use fewer draft tokens, or put more layers on the GPU "
                           "(LVLLM_GPU_RESIDENT_MOE_LAYERS, LVLLM_GPU_EXPERT_CACHE)")
    return "info", (base + f"; it pays when vLLM's mean acceptance length exceeds {ratio:.2f} tokens per step "
                    f"(each draft token accepted with probability above {a:.0%})")
