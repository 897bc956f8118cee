"""The e2e tests' switch-on vs switch-off criterion (tests/e2e/compare.py) itself."""
from tests.e2e.compare import Comparison, compare_outputs


def out(tokens, tops):
    return {"tokens": tokens, "logprobs": tops}


REF = [out([5, 6, 7], [{"5": -0.1, "9": -2.5}, {"6": -0.50, "8": -0.55}, {"7": -0.2, "1": -3.0}])]


def test_identical_runs_pass():
    c = compare_outputs(REF, REF, 0.15)
    assert c.ok(1.0) and c.positions == 3 and c.max_logprob_diff == 0


def test_small_differences_pass_and_are_measured():
    test = [out([5, 6, 7], [{"5": -0.12, "9": -2.45}, {"6": -0.51, "8": -0.54}, {"7": -0.2, "1": -3.1}])]
    c = compare_outputs(REF, test, 0.15)
    assert c.ok(1.0) and abs(c.max_logprob_diff - 0.1) < 1e-9


def test_near_tie_flip_is_allowed_and_stops_the_prompt():
    test = [out([5, 8, 3], [{"5": -0.1, "9": -2.5}, {"8": -0.49, "6": -0.56}, {"3": -0.1}])]
    c = compare_outputs(REF, test, 0.15)
    assert not c.failures and c.allowed_flips == 1 and c.positions == 2
    assert not c.ok(0.9)  # coverage 2/3: too little compared for a 0.9 minimum


def test_clear_flip_fails():
    test = [out([9, 6, 7], [{"9": -0.1, "5": -2.5}, {"6": -0.5}, {"7": -0.2}])]
    c = compare_outputs(REF, test, 0.15)
    assert any("greedy 5 vs 9 with reference margin 2.4" in f for f in c.failures)


def test_logprob_outside_tolerance_fails():
    test = [out([5, 6, 7], [{"5": -0.1, "9": -2.5}, {"6": -0.50, "8": -0.55}, {"7": -0.6, "1": -3.0}])]
    c = compare_outputs(REF, test, 0.15)
    assert len(c.failures) == 1 and "pos 2" in c.failures[0]


def test_accumulates_over_calls():
    c = Comparison()
    compare_outputs(REF, REF, 0.15, into=c)
    compare_outputs(REF, REF, 0.15, into=c)
    assert c.positions == 6 and c.total == 6
