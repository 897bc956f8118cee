"""The MoE-layer oracle: how far each run's routed experts are from exact math on the inputs that run gave them.

For a model transformers lacks (DeepSeek-V4.1) the e2e comparison has stock vLLM as its only reference, and on a
model whose routers amplify rounding (V4.1: every pair of differently computed runs differs by one bf16 logit step
at the median and 5-9% of the positions by more than TOL) a switch-on run that rounds differently from stock's
kernels cannot be told from one that rounds worse by the outputs alone. Its experts can: tests/e2e/moe_capture.py
records, for each routed expert layer and prefill chunk, the layer's input rows, its routing (ids, weights) and its
output; here the checkpoint's experts (decoded from its files in fp32: lvllm.testing.expert_reference) applied to
those inputs and that routing in fp32 (lk_moe.reference.moe_reference) are the truth, and each call's error is the
relative RMS of (output - truth) over its rows.

Criterion: per layer, the test run's error is at most the reference's (stock's) x ERROR_FACTOR + ERROR_SLACK. bf16
rounding gives 0.0017-0.0044 (dev/moe_rounding.py on a tiny V4.1 layer with random rows: exact math rounded to bf16
0.0017, the CPU engine 0.0023, vLLM's Triton roundings emulated 0.0037, with a bf16 top-k sum 0.0044), so any of
those schemes passes against any other; a fault gives more (one of the 16 experts' down projection 5% off: 0.012,
30% off: 0.072; a wrong expert, row or scale: O(1)). Where the test's error is at most the reference's + EXACT_SLACK
on every layer, it is "at least as exact as stock" (compare.py then leaves the teacher-forced tail to stock's
rounding).

    python -m tests.e2e.moe_oracle --arch deepseek_v41 [--quant bf16] REF.pt TEST.pt [TEST2.pt ...]
"""
from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import torch

ERROR_FACTOR = 1.5
ERROR_SLACK = 0.003
EXACT_SLACK = 0.0002  # "at least as exact as stock": each layer's error <= stock's + this (sampling noise)


@dataclass
class LayerErrors:
    """Relative RMS errors of one run's calls, per decoder layer."""
    per_layer: Dict[int, List[float]] = field(default_factory=dict)
    rows: int = 0

    def layer(self, idx: int) -> float:
        """The layer's error over all its recorded calls (RMS of the per-call errors)."""
        v = self.per_layer[idx]
        return (sum(e * e for e in v) / len(v)) ** 0.5

    def summary(self) -> str:
        return ", ".join(f"layer {i} {self.layer(i):.5f}" for i in sorted(self.per_layer))


def call_error(rec: dict, ref: dict) -> float:
    """Relative RMS of one recorded call's output against the fp32 experts on its own inputs and routing."""
    from lk_moe.reference import moe_reference
    rest = {k: v for k, v in ref.items() if k not in ("w13", "w2")}
    truth = moe_reference(rec["x"].float(), ref["w13"], ref["w2"], rec["topk_ids"].long(), rec["topk_weights"].float(),
                          **rest)
    err = (rec["out"].float() - truth).pow(2).mean().sqrt()
    scale = truth.pow(2).mean().sqrt()
    return float(err / scale) if scale > 0 else float(err)


def run_errors(capture: dict, references) -> LayerErrors:
    """references(layer index) -> the reference_layer dict of that layer."""
    e = LayerErrors()
    for calls in capture["layers"].values():
        for rec in calls:
            e.per_layer.setdefault(rec["layer"], []).append(call_error(rec, references(rec["layer"])))
            e.rows += rec["x"].shape[0]
    return e


def problems(ref: LayerErrors, test: LayerErrors) -> List[str]:
    out = []
    if not test.per_layer:
        out.append("the test run recorded no MoE layer call")
    for i in sorted(test.per_layer):
        if i not in ref.per_layer:
            out.append(f"layer {i}: no reference call recorded")
            continue
        limit = ref.layer(i) * ERROR_FACTOR + ERROR_SLACK
        if test.layer(i) > limit:
            out.append(f"layer {i}: relative RMS error {test.layer(i):.5f} > {limit:.5f} (the reference's "
                       f"{ref.layer(i):.5f} x {ERROR_FACTOR} + {ERROR_SLACK})")
    return out


@dataclass
class ExpertsVerdict:
    """The oracle's word on a test run against the reference run, as compare.Comparison takes it."""
    problems: List[str]
    at_least_as_exact: bool  # every layer's error <= the reference's + EXACT_SLACK
    summary: str


def layer_references(model: str, arch: str, quant: str):
    """references(layer index) -> the checkpoint's experts of that layer in fp32 (decoded once per layer)."""
    from lvllm.testing.expert_reference import reference_layer
    return functools.lru_cache(maxsize=None)(lambda idx: reference_layer(model, arch, quant, idx))


def verdict(arch: str, quant: str, ref_path: str, test_path: str, model: str = None) -> ExpertsVerdict:
    """Both recordings (moe_capture.py's files) against the checkpoint's experts in fp32."""
    ref_cap, test_cap = (torch.load(p, weights_only=False) for p in (ref_path, test_path))
    references = layer_references(model or ref_cap["model"], arch, quant)
    ref, test = run_errors(ref_cap, references), run_errors(test_cap, references)
    p = problems(ref, test)
    exact = not p and all(test.layer(i) <= ref.layer(i) + EXACT_SLACK for i in test.per_layer)
    return ExpertsVerdict(p, exact, f"relative RMS error vs fp32 experts over {test.rows} rows: test {test.summary()}; "
                                    f"stock {ref.summary()}" + ("; at least as exact as stock" if exact else ""))


def main(argv) -> int:
    ap = argparse.ArgumentParser(description="python -m tests.e2e.moe_oracle --arch A [--quant Q] REF.pt TEST.pt...")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--quant", default="bf16", help="the checkpoint's expert format (its files' layout)")
    ap.add_argument("--model", help="the checkpoint (default: the one the reference run recorded)")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error("a reference run and at least one test run")
    caps = [torch.load(p, weights_only=False) for p in a.runs]
    references = layer_references(a.model or caps[0]["model"], a.arch, a.quant)
    ref = run_errors(caps[0], references)
    print(f"{a.runs[0]} (reference): {ref.rows} rows; relative RMS error vs fp32 experts: {ref.summary()}")
    bad = 0
    for path, cap in zip(a.runs[1:], caps[1:]):
        test = run_errors(cap, references)
        p = problems(ref, test)
        print(f"{path}: {test.rows} rows; relative RMS error vs fp32 experts: {test.summary()}; "
              + (f"FAIL: {'; '.join(p)}" if p else "ok"))
        bad += bool(p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
