"""The switch-on vs switch-off criterion of the e2e tests, on the JSON written by generate.py.

Per prompt, walking the generated positions while both runs have produced the same tokens:
- every token in both top-5 lists has logprobs within `tol` of each other;
- the greedy tokens are equal, unless the reference's top-1/top-2 margin is at most `tol` (a
  near-tie that bf16 CPU vs GPU arithmetic may flip); after such an allowed flip the contexts
  differ, so the rest of that prompt is not compared.
A flip where the margin exceeds `tol`, or a logprob outside `tol`, is a failure.
`min_coverage` guards against a vacuous pass (everything diverging at once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class Comparison:
    positions: int = 0  # positions compared
    total: int = 0  # positions generated
    max_logprob_diff: float = 0.0
    allowed_flips: int = 0
    failures: List[str] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        return self.positions / self.total if self.total else 0.0

    def ok(self, min_coverage: float) -> bool:
        return not self.failures and self.coverage >= min_coverage

    def summary(self) -> str:
        return (f"compared {self.positions}/{self.total} positions ({self.coverage:.0%}), max |dlogprob| "
                f"{self.max_logprob_diff:.4f}, near-tie flips {self.allowed_flips}, failures {len(self.failures)}"
                + (": " + "; ".join(self.failures[:5]) if self.failures else ""))


def _margin(top: dict) -> float:
    vals = sorted(top.values(), reverse=True)
    return vals[0] - vals[1] if len(vals) > 1 else float("inf")


def compare_outputs(ref: list, test: list, tol: float, label: str = "", into: Comparison = None) -> Comparison:
    """ref/test: lists (one per prompt) of {"tokens": [...], "logprobs": [{token: logprob}, ...]}."""
    c = into if into is not None else Comparison()
    if len(ref) != len(test):
        c.failures.append(f"{label}: {len(ref)} vs {len(test)} prompts")
        return c
    for p, (r, t) in enumerate(zip(ref, test)):
        c.total += len(r["tokens"])
        for i, (rt, tt) in enumerate(zip(r["tokens"], t["tokens"])):
            R, T = r["logprobs"][i], t["logprobs"][i]
            c.positions += 1
            for tok in set(R) & set(T):
                d = abs(R[tok] - T[tok])
                c.max_logprob_diff = max(c.max_logprob_diff, d)
                if d > tol:
                    c.failures.append(f"{label} prompt {p} pos {i}: token {tok} logprob {R[tok]:.4f} vs {T[tok]:.4f}")
            if rt != tt:
                m = _margin(R)
                if m > tol:
                    c.failures.append(f"{label} prompt {p} pos {i}: greedy {rt} vs {tt} with reference margin {m:.4f}")
                else:
                    c.allowed_flips += 1
                break
    return c
