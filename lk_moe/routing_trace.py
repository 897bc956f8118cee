"""Synthetic routing traces with controlled temporal locality, for measuring the GPU expert cache.

Benchmark-only: random or dummy weights route uniformly, so they cannot show what a cache does on a
real model. A trace replaces the router's expert ids inside the MoE op (lk_moe.expert_cache's replay,
switched on by benchmarks/expert_cache.py through vLLM's collective_rpc; nothing in serving does).

The model of locality (per layer, shared by the rows of a batch): a hot set of `hot` experts that
drifts (each step, each member is swapped for a random outsider with probability `drift`); each of a
row's top_k picks comes from the hot set with probability p_hot, else from the other experts; a row's
picks are distinct. p_hot is calibrated so that a per-layer LRU cache of half the experts hits the named rate
(published traces of Qwen-class models: LRU-64 of 128 experts hits ~67%, with little static skew).
A "shift" trace redraws every layer's hot set at once halfway through.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, NamedTuple, Optional

import numpy as np


class TraceSpec(NamedTuple):
    lru_half_hit: Optional[float]  # target hit rate of an LRU cache of experts/2 (None: uniform routing)
    shift: bool = False


# Each step, each hot expert is swapped for a random outsider with this probability (make_trace's default)
DRIFT = 0.02

TRACES: Dict[str, TraceSpec] = {
    "uniform": TraceSpec(None),
    "lru50": TraceSpec(0.50),
    "lru67": TraceSpec(0.67),
    "lru80": TraceSpec(0.80),
    "shift67": TraceSpec(0.67, shift=True),
}


def _generate(steps, layers, experts, top_k, rows, p_hot, hot, drift, shift_at, rng) -> np.ndarray:
    out = np.empty((steps, layers, rows, top_k), dtype=np.int32)
    cold_n = experts - hot

    def draw_hot_sets():
        return np.argsort(rng.random((layers, experts)), axis=1)  # [:, :hot] hot, [:, hot:] cold

    order = draw_hot_sets()
    slots = np.arange(top_k)
    for t in range(steps):
        if shift_at is not None and t == shift_at:
            order = draw_hot_sets()
        elif drift > 0 and cold_n:
            for layer, i in zip(*np.nonzero(rng.random((layers, hot)) < drift)):
                j = hot + rng.integers(cold_n)
                order[layer, i], order[layer, j] = order[layer, j], order[layer, i]
        # Per (layer, row): n_hot ~ Binomial(top_k, p_hot) picks from the hot set, the rest from the
        # cold experts, each without repetition (a random permutation of each, its first picks).
        n_hot = np.minimum(rng.binomial(top_k, p_hot, size=(layers, rows)), hot)
        n_hot = np.maximum(n_hot, top_k - cold_n)
        hot_pick = np.take_along_axis(order[:, None, :hot].repeat(rows, 1),
                                      np.argsort(rng.random((layers, rows, hot)), axis=2)[..., :top_k], axis=2) \
            if hot >= top_k else None
        cold_pick = np.take_along_axis(order[:, None, hot:].repeat(rows, 1),
                                       np.argsort(rng.random((layers, rows, cold_n)), axis=2)[..., :top_k], axis=2) \
            if cold_n >= top_k else None
        if hot_pick is None or cold_pick is None:
            raise ValueError("the hot set and the cold experts must each hold top_k experts")
        take_hot = slots[None, None, :] < n_hot[..., None]
        # Cold picks fill the slots after the hot ones, from the cold permutation's start.
        cold_idx = np.clip(slots[None, None, :] - n_hot[..., None], 0, top_k - 1)
        out[t] = np.where(take_hot, hot_pick, np.take_along_axis(cold_pick, cold_idx, axis=2))
    return out


def lru_hit_rate(trace: np.ndarray, capacity: int) -> float:
    """Hit rate of a per-layer LRU cache of `capacity` experts updated after every lookup (no lag):
    the yardstick the traces are named by."""
    steps, layers, rows, k = trace.shape
    hits = lookups = 0
    for layer in range(layers):
        lru: OrderedDict = OrderedDict()
        for t in range(steps):
            for e in trace[t, layer].reshape(-1):
                e = int(e)
                if e < 0:
                    continue
                lookups += 1
                if e in lru:
                    hits += 1
                    lru.move_to_end(e)
                else:
                    lru[e] = True
                    if len(lru) > capacity:
                        lru.popitem(last=False)
    return hits / max(lookups, 1)


def belady_hit_rate(trace: np.ndarray, capacity: int) -> float:
    """Hit rate of a per-layer cache of `capacity` experts that evicts the expert next used furthest ahead
    (clairvoyant, no lag, a refill at every miss): no policy hits more on the same trace."""
    steps, layers, rows, k = trace.shape
    hits = lookups = 0
    for layer in range(layers):
        seq = [int(e) for e in trace[:, layer].reshape(-1) if e >= 0]
        next_use, last = [0] * len(seq), {}
        for i in range(len(seq) - 1, -1, -1):
            next_use[i], last[seq[i]] = last.get(seq[i], len(seq)), i
        cache: dict = {}
        for i, e in enumerate(seq):
            lookups += 1
            if e in cache:
                hits += 1
            elif capacity == 0:
                continue
            elif len(cache) >= capacity:
                del cache[max(cache, key=cache.get)]
            cache[e] = next_use[i]
    return hits / max(lookups, 1)


def hot_set_bound(name: str, experts: int, top_k: int, rows: int, capacity: int) -> tuple:
    """(expected hit rate, refills a layer-step) of a cache of `capacity` that always holds the current hot set of
    the named trace (make_trace's defaults) and fills its other slots with cold experts: the best a policy can
    expect without knowing the future, as the cold picks are uniform; its refills follow the hot set's drift."""
    spec = TRACES[name]
    if spec.lru_half_hit is None:  # uniform routing: any capacity hits its share, nothing to follow
        return capacity / experts, 0.0
    hot = default_hot(experts, top_k)
    p = calibrate(spec.lru_half_hit, experts, top_k, rows, hot, DRIFT)
    if capacity >= hot:
        return p + (1 - p) * (capacity - hot) / (experts - hot), hot * DRIFT
    return p * capacity / hot, capacity * DRIFT


def default_hot(experts: int, top_k: int) -> int:
    """The hot set's size when make_trace is not given one."""
    return max(2 * top_k, experts // 8)


def make_trace(name: str, steps: int, layers: int, experts: int, top_k: int, rows: int = 1, seed: int = 0,
               hot: Optional[int] = None, drift: float = DRIFT, calibration_steps: int = 400) -> np.ndarray:
    """int32 [steps, layers, rows, top_k] expert ids of the named trace (TRACES). Rows are the requests
    of a decode batch; each row's picks are distinct. hot: the hot set's size (default max(2 top_k,
    experts / 8)); calibration: p_hot found by bisection on a short trace of 2 layers."""
    if name not in TRACES:
        raise ValueError(f"trace must be one of {', '.join(TRACES)}, got {name!r}")
    if not 1 <= top_k <= experts or steps < 1 or layers < 1 or rows < 1:
        raise ValueError("need 1 <= top_k <= experts and steps, layers, rows >= 1")
    spec = TRACES[name]
    hot = hot or default_hot(experts, top_k)
    if not top_k <= hot <= experts - top_k:
        raise ValueError(f"hot set of {hot}: need top_k <= hot <= experts - top_k ({top_k}, {experts})")
    shift_at = steps // 2 if spec.shift else None
    if spec.lru_half_hit is None:  # every row: top_k distinct experts drawn uniformly
        rng = np.random.default_rng(seed)
        return np.stack([np.argsort(rng.random((layers, rows, experts)), axis=2)[..., :top_k]
                         for _ in range(steps)]).astype(np.int32)
    p_hot = calibrate(spec.lru_half_hit, experts, top_k, rows, hot, drift, calibration_steps, seed)
    return _generate(steps, layers, experts, top_k, rows, p_hot, hot, drift, shift_at, np.random.default_rng(seed))


def calibrate(target: float, experts: int, top_k: int, rows: int, hot: int, drift: float, steps: int = 400,
              seed: int = 0) -> float:
    """p_hot whose trace gives an LRU cache of experts/2 the `target` hit rate (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        t = _generate(steps, 2, experts, top_k, rows, mid, hot, drift, None, np.random.default_rng(seed + 1))
        if lru_hit_rate(t, experts // 2) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
