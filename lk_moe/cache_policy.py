"""Which routed experts of each layer sit in the GPU expert cache: a replacement policy that follows
recent routing. Pure numpy, host side, no GPU: `lk_moe.expert_cache` feeds it the per-expert routing
counts of the last step(s) and carries out the refills it plans; the CPU tests check it against a
plain Python model, and `simulate` replays a routing trace through it (hit rates without a GPU).

Two scores, one mechanism (per layer: an uncached expert replaces the lowest-scored cached one when
its score is higher by the margin):
  lfu  decayed frequency: score = score * 2^(-steps / half_life) + tokens routed to the expert.
       Follows a hot set that drifts, ignores one-off visits (the margin, MIN_SCORE), so refills, which
       read host memory the CPU decode also needs, stay rare. The default.
  lru  recency: score = the last step the expert was routed to (ties: the lower expert id first).

Published traces of Qwen-class models show little static skew but strong temporal locality, so a
fixed hot list would not do; `simulate` measures both policies on lk_moe.routing_trace's traces.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional

import numpy as np

POLICIES = ("lfu", "lru")
# Steps from a step's routing to the first step that can use the refills it causes, on the GPU
# (lk_moe.expert_cache.ExpertCache.before_step): counts taken, read, refills landed.
GPU_LAG = 3


# lfu's admission: an uncached expert replaces a cached one when its score is (1 + MARGIN) times higher,
# and enters at all from MIN_SCORE (two recent visits). Chosen on lk_moe.routing_trace's traces with
# `replay`'s refill counts (2026-12-03, 32 and 64 of 128 experts, 1 and 4 rows): against margin 0.5 and
# one visit, half the refills at 1-3% less hit rate, and a modeled 2-9% more decode speed (a refill
# reads as many host bytes as a CPU expert read); measured on the H200 with margin 0.5 and one visit:
# the refills' host reads explain the gap between the hit rate's bound and the tok/s
# (docs/results/2026-12-03_h200_session19.log).
MARGIN = 2.0
MIN_SCORE = 2.0


class Refill(NamedTuple):
    layer: int
    slot: int
    expert: int
    evicted: int  # the expert the slot held, -1 for an empty slot


class CachePolicy:
    """State of `layers` caches of `slots` slots over `experts` experts each.

    observe(counts) after each step (counts [layers, experts] of routed tokens; may cover several
    steps: `steps`), then plan() -> the refills to start now. The policy counts an expert as cached
    from the moment its refill is planned; the cache publishes it when its copy has landed."""

    def __init__(self, layers: int, experts: int, slots: int, policy: str = "lfu", half_life: float = 8.0,
                 margin: float = MARGIN, min_score: float = MIN_SCORE, max_refills_per_layer: int = 1):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if layers < 1 or experts < 1 or not 0 <= slots <= experts:
            raise ValueError(f"need layers >= 1, experts >= 1 and 0 <= slots <= experts (got {layers}, {experts}, {slots})")
        if not half_life > 0 or margin < 0 or max_refills_per_layer < 1:
            raise ValueError("half_life must be > 0, margin >= 0, max_refills_per_layer >= 1")
        self.policy, self.layers, self.experts, self.slots = policy, layers, experts, slots
        self.decay = 2.0 ** (-1.0 / half_life)
        self.margin, self.min_score, self.max_refills_per_layer = margin, min_score, max_refills_per_layer
        self.score = np.zeros((layers, experts), dtype=np.float64)
        self.slot_expert = np.full((layers, slots), -1, dtype=np.int64)  # what each slot holds (or gets)
        self.step = 0

    def observe(self, counts: np.ndarray, steps: int = 1) -> None:
        counts = np.asarray(counts)
        if counts.shape != (self.layers, self.experts):
            raise ValueError(f"counts must be [{self.layers}, {self.experts}], got {list(counts.shape)}")
        self.step += steps
        if self.policy == "lfu":
            self.score *= self.decay ** steps
            self.score += counts
        else:
            self.score = np.where(counts > 0, float(self.step), self.score)

    def cached(self, layer: int) -> np.ndarray:
        s = self.slot_expert[layer]
        return s[s >= 0]

    def plan(self, busy: Optional[np.ndarray] = None, limit: Optional[int] = None) -> List[Refill]:
        """The refills to start now: per layer at most max_refills_per_layer, each putting the
        highest-scored uncached expert into the slot of the lowest-scored cached one (an empty slot
        first) when it scores higher by the margin. busy [layers, slots] bool: slots not to choose
        (a refill that has not landed yet, a slot out of use); updated. limit: at most this many
        refills in all, the largest score gains first (filling an empty slot counts as the largest)."""
        if self.slots == 0 or limit == 0:
            return []
        out: List[Refill] = []
        rows = np.arange(self.layers)
        for _ in range(self.max_refills_per_layer):
            held = self.slot_expert
            in_cache = np.zeros((self.layers, self.experts), dtype=bool)
            r, c = np.nonzero(held >= 0)
            in_cache[r, held[r, c]] = True
            # Candidates: the best uncached expert per layer (lower id on ties: argmax takes the first).
            cand_score = np.where(in_cache, -np.inf, self.score)
            cand = cand_score.argmax(axis=1)
            best = cand_score[rows, cand]
            # Victims: empty slots score -inf, busy slots +inf (never chosen).
            victim_score = np.where(held >= 0, self.score[rows[:, None], np.maximum(held, 0)], -np.inf)
            if busy is not None:
                victim_score = np.where(busy, np.inf, victim_score)
            victim = victim_score.argmin(axis=1)
            worst = victim_score[rows, victim]
            if self.policy == "lfu":
                want = (best >= self.min_score) & (best > worst * (1.0 + self.margin))
            else:  # recency: any routed expert beats one seen less recently
                want = (best > 0) & (best > worst)
            want &= np.isfinite(best) & (worst < np.inf)
            if not want.any():
                break
            chosen = np.nonzero(want)[0]
            if limit is not None:
                gain = best[chosen] - worst[chosen]  # inf for an empty slot
                chosen = chosen[np.argsort(-gain, kind="stable")][:limit - len(out)]
            for layer in chosen:
                slot, expert = int(victim[layer]), int(cand[layer])
                evicted = int(held[layer, slot])
                held[layer, slot] = expert
                out.append(Refill(int(layer), slot, expert, evicted))
                if busy is not None:
                    busy[layer, slot] = True
            if limit is not None and len(out) >= limit:
                break
        return out


class Replay(NamedTuple):
    hit_rate: float
    refills_per_layer_step: float  # each reads one expert from host memory, as a CPU expert read does


def simulate(trace: np.ndarray, slots: int, policy: str = "lfu", lag: int = GPU_LAG, limit: Optional[int] = None,
             **kw) -> float:
    """Hit rate of the cache on `trace` (see `replay`)."""
    return replay(trace, slots, policy, lag, limit, **kw).hit_rate


def replay(trace: np.ndarray, slots: int, policy: str = "lfu", lag: int = GPU_LAG, limit: Optional[int] = None,
           **kw) -> Replay:
    """The cache on `trace` [steps, layers, rows, top_k] (expert ids, -1 = none): the routing of step t
    is observed after it ran, and the refills it causes serve step t + lag on (lag >= 1); limit: refills
    planned per step at most (all layers together). Returns the hit rate and the refills per layer and
    step."""
    if lag < 1:
        raise ValueError("lag must be >= 1")
    steps, layers, rows, k = trace.shape
    experts = int(trace.max()) + 1
    pol = CachePolicy(layers, experts, slots, policy, **kw)
    pending: List[List[Refill]] = []
    published = np.full((layers, slots), -1, dtype=np.int64)
    hits = lookups = refills = 0
    for t in range(steps):
        ids = trace[t].reshape(layers, rows * k)
        cached = np.zeros((layers, experts + 1), dtype=bool)
        r, c = np.nonzero(published >= 0)
        cached[r, published[r, c]] = True
        valid = ids >= 0
        hits += int(cached[np.arange(layers)[:, None], np.where(valid, ids, experts)][valid].sum())
        lookups += int(valid.sum())
        counts = np.zeros((layers, experts))
        np.add.at(counts, (np.repeat(np.arange(layers), rows * k)[valid.reshape(-1)], ids[valid]), 1)
        pol.observe(counts)
        busy = np.zeros((layers, slots), dtype=bool)
        for batch in pending:
            for f in batch:
                busy[f.layer, f.slot] = True
        pending.append(pol.plan(busy, limit=limit))
        refills += len(pending[-1])
        while len(pending) > lag - 1 and pending:
            for f in pending.pop(0):
                published[f.layer, f.slot] = f.expert
        # An evicted expert leaves the published set when its slot is planned over.
        for batch in pending:
            for f in batch:
                if published[f.layer, f.slot] == f.evicted:
                    published[f.layer, f.slot] = -1
    return Replay(hits / max(lookups, 1), refills / (steps * layers))
