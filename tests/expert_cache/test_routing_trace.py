"""Synthetic routing traces (lk_moe.routing_trace): shapes, distinct picks, and the temporal locality
they are named by (the hit rate of a per-layer LRU cache of half the experts)."""
import numpy as np
import pytest

from lk_moe.routing_trace import TRACES, lru_hit_rate, make_trace


@pytest.mark.parametrize("experts,top_k", [(128, 8), (128, 4)])  # Qwen3-30B-A3B, gpt-oss-120b
def test_named_locality(experts, top_k):
    for name, spec in TRACES.items():
        t = make_trace(name, 300, 3, experts, top_k, rows=4, seed=3)
        assert t.shape == (300, 3, 4, top_k) and t.dtype == np.int32
        assert t.min() >= 0 and t.max() < experts
        flat = t.reshape(-1, top_k)
        assert all(len(set(r.tolist())) == top_k for r in flat)  # a row's experts are distinct
        rate = lru_hit_rate(t, experts // 2)
        want = 0.5 if spec.lru_half_hit is None else spec.lru_half_hit
        assert abs(rate - want) < 0.04, (name, rate)


def test_shift_moves_the_hot_set():
    t = make_trace("shift67", 400, 1, 128, 8, seed=5)
    def top(part):
        counts = np.bincount(part.reshape(-1), minlength=128)
        return set(np.argsort(-counts)[:16].tolist())
    before, after = top(t[150:200]), top(t[200:250])
    assert len(before & after) < 8


def test_deterministic_and_checked():
    a = make_trace("lru80", 20, 2, 64, 4, seed=9)
    assert np.array_equal(a, make_trace("lru80", 20, 2, 64, 4, seed=9))
    with pytest.raises(ValueError, match="trace must be one of"):
        make_trace("zipf", 10, 1, 64, 4)
    with pytest.raises(ValueError, match="hot set of"):
        make_trace("lru67", 10, 1, 16, 8)


def test_the_bounds_hold_the_policy_and_lru_below_them():
    """belady_hit_rate (clairvoyant) is at least LRU's and the cache policy's on the same trace; on a small sequence
    it is the textbook value; hot_set_bound gives every lookup at full capacity, the capacity's share on uniform
    routing, and lies between the policy's hit rate and Belady's at a quarter of the experts."""
    from lk_moe.cache_policy import replay
    from lk_moe.routing_trace import belady_hit_rate, hot_set_bound
    seq = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 4], dtype=np.int32).reshape(10, 1, 1, 1)
    assert belady_hit_rate(seq, 3) == 0.5  # misses: 1 2 3 (cold), 4 (evicts 3, used last), 3
    assert lru_hit_rate(seq, 3) == 0.4 and belady_hit_rate(seq, 0) == 0.0  # LRU also misses the last 4
    t = make_trace("lru67", 300, 2, 128, 8, seed=1)
    belady = belady_hit_rate(t, 32)
    assert belady >= lru_hit_rate(t, 32) and belady >= replay(t, 32).hit_rate
    hit, refills = hot_set_bound("lru67", 128, 8, 1, 32)
    assert replay(t, 32).hit_rate < hit < belady and refills > 0
    assert hot_set_bound("lru67", 128, 8, 1, 128)[0] == pytest.approx(1.0)
    assert hot_set_bound("uniform", 128, 8, 1, 32) == (0.25, 0.0)
