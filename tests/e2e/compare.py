"""The switch-on vs switch-off criterion of the e2e tests, on the JSON written by generate.py.

Per prompt, positions are compared while both runs have generated the same tokens; at each
position the difference is the largest |logprob| gap over the tokens in both top-5 lists.

What the numbers look like (measured on the H200, 2026-11-30, tiny checkpoints with random
weights, logits of std ~3 computed in bf16): two runs of *stock* vLLM, or two passes over the same
prompts in one vLLM process, already differ: median 0.00-0.03, 90th percentile ~0.06, and 0-4% of
positions differ by 0.2-0.8 nats, where a near-tie among a router's top-k scores flips one expert
choice for that token. Greedy tokens flip only where the top-1/top-2 margin was <= 0.375.
The logits are bf16 (steps of 1/16 at magnitudes 8-16), so one step is ~0.06 nats.

Criterion (TOL = 0.15 = two bf16 logit steps plus rounding):
- typical positions: the 90th percentile of the differences is <= TOL;
- router near-ties: at most MAX_OUTLIERS (8%, twice the stock-vs-stock rate) of the positions
  differ by more than TOL;
- greedy flips only where the reference margin is <= FLIP_MARGIN (0.5; stock vs stock flipped at
  0.375); after a flip the contexts differ and the rest of that prompt is not compared;
- except router spikes: the large differences are isolated single positions (2026-11-30 runs, all 13
  positions beyond 0.3 nats in 8 switch-on runs: 0.37-1.55 at that position, <= 0.08 at the positions
  before and after), i.e. one token whose router top-k changed in some layer, not drift. Such a
  spike can flip a token whose margin is up to its size (seen: 0.50, 1.06, 1.50). A flip at a larger
  margin is accepted when the earlier positions of that prompt agreed (their 90th percentile <= TOL:
  a fault that drifts shows up before the flip; an earlier single spike does not count, its token's
  changed keys/values reach the later positions through attention) and the run passes the
  teacher-forced check against fp32 below; without fp32 truth, at most MAX_SPIKE_FLIPS such positions per
  comparison, not counting those where the yardstick (below) flips the same way (Kimi-K3's tiny MXFP4 checkpoint,
  H100 2026-12-07: stock vLLM on the quantized file flipped 3 tokens against the bf16 twin at margins 0.81-1.13,
  and the switch-on runs flipped exactly these);
- the reference's own noise: where the reference run's two passes differ by more than TOL (a router
  near-tie of the reference itself: stock vLLM on Kimi-K2.5's tiny int4 twin, H200 2026-12-03, 1.40 nats
  between its passes at the first decode token of a prompt), or generate different tokens, a difference
  or a flip says nothing of the test run: such positions are left out of the statistics and of the
  earlier agreement, a flip there counts as the reference's, and a prompt is compared only up to where
  the reference's passes part (past it, the reference's first pass is a path it does not take again).
  Stock vLLM on tiny Kimi-K3 (H100 2026-12-07) parted from itself in 5 of 8 prompts, 3 of them at margins
  0.75-1.0, and the switch-on runs flipped at exactly those positions;
- at least MIN_COVERAGE of the positions the reference reproduces were compared, and the reference
  reproduces at least MIN_COVERAGE of the generated ones (no vacuous pass; the teacher-forced check
  carries thousands of positions more).
A real fault (wrong expert, weight, scale, lost row, stale graph input) moves most positions by
O(1) nats and fails the first rule; one wrong layer in four is enough.

Teacher-forced check against exact math (why: no per-flip rule separates a router near-tie from a
bug on these models, but the flip COUNT does: docs/results/2026-11-30_epyc2c_oracle_calibration.log,
where one expert's weights x1.3 raised the count of flips against fp32 by 60-76%, x2 by 3-3.7x).
Each run also scores SCORED prompts (thousands of positions) with vLLM's prompt_logprobs; an fp32
HF transformers forward of the same checkpoint (tests/e2e/oracle.py) is the truth. For the
reference run and the test run alike: flips = positions whose top-1 differs from the fp32 argmax,
drift = per position the largest |logprob - fp32 logprob| over the run's top-5. The test run fails if
- its flips exceed the reference's by more than FLIP_Z standard deviations (sqrt of the sum of both
  counts, as for two Poisson counts) plus FLIP_SLACK: a 3-sigma one-sided test, so equal-quality
  runs fail about once in 700 comparisons (less: the two runs flip at mostly the same near-ties);
- its median or 90th-percentile drift exceeds the reference's x DRIFT_FACTOR + DRIFT_SLACK (bf16
  logits move in 1/16 steps; 0.02 nats is a third of one).
Where transformers has no such model (Kimi-K3, DeepSeek-V4.1), the scored prompts are compared with the reference
run's own teacher-forced logprobs instead, under the generation's thresholds (90th percentile <= TOL, at most
MAX_OUTLIERS beyond it) and a median <= TOL / 2 (one bf16 logit step and rounding): the same contexts in both runs,
so thousands of positions without divergence. Those floors assume stock's own noise is below them; on
DeepSeek-V4.1 (H100 2026-12-07) every pair of runs, switch on or off, CPU or GPU prefill, differed teacher-forced by
one bf16 logit step at the median and 3-6% of the positions by six steps or more (router near-ties), and
DeepSeek-V4's stock run drifts from fp32 truth by p90 0.33. So such a comparison may bring a yardstick: a stock run
that differs from the reference only numerically (another prefill chunking; or, for a quantized checkpoint against
its bf16 twin, stock vLLM on the quantized file itself, whose own kernels may quantize activations, as _check_w8a8
does with fp32 truth), compared with the reference the same way.
Each threshold is then the larger of the floor and the yardstick's figure x DRIFT_FACTOR + DRIFT_SLACK: the test
may differ from the reference as much as stock differs from itself, not more. A yardstick of another chunking may move
no router (V4.1, H100 2026-12-07: 2769 of 3594 teacher-forced positions moved, 17 beyond TOL) while a run whose experts
round more exactly than stock's kernels moves 9% beyond TOL: its distance from stock is then stock's rounding. So such
a comparison may also bring the MoE-layer oracle (tests/e2e/moe_oracle.py: each run's routed expert layers against the
checkpoint's experts in fp32 on that run's own inputs): its failures fail the test, and where it finds the test's
experts at least as exact as stock's on every layer, the teacher-forced share beyond TOL is reported, not held (its
median and 90th percentile still are: a fault outside the experts moves most positions). A reference that
reproduces its own generated tokens at less than MIN_COVERAGE of the positions judges nothing by generation; with
teacher-forced data (fp32 truth or the reference's scored prompts) that check decides, without it the comparison
fails.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

TOL = 0.15
MAX_OUTLIERS = 0.08
FLIP_MARGIN = 0.5
MIN_COVERAGE = 0.25  # of the positions the reference reproduces (8 prompts x 32 tokens x 2 passes where it always does)
MAX_SPIKE_FLIPS = 2  # without the teacher-forced check's data only
FLIP_Z = 3.0
FLIP_SLACK = 2
DRIFT_FACTOR = 1.5
DRIFT_SLACK = 0.02


def _quantile(values, q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _share_beyond(values, tol: float) -> float:
    return sum(v > tol for v in values) / len(values) if values else 0.0


@dataclass
class OracleStats:
    """One run's teacher-forced predictions against fp32 truth."""
    positions: int = 0
    flips: int = 0  # top-1 differs from the fp32 argmax
    drift: List[float] = field(default_factory=list)  # per position: max |lp - lp_fp32| over the run's top-5

    def summary(self) -> str:
        return (f"{self.flips}/{self.positions} flips vs fp32, drift median {_quantile(self.drift, 0.5):.3f} "
                f"p90 {_quantile(self.drift, 0.9):.3f}")


def oracle_stats(scored: list, fp32: list) -> OracleStats:
    """scored: generate.py's "scored" list ({"tokens", "top": [{token: logprob}] for positions 1..n-1});
    fp32: per prompt an fp32 [n-1, vocab] log-softmax (oracle.teacher_forced_logprobs), row i = the
    prediction of token i+1."""
    if len(scored) != len(fp32):
        raise ValueError(f"{len(scored)} scored prompts but {len(fp32)} fp32 ones")
    st = OracleStats()
    for sc, lp in zip(scored, fp32):
        if len(sc["top"]) != lp.shape[0]:
            raise ValueError(f"a scored prompt has {len(sc['top'])} positions, its fp32 twin {lp.shape[0]}")
        best = lp.argmax(dim=-1).tolist()
        for i, top in enumerate(sc["top"]):
            if not top:
                raise ValueError(f"scored position {i} has no logprobs")
            st.positions += 1
            st.flips += int(max(top, key=top.get)) != best[i]
            row = lp[i]
            st.drift.append(max(abs(v - float(row[int(t)])) for t, v in top.items()))
    return st


def oracle_problems(ref: OracleStats, test: OracleStats) -> List[str]:
    """The teacher-forced verdict (module docstring): is the test run farther from fp32 than the reference?"""
    out = []
    if not test.positions or ref.positions != test.positions:
        return [f"teacher-forced positions: reference {ref.positions}, test {test.positions}"]
    limit = ref.flips + FLIP_Z * (ref.flips + test.flips) ** 0.5 + FLIP_SLACK
    if test.flips > limit:
        out.append(f"{test.flips} teacher-forced flips vs fp32 > {limit:.0f} (reference {ref.flips} + "
                   f"{FLIP_Z:g} sigma + {FLIP_SLACK})")
    for name, q in (("median", 0.5), ("p90", 0.9)):
        r, t = _quantile(ref.drift, q), _quantile(test.drift, q)
        if t > r * DRIFT_FACTOR + DRIFT_SLACK:
            out.append(f"teacher-forced drift {name} {t:.3f} > {r:.3f} x {DRIFT_FACTOR:g} + {DRIFT_SLACK}")
    return out


def yardstick_limit(floor: float, yard_value: Optional[float]) -> float:
    """A threshold: the suite's floor or, with a yardstick run, the reference's own noise x DRIFT_FACTOR +
    DRIFT_SLACK where that is more (the test may be as far from the reference as stock is from itself)."""
    return floor if yard_value is None else max(floor, yard_value * DRIFT_FACTOR + DRIFT_SLACK)


@dataclass
class Comparison:
    diffs: List[float] = field(default_factory=list)  # one per compared position
    generated: int = 0  # positions generated
    total: int = 0  # of them, those before the reference's two passes part (it is no yardstick from there on)
    allowed_flips: int = 0
    reference_flips: int = 0  # flips where the reference's own two passes differ (its noise)
    failures: List[str] = field(default_factory=list)
    spike_flips: dict = field(default_factory=dict)  # (prompt, position) -> description
    spike_cases: dict = field(default_factory=dict)  # (prompt, position) -> (agreed tokens before, ref, test token)
    flip_tokens: dict = field(default_factory=dict)  # (prompt, position) -> the token of every flip, whatever its kind
    oracle: Optional[Tuple[OracleStats, OracleStats]] = None  # (reference, test) teacher-forced stats
    # without fp32 truth: per scored position, the test run's teacher-forced |dlogprob| against the reference's
    forced: List[float] = field(default_factory=list)
    # without fp32 truth: a stock run that differs from the reference only numerically, compared with it the same way
    yardstick: Optional["Comparison"] = None
    # without fp32 truth: the MoE-layer oracle on both runs (tests/e2e/moe_oracle.py ExpertsVerdict: .problems,
    # .at_least_as_exact, .summary)
    experts: Optional[object] = None

    @property
    def positions(self) -> int:
        return len(self.diffs)

    @property
    def coverage(self) -> float:
        return self.positions / self.total if self.total else 0.0

    def quantile(self, q: float) -> float:
        return _quantile(self.diffs, q)

    @property
    def max_logprob_diff(self) -> float:
        return max(self.diffs, default=0.0)

    def outlier_fraction(self, tol: float = TOL) -> float:
        return _share_beyond(self.diffs, tol)

    @property
    def reproduced(self) -> float:
        """The share of its generated positions the reference reproduced in its own second pass."""
        return self.total / self.generated if self.generated else 1.0

    @property
    def teacher_forced(self) -> bool:
        """Whether the comparison holds teacher-forced data (fp32 truth or the reference's scored prompts)."""
        return self.oracle is not None or bool(self.forced)

    @property
    def experts_exact(self) -> bool:
        """The MoE-layer oracle found the test run's experts at least as exact as the reference's on every layer."""
        return self.experts is not None and not self.experts.problems and self.experts.at_least_as_exact

    @property
    def own_spike_flips(self) -> dict:
        """The spike flips the yardstick does not make too: a flip the stock yardstick makes at the same position
        to the same token (the contexts before it are the reference's in both) is a property of what both runs
        compute differently from the reference (e.g. the quantized weights against their bf16 twin), not the
        test's."""
        y = self.yardstick.flip_tokens if self.yardstick is not None else {}
        return {k: v for k, v in self.spike_flips.items() if y.get(k) != self.spike_cases[k][2]}

    def problems(self, tol: float = TOL, max_outliers: float = MAX_OUTLIERS,
                 min_coverage: float = MIN_COVERAGE) -> List[str]:
        out = list(self.failures)
        y = self.yardstick
        limit = yardstick_limit(tol, y.quantile(0.9) if y is not None else None)
        if self.quantile(0.9) > limit:
            out.append(f"90th percentile {self.quantile(0.9):.3f} > {limit:.3f}")
        limit = yardstick_limit(max_outliers, y.outlier_fraction(tol) if y is not None else None)
        if self.outlier_fraction(tol) > limit:
            out.append(f"{self.outlier_fraction(tol):.0%} of positions differ by more than {tol} (max {limit:.0%})")
        if self.oracle is not None:
            out += oracle_problems(*self.oracle)
        else:
            median, p90 = _quantile(self.forced, 0.5), _quantile(self.forced, 0.9)
            share = _share_beyond(self.forced, tol)
            yf = y.forced if y is not None and y.forced else None
            limit = yardstick_limit(tol / 2, yf and _quantile(yf, 0.5))
            if median > limit:  # a fault moves most positions: the tail's thresholds alone may follow a noisy yardstick
                out.append(f"teacher-forced vs the reference: median {median:.3f} > {limit:.3f}")
            limit = yardstick_limit(tol, yf and _quantile(yf, 0.9))
            if p90 > limit:
                out.append(f"teacher-forced vs the reference: 90th percentile {p90:.3f} > {limit:.3f}")
            limit = yardstick_limit(max_outliers, yf and _share_beyond(yf, tol))
            if share > limit and not self.experts_exact:  # else: the reference's own rounding (see above)
                out.append(f"teacher-forced vs the reference: {share:.0%} of positions differ by more than {tol} "
                           f"(max {limit:.0%})")
        if self.experts is not None:
            out += [f"MoE layers vs fp32 experts: {p}" for p in self.experts.problems]
        own = self.own_spike_flips
        if self.oracle is None and len(own) > MAX_SPIKE_FLIPS:
            out.append(f"{len(own)} flips beyond the margin at isolated spikes (max {MAX_SPIKE_FLIPS} "
                       "without the fp32 teacher-forced check): " + "; ".join(own.values()))
        if self.coverage < min_coverage:
            out.append(f"only {self.coverage:.0%} of positions compared (min {min_coverage:.0%})")
        if self.reproduced < min_coverage and not self.teacher_forced:
            out.append(f"the reference reproduces its own tokens at only {self.reproduced:.0%} of the "
                       f"positions (min {min_coverage:.0%}): too noisy to judge by")
        return out

    def ok(self, **kw) -> bool:
        return not self.problems(**kw)

    def summary(self) -> str:
        p = self.problems()
        return self.figures() + (f"; FAIL: {'; '.join(p[:5])}" if p else "; ok")

    def figures(self) -> str:
        """The comparison's numbers without the suite's verdict (for comparisons judged otherwise)."""
        return (f"compared {self.positions}/{self.total} positions ({self.coverage:.0%}"
                + (f"; {self.generated} generated" if self.generated != self.total else "") + "); |dlogprob| median "
                f"{self.quantile(0.5):.3f} p90 {self.quantile(0.9):.3f} max {self.max_logprob_diff:.3f}; "
                f">{TOL}: {self.outlier_fraction():.0%}; near-tie flips {self.allowed_flips}"
                + (f"; flips at the reference's own near-ties {self.reference_flips}" if self.reference_flips else "")
                + (f"; spike flips {len(self.spike_flips)} ({'; '.join(self.spike_flips.values())})"
                   if self.spike_flips else "")
                + (f"; of them the yardstick makes {len(self.spike_flips) - len(self.own_spike_flips)} too"
                   if self.yardstick is not None and len(self.own_spike_flips) < len(self.spike_flips) else "")
                + (f"; teacher-forced: reference {self.oracle[0].summary()}, test {self.oracle[1].summary()}"
                   if self.oracle else "")
                + (f"; teacher-forced vs the reference: {len(self.forced)} positions, |dlogprob| median "
                   f"{_quantile(self.forced, 0.5):.3f} p90 {_quantile(self.forced, 0.9):.3f}, "
                   f">{TOL}: {_share_beyond(self.forced, TOL):.0%}" if self.forced else "")
                + (f"; the reference reproduces its own tokens at {self.reproduced:.0%} of the positions (the "
                   "teacher-forced check decides)" if self.reproduced < MIN_COVERAGE and self.teacher_forced else "")
                + (f"; MoE layers: {self.experts.summary}" if self.experts is not None else "")
                + (f"; yardstick (stock vs the reference): |dlogprob| p90 {self.yardstick.quantile(0.9):.3f}, "
                   f">{TOL}: {self.yardstick.outlier_fraction():.0%}"
                   + (f", teacher-forced p90 {_quantile(self.yardstick.forced, 0.9):.3f}, "
                      f">{TOL}: {_share_beyond(self.yardstick.forced, TOL):.0%}" if self.yardstick.forced else "")
                   if self.yardstick else ""))


def _margin(top: dict) -> float:
    vals = sorted(top.values(), reverse=True)
    return vals[0] - vals[1] if len(vals) > 1 else float("inf")


def _position_diff(R: dict, T: dict) -> float:
    """The largest |logprob| gap over the tokens in both top lists of one position."""
    return max((abs(R[k] - T[k]) for k in set(R) & set(T)), default=0.0)


def _reference_noise(ref: dict, ref_again: Optional[dict]) -> Tuple[set, Optional[int]]:
    """Where the reference run does not reproduce itself on one prompt: the positions where its second pass differs
    from its first by more than TOL while both still generate the same tokens, and the position where the two passes
    generate different tokens (None if they never do)."""
    if ref_again is None:
        return set(), None
    unstable = set()
    for i, (a, b) in enumerate(zip(ref["tokens"], ref_again["tokens"])):
        if _position_diff(ref["logprobs"][i], ref_again["logprobs"][i]) > TOL:
            unstable.add(i)
        if a != b:
            return unstable, i
    return unstable, None


def compare_outputs(ref: list, test: list, flip_margin: float = FLIP_MARGIN, label: str = "",
                    into: Comparison = None, ref_again: Optional[list] = None) -> Comparison:
    """ref/test: lists (one per prompt) of {"tokens": [...], "logprobs": [{token: logprob}, ...]};
    ref_again: the reference run's second pass over the same prompts, if there is one (its own noise)."""
    c = into if into is not None else Comparison()
    if len(ref) != len(test) or (ref_again is not None and len(ref_again) != len(ref)):
        c.failures.append(f"{label}: {len(ref)} vs {len(test)} prompts"
                          + (f" ({len(ref_again)} in the reference's second pass)" if ref_again is not None else ""))
        return c
    for p, (r, t) in enumerate(zip(ref, test)):
        unstable, diverged = _reference_noise(r, ref_again[p] if ref_again is not None else None)
        c.generated += len(r["tokens"])
        c.total += len(r["tokens"]) if diverged is None else diverged
        earlier = []  # differences at the earlier positions of this prompt (the reference's near-ties left out)
        for i, (rt, tt) in enumerate(zip(r["tokens"], t["tokens"])):
            R, T = r["logprobs"][i], t["logprobs"][i]
            d = _position_diff(R, T)
            noisy = i in unstable or i == diverged  # the reference does not reproduce itself here
            if not noisy:
                c.diffs.append(d)
            if rt != tt:
                c.flip_tokens[(p, i)] = tt
                m, before = _margin(R), _quantile(earlier, 0.9)
                what = (f"prompt {p} pos {i}: greedy {rt} vs {tt} with reference margin {m:.3f} "
                        f"(|dlogprob| here {d:.3f}, earlier p90 {before:.3f} max {max(earlier, default=0):.3f})")
                if noisy:
                    c.reference_flips += 1  # the reference's own passes differ here: its near-tie, not the test's
                elif m > flip_margin and before <= TOL:
                    c.spike_flips[(p, i)] = what  # a router spike at this position (see above)
                    c.spike_cases[(p, i)] = (list(r["tokens"][:i]), rt, tt)
                elif m > flip_margin:
                    c.failures.append(f"{label} {what}")
                else:
                    c.allowed_flips += 1
                break
            if i == diverged:
                break  # past here the reference's first pass is a path it does not take again: no yardstick
            if not noisy:
                earlier.append(d)
    return c


def compare_runs(ref_result: dict, test_result: dict, label: str = "", fp32: Optional[list] = None,
                 yardstick: Optional[dict] = None) -> Comparison:
    """Both passes of the test run (the second from the prefix cache) against the reference's first;
    with fp32 (oracle.teacher_forced_logprobs of the runs' scored prompts) also the teacher-forced check;
    without, a yardstick run (stock, differing from the reference only numerically) compared with the reference
    the same way sets the thresholds where its differences are larger than the suite's floors."""
    c = Comparison()
    if fp32 is None and yardstick is not None:
        c.yardstick = compare_runs(ref_result, yardstick, f"{label} yardstick")
    ref_again = ref_result["runs"][1] if len(ref_result["runs"]) > 1 else None
    for i, pass_ in enumerate(test_result["runs"]):
        compare_outputs(ref_result["runs"][0], pass_, label=f"{label} pass {i}", into=c, ref_again=ref_again)
    ref_sc, test_sc = ref_result.get("scored"), test_result.get("scored")
    if fp32 is not None and (not ref_sc or not test_sc):
        raise ValueError(f"{label}: a run has no scored prompts (generate.py predates the teacher-forced check)")
    if ref_sc and test_sc and [r["tokens"] for r in ref_sc] != [t["tokens"] for t in test_sc]:
        raise ValueError(f"{label}: the two runs scored different prompts")
    if fp32 is not None:
        c.oracle = (oracle_stats(ref_sc, fp32), oracle_stats(test_sc, fp32))
    elif ref_sc and test_sc:
        c.forced = [_position_diff(R, T) for r, t in zip(ref_sc, test_sc) for R, T in zip(r["top"], t["top"])]
    return c


def scored_prompts(result: dict) -> list:
    return [sc["tokens"] for sc in result.get("scored") or []]


def main(argv) -> int:
    """python -m tests.e2e.compare [--oracle MODEL_DIR | --yardstick Y.json] [--experts ARCH REF.pt TEST.pt] REF.json
    TEST.json [...]: re-evaluate saved runs; with --oracle, the teacher-forced check against that checkpoint in fp32
    (HF transformers); with --yardstick, the thresholds from a stock run that differs from the reference only
    numerically; with --experts, the MoE-layer oracle's verdict (tests/e2e/moe_oracle.py) on the two recordings
    (moe_capture.py's files of the reference's and the test's settings; bf16 checkpoints)."""
    oracle_model = yard = experts = None
    while argv[:1] in (["--oracle"], ["--yardstick"], ["--experts"]):
        opt, n = argv[0], 4 if argv[0] == "--experts" else 2
        if len(argv) < n:  # an option short of its values: the usage, not a file named like an option
            print(main.__doc__)
            return 2
        if opt == "--oracle":
            oracle_model = argv[1]
        elif opt == "--yardstick":
            with open(argv[1]) as f:
                yard = json.load(f)
        else:
            from .moe_oracle import verdict
            experts = verdict(argv[1], "bf16", argv[2], argv[3])
        argv = argv[n:]
    if len(argv) < 2 or (oracle_model and yard is not None):
        print(main.__doc__)
        return 2
    with open(argv[0]) as f:
        ref = json.load(f)
    fp32 = None
    if oracle_model:
        from .oracle import teacher_forced_logprobs
        fp32 = teacher_forced_logprobs(oracle_model, scored_prompts(ref))
    bad = 0
    for path in argv[1:]:
        with open(path) as f:
            c = compare_runs(ref, json.load(f), path, fp32=fp32, yardstick=yard)
        if fp32 is None:  # the oracle's word only where there is no fp32 truth (as test_switch._check)
            c.experts = experts
        print(f"{path}: {c.summary()}")
        bad += not c.ok()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
