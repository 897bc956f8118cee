"""The e2e tests' switch-on vs switch-off criterion (tests/e2e/compare.py) itself."""
import random

from tests.e2e.compare import Comparison, compare_outputs, compare_runs


def out(tokens, tops):
    return {"tokens": tokens, "logprobs": tops}


REF = [out([5, 6, 7], [{"5": -0.1, "9": -2.5}, {"6": -0.50, "8": -0.85}, {"7": -0.2, "1": -3.0}])]


def test_identical_runs_pass():
    c = compare_outputs(REF, REF)
    assert c.ok() and c.positions == 3 and c.max_logprob_diff == 0


def test_small_differences_pass_and_are_measured():
    test = [out([5, 6, 7], [{"5": -0.12, "9": -2.45}, {"6": -0.51, "8": -0.84}, {"7": -0.2, "1": -3.1}])]
    c = compare_outputs(REF, test)
    assert c.ok() and abs(c.max_logprob_diff - 0.1) < 1e-9


def test_near_tie_flip_is_allowed_and_stops_the_prompt():
    test = [out([5, 8, 3], [{"5": -0.1, "9": -2.5}, {"8": -0.49, "6": -0.56}, {"3": -0.1}])]
    c = compare_outputs(REF, test)
    assert not c.failures and c.allowed_flips == 1 and c.positions == 2
    assert not c.ok(min_coverage=0.9)  # 2 of 3 positions compared


def test_clear_flip_fails():
    test = [out([9, 6, 7], [{"9": -0.1, "5": -2.5}, {"6": -0.5}, {"7": -0.2}])]
    c = compare_outputs(REF, test)
    assert not c.ok() and "greedy 5 vs 9 with reference margin 2.4" in c.summary()


def _prompts(n, length=20):
    """n prompts whose every position has a clear margin (1.0)."""
    return [out([1] * length, [{"1": -0.2, "2": -1.2} for _ in range(length)]) for _ in range(n)]


def _flip(run, p, i, jump):
    """Prompt p of run flips at position i: that position's logprobs move by `jump` nats."""
    run[p] = out(run[p]["tokens"][:i] + [2], run[p]["logprobs"][:i] + [{"1": -0.2 - jump, "2": -1.2 + jump}])


def test_an_isolated_router_spike_may_flip_a_clear_margin():
    ref, test = _prompts(5), _prompts(5)
    _flip(test, 4, 19, 0.8)  # a spike at the last position: margin 1.0, nothing before it
    c = compare_outputs(ref, test)
    assert c.ok() and len(c.spike_flips) == 1 and "spike flips 1" in c.summary()


def test_a_flip_after_drift_fails():
    ref, test = _prompts(5), _prompts(5)
    test[2]["logprobs"][5] = {"1": -0.5, "2": -1.0}  # 0.3 nats off before the flip
    _flip(test, 2, 10, 0.8)
    c = compare_outputs(ref, test)
    assert not c.ok() and any("earlier max 0.300" in f for f in c.failures)


def test_spikes_flipping_several_prompts_fail():
    """A fault at one decode step flips the prompts of that batch together."""
    ref, test = _prompts(5), _prompts(5)
    for p in (0, 1, 3):
        _flip(test, p, 12, 0.8)
    c = compare_outputs(ref, test)
    assert not c.ok() and "3 flips beyond the margin" in c.summary()


def _noisy(ref, rng, scale, outlier_rate=0.0):
    """A copy of ref whose logprobs moved by uniform noise, and a few by a whole nat."""
    res = []
    for r in ref:
        tops = []
        for top in r["logprobs"]:
            big = rng.random() < outlier_rate
            tops.append({k: v + (1.0 if big else rng.uniform(-scale, scale)) for k, v in top.items()})
        res.append(out(list(r["tokens"]), tops))
    return res


def _ref(rng, prompts=4, n=32):
    return [out([1] * n, [{"1": -0.1, "2": -3.0} for _ in range(n)]) for _ in range(prompts)]


def test_rounding_noise_and_rare_router_flips_pass():
    rng = random.Random(0)
    ref = _ref(rng)
    c = compare_outputs(ref, _noisy(ref, rng, 0.07, outlier_rate=0.03))
    assert c.ok(), c.summary()


def test_a_wrong_layer_fails():
    # Every position off by up to a nat: what a wrong expert/scale does.
    rng = random.Random(1)
    ref = _ref(rng)
    c = compare_outputs(ref, _noisy(ref, rng, 1.0))
    assert not c.ok() and "90th percentile" in c.problems()[0]


def test_too_many_router_outliers_fail():
    rng = random.Random(2)
    ref = _ref(rng)
    c = compare_outputs(ref, _noisy(ref, rng, 0.05, outlier_rate=0.25))
    assert any("differ by more than" in p for p in c.problems())


def test_runs_compare_both_passes():
    res = {"runs": [REF, REF]}
    c = compare_runs(res, res)
    assert c.positions == 6 and c.total == 6 and c.ok()


def test_accumulates_over_calls():
    c = Comparison()
    compare_outputs(REF, REF, into=c)
    compare_outputs(REF, REF, into=c)
    assert c.positions == 6 and c.total == 6
