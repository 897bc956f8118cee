"""The e2e tests' switch-on vs switch-off criterion (tests/e2e/compare.py) itself."""
import random

import pytest

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
    for i in range(3, 8):
        test[2]["logprobs"][i] = {"1": -0.5, "2": -1.0}  # 0.3 nats off before the flip
    _flip(test, 2, 10, 0.8)
    c = compare_outputs(ref, test)
    assert not c.ok() and any("earlier p90 0.300" in f for f in c.failures)


def _spike_then_flip():
    """Prompt 2 of the test run: a 1.4-nat spike at position 1, back in agreement at 2, a flip at 3."""
    ref, test = _prompts(5), _prompts(5)
    test[2]["logprobs"][1] = {"1": -1.6, "2": -1.2}
    _flip(test, 2, 3, 0.8)
    return ref, test


def test_a_flip_after_an_earlier_spike_fails():
    ref, test = _spike_then_flip()
    c = compare_outputs(ref, test, ref_again=_prompts(5))  # the reference agrees with itself there
    assert not c.ok() and any("earlier p90 1.400" in f for f in c.failures)


def test_an_earlier_spike_where_the_reference_disagrees_with_itself_is_left_out():
    """The reference's own second pass moved 1.4 nats at that position (a near-tie of its router):
    the difference there is no evidence against the test run, and the flip after it is a spike flip."""
    ref, test = _spike_then_flip()
    again = _prompts(5)
    again[2]["logprobs"][1] = {"1": -1.6, "2": -1.2}
    c = compare_outputs(ref, test, ref_again=again)
    assert c.ok() and len(c.spike_flips) == 1 and not c.failures


def test_compare_runs_hands_the_reference_second_pass_on():
    ref, test = _spike_then_flip()
    again = _prompts(5)
    again[2]["logprobs"][1] = {"1": -1.6, "2": -1.2}
    assert compare_runs({"runs": [ref, again]}, {"runs": [test]}).ok()
    assert not compare_runs({"runs": [ref, _prompts(5)]}, {"runs": [test]}).ok()


def _reference_parts_at(run, p, i):
    """The reference's second pass over prompt p generates another token at position i (its own near-tie there)."""
    run[p] = out(run[p]["tokens"][:i] + [3] + run[p]["tokens"][i + 1:], run[p]["logprobs"])


def test_a_flip_where_the_reference_parts_from_itself_is_its_noise():
    """Kimi-K3 (H100 2026-12-07): stock vLLM's own two passes generated different tokens at prompt 4 pos 6 (margin
    1.0 in its first pass), and the switch-on runs flipped exactly there."""
    ref, test, again = _prompts(5), _prompts(5), _prompts(5)
    for p in (0, 1, 3):
        _flip(test, p, 12, 0.8)
        _reference_parts_at(again, p, 12)
    c = compare_outputs(ref, test, ref_again=again)
    assert c.ok() and c.reference_flips == 3 and not c.spike_flips, c.summary()
    assert not compare_outputs(ref, test, ref_again=_prompts(5)).ok()  # where the reference agrees with itself


def test_positions_past_the_reference_parting_from_itself_are_not_compared():
    ref, test, again = _prompts(5), _prompts(5), _prompts(5)
    _reference_parts_at(again, 2, 5)
    for i in range(6, 20):
        test[2]["logprobs"][i] = {"1": -1.2, "2": -2.4}  # a whole nat off, where the reference is no yardstick
    c = compare_outputs(ref, test, ref_again=again)
    assert c.ok() and c.total == 4 * 20 + 5 and c.generated == 100 and c.positions == 85, c.summary()
    assert not compare_outputs(ref, test, ref_again=_prompts(5)).ok()


def test_a_reference_that_rarely_reproduces_itself_judges_nothing():
    ref, again = _prompts(5), _prompts(5)
    for p in range(5):
        _reference_parts_at(again, p, 3)
    c = compare_outputs(ref, _prompts(5), ref_again=again)
    assert "too noisy to judge by" in c.summary()


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


def _scored(tops_per_prompt):
    return [{"tokens": list(range(len(t) + 1)), "top": t} for t in tops_per_prompt]


def _truth(n, vocab=4, best=1):
    """fp32 log-softmax rows whose argmax is `best`, with a 1-nat margin."""
    import torch
    row = torch.full((vocab,), -4.0)
    row[best], row[(best + 1) % vocab] = -0.3, -1.3
    return [row.repeat(n, 1)]


def test_oracle_stats_count_flips_and_drift():
    from tests.e2e.compare import oracle_stats
    fp32 = _truth(4)
    st = oracle_stats(_scored([[{"1": -0.3, "2": -1.3}, {"1": -0.4, "2": -1.2}, {"2": -0.2, "1": -1.0},
                               {"1": -0.3}]]), fp32)
    assert st.positions == 4 and st.flips == 1
    assert [round(d, 6) for d in st.drift] == [0.0, 0.1, 1.1, 0.0]


def test_oracle_stats_reject_mismatched_data():
    from tests.e2e.compare import oracle_stats
    with pytest.raises(ValueError, match="2 scored prompts but 1"):
        oracle_stats(_scored([[{"1": -0.3}], [{"1": -0.3}]]), _truth(1))
    with pytest.raises(ValueError, match="has 2 positions, its fp32 twin 3"):
        oracle_stats(_scored([[{"1": -0.3}, {"1": -0.3}]]), _truth(3))
    with pytest.raises(ValueError, match="no logprobs"):
        oracle_stats(_scored([[{}]]), _truth(1))


def _stats(flips, drift, n=3000):
    from tests.e2e.compare import OracleStats
    return OracleStats(positions=n, flips=flips, drift=[drift] * n)


def test_oracle_verdict():
    from tests.e2e.compare import oracle_problems
    ref = _stats(150, 0.05)
    assert not oracle_problems(ref, _stats(150, 0.05))
    assert not oracle_problems(ref, _stats(190, 0.07))  # +27%: within 3 sigma of equal rates
    assert "teacher-forced flips" in oracle_problems(ref, _stats(230, 0.05))[0]  # +53%: a x1.3 expert
    assert "drift median" in oracle_problems(ref, _stats(150, 0.10))[0]
    assert "positions" in oracle_problems(ref, _stats(150, 0.05, n=10))[0]


def test_spike_flips_are_judged_by_the_teacher_forced_check():
    """With the check's data, isolated spike flips are not capped by count: the flip count over
    thousands of teacher-forced positions decides."""
    ref, test = _prompts(5), _prompts(5)
    for p in (0, 1, 3):
        _flip(test, p, 12, 0.8)
    c = compare_outputs(ref, test)
    c.oracle = (_stats(150, 0.05), _stats(160, 0.05))
    assert c.ok(), c.summary()
    assert "teacher-forced: reference 150/3000 flips" in c.summary()
    c.oracle = (_stats(150, 0.05), _stats(260, 0.05))
    assert not c.ok() and "teacher-forced flips vs fp32" in c.summary()


def test_runs_without_scored_prompts_cannot_take_the_check():
    res = {"runs": [REF, REF]}
    with pytest.raises(ValueError, match="no scored prompts"):
        compare_runs(res, res, fp32=[])
    a = {"runs": [REF], "scored": _scored([[{"1": -0.3}]])}
    b = {"runs": [REF], "scored": [{"tokens": [7, 8], "top": [{"1": -0.3}]}]}
    with pytest.raises(ValueError, match="different prompts"):
        compare_runs(a, b, fp32=_truth(1))
    assert compare_runs(a, a, fp32=_truth(1)).ok()


def test_a_flip_after_one_earlier_spike_is_a_spike_flip():
    """One earlier position off by 0.6 (a router spike whose token's keys/values reach later positions)
    with the other earlier positions agreeing is not drift."""
    ref, test = _prompts(5), _prompts(5)
    test[2]["logprobs"][5] = {"1": -0.8, "2": -0.6}
    _flip(test, 2, 12, 0.8)
    c = compare_outputs(ref, test)
    assert not c.failures and list(c.spike_flips) == [(2, 12)]


def test_e2e_summary_texts_are_what_the_plugin_prints():
    """The e2e tests find the GPU path in the startup summary ("GPU path of " + gpu_path's reason,
    lvllm/runtime.py); a wrong expected text cost a whole GPU run once."""
    from lk_moe.gpu_dequant import gpu_path
    from tests.e2e.test_switch import ENGINE_FORMAT, fallback_text, native_text
    for fmt in ENGINE_FORMAT.values():
        assert ("GPU path of " + gpu_path(fmt, (9, 0), force_fallback=True)[1]).startswith(fallback_text(fmt))
        path, reason = gpu_path(fmt, (9, 0), force_fallback=False)
        assert ("GPU path of " + reason).startswith(native_text(fmt)) == (path == "native")


def _scored_run(tops_per_prompt):
    return {"runs": [REF], "scored": _scored(tops_per_prompt)}


def test_without_fp32_truth_the_teacher_forced_positions_are_held_to_the_reference():
    """No transformers model (Kimi-K3): the scored prompts' logprobs (same contexts in both runs, so no divergence)
    are compared with the reference's under the generation's thresholds."""
    rng = random.Random(3)
    ref = [[{"1": -0.3, "2": -1.3} for _ in range(400)]]
    close = [[{k: v + rng.uniform(-0.07, 0.07) for k, v in top.items()} for top in ref[0]]]
    off = [[{k: v + rng.uniform(-1.0, 1.0) for k, v in top.items()} for top in ref[0]]]
    c = compare_runs(_scored_run(ref), _scored_run(close))
    assert c.ok() and len(c.forced) == 400 and "teacher-forced vs the reference: 400 positions" in c.summary()
    bad = compare_runs(_scored_run(ref), _scored_run(off))
    assert any("teacher-forced vs the reference: 90th percentile" in p for p in bad.problems())


def test_runs_that_scored_different_prompts_are_refused():
    other = {"runs": [REF], "scored": [{"tokens": [9, 9], "top": [{"1": -0.3}]}]}
    with pytest.raises(ValueError, match="scored different prompts"):
        compare_runs(_scored_run([[{"1": -0.3}]]), other)


# one prompt of 400 teacher-forced positions, and the same with every logprob of position i moved by shift(i)
_FORCED_REF = [[{"1": -0.3, "2": -1.3} for _ in range(400)]]


def _shifted(shift):
    return [[{k: v + shift(i) for k, v in top.items()} for i, top in enumerate(_FORCED_REF[0])]]


def test_a_yardstick_run_sets_the_thresholds_where_stock_is_noisier_than_the_floors():
    """DeepSeek-V4.1 (H100 2026-12-07): every pair of its runs differed teacher-forced by 5-9% of the positions beyond
    TOL. A stock run that differs from the reference only numerically measures that noise; the test may reach it
    x DRIFT_FACTOR + DRIFT_SLACK, a fault (every position a nat off) still fails."""
    ref = _FORCED_REF

    def noisy(share):  # one bf16 logit step, two at a fifth of the positions, a router near-tie's half nat at `share`
        return _shifted(lambda i: 0.5 if i < share * 400 else 0.125 if i % 5 == 0 else 0.0625)

    test, stock_again = noisy(0.09), noisy(0.06)
    alone = compare_runs(_scored_run(ref), _scored_run(test))
    assert any("teacher-forced vs the reference: 9% of positions" in p for p in alone.problems()), alone.summary()
    c = compare_runs(_scored_run(ref), _scored_run(test), yardstick=_scored_run(stock_again))
    assert c.ok() and "yardstick (stock vs the reference)" in c.summary(), c.summary()
    assert not compare_runs(_scored_run(ref), _scored_run(noisy(0.4)), yardstick=_scored_run(stock_again)).ok()
    fault = _shifted(lambda i: 1.0)
    assert not compare_runs(_scored_run(ref), _scored_run(fault), yardstick=_scored_run(stock_again)).ok()
    # a yardstick quieter than the floors leaves them as they are
    assert not compare_runs(_scored_run(ref), _scored_run(test), yardstick=_scored_run(ref)).ok()


def test_spike_flips_the_yardstick_makes_too_are_not_the_tests():
    """Kimi-K3's tiny MXFP4 checkpoint (H100 2026-12-07): stock vLLM on the quantized file flipped 3 tokens against the
    bf16 twin, and the switch-on runs flipped exactly these; a fourth flip of the test's own still counts."""
    ref, test, stock = _prompts(5), _prompts(5), _prompts(5)
    for p in (0, 1, 3):
        _flip(test, p, 12, 0.8)
        _flip(stock, p, 12, 0.8)
    c = compare_runs({"runs": [ref]}, {"runs": [test]}, yardstick={"runs": [stock]})
    assert c.ok() and "spike flips 3" in c.summary() and "the yardstick makes 3 too" in c.summary(), c.summary()
    _flip(stock, 3, 12, -0.8)  # the yardstick's flip at prompt 3 goes to another token
    stock[3]["tokens"][12] = 9
    _flip(test, 4, 7, 0.8)
    c = compare_runs({"runs": [ref]}, {"runs": [test]}, yardstick={"runs": [stock]})
    assert len(c.own_spike_flips) == 2 and c.ok(), c.summary()
    _flip(test, 2, 9, 0.8)
    c = compare_runs({"runs": [ref]}, {"runs": [test]}, yardstick={"runs": [stock]})
    assert not c.ok() and "3 flips beyond the margin" in c.summary(), c.summary()


def test_experts_at_least_as_exact_as_stock_leave_the_teacher_forced_tail_to_stock():
    """DeepSeek-V4.1's CPU-prefill run (H100 2026-12-07): 9% of the teacher-forced positions beyond TOL against stock,
    whose rechunked yardstick moved none; the MoE-layer oracle decides whose rounding that is."""
    from types import SimpleNamespace as Verdict

    def noisy(share):  # one bf16 logit step, a router near-tie's half nat at `share` of the positions
        return _shifted(lambda i: 0.5 if i < share * 400 else 0.0625)

    def check(test, experts):
        c = compare_runs(_scored_run(_FORCED_REF), _scored_run(test), yardstick=_scored_run(_FORCED_REF))
        c.experts = experts
        return c

    exact = Verdict(problems=[], at_least_as_exact=True, summary="test layer 1 0.00230; stock layer 1 0.00370")
    worse = Verdict(problems=[], at_least_as_exact=False, summary="test layer 1 0.00400; stock layer 1 0.00370")
    fault = Verdict(problems=["layer 1: relative RMS error 0.05000 > 0.00855"], at_least_as_exact=False, summary="")
    assert check(noisy(0.09), exact).ok(), check(noisy(0.09), exact).summary()
    assert "MoE layers: test layer 1 0.00230" in check(noisy(0.09), exact).summary()
    assert any("9% of positions" in p for p in check(noisy(0.09), worse).problems())
    assert any("MoE layers vs fp32 experts: layer 1" in p for p in check(noisy(0.01), fault).problems())
    assert not check(_shifted(lambda i: 1.0), exact).ok()  # a fault outside the experts: every position a nat off


def test_the_yardstick_is_ignored_where_fp32_truth_decides():
    run = {"runs": [REF], "scored": _scored([[{"1": -0.3}]])}
    c = compare_runs(run, run, fp32=_truth(1), yardstick={"runs": [REF]})
    assert c.yardstick is None and c.oracle is not None


def test_a_reference_that_rarely_reproduces_itself_leaves_the_verdict_to_the_teacher_forced_check():
    ref, again = _prompts(5), _prompts(5)
    for p in range(5):
        _reference_parts_at(again, p, 3)
    scored = _scored([[{"1": -0.3, "2": -1.3}] * 50])
    c = compare_runs({"runs": [ref, again], "scored": scored}, {"runs": [_prompts(5)], "scored": scored})
    assert c.ok() and "the teacher-forced check decides" in c.summary(), c.summary()


def test_a_fault_under_a_noisy_yardstick_still_fails_by_the_median():
    """A yardstick from a quantized file whose own kernels quantize activations loosens the tail's thresholds; a
    fault moves most positions, which the median catches."""
    ref = _FORCED_REF
    loose = _shifted(lambda i: 0.5 if i % 3 == 0 else 0.0625)  # a third of the positions half a nat off
    fault = _shifted(lambda i: 0.3)
    c = compare_runs(_scored_run(ref), _scored_run(fault), yardstick=_scored_run(loose))
    assert [p for p in c.problems() if "median" in p] == ["teacher-forced vs the reference: median 0.300 > 0.114"]
    assert compare_runs(_scored_run(ref), _scored_run(_shifted(lambda i: 0.0625)), yardstick=_scored_run(loose)).ok()
