#!/usr/bin/env python3
"""How far the GPU expert cache's policy is from what a routing trace allows (issue 25), without a GPU.

Per budget (slots of the layer's experts) and batch rows, on one of lk_moe.routing_trace's traces:
  policy     lk_moe.cache_policy's replay (lfu, the default; refills land GPU_LAG steps later, one per layer a step)
  hot-set    lk_moe.routing_trace.hot_set_bound: a cache that always holds the generator's current hot set, the best
             a policy can expect without knowing the future (its refills: the hot set's drift)
  belady     lk_moe.routing_trace.belady_hit_rate: the clairvoyant hit rate (it refills on every miss, so no speed-up
             is put on it)
and the decode speed-up the first two imply for a bandwidth-bound CPU side, k x rows expert reads a layer-step against
k x rows x (1 - hit) + refills (a refill reads one expert from host memory as the CPU does; rows' shared experts
ignored). The measured tok/s also pays the GPU's share and the hand-offs: see benchmarks/expert_cache.py.

    python dev/expert_cache_bounds.py --trace lru67 --budgets 0.125,0.25,0.5 --rows 1,4
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lk_moe.cache_policy import replay  # noqa: E402
from lk_moe.routing_trace import TRACES, belady_hit_rate, hot_set_bound, make_trace  # noqa: E402


def speedup(top_k: int, rows: int, hit: float, refills: float) -> float:
    reads = top_k * rows
    return reads / (reads * (1 - hit) + refills)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="lru67", choices=[t for t, s in TRACES.items() if s.lru_half_hit])
    ap.add_argument("--budgets", default="0.125,0.25,0.5", help="slots as fractions of a layer's experts")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    print(f"trace {a.trace}: {a.experts} experts, top-{a.top_k}, {a.steps} steps x {a.layers} layers")
    print(f"{'budget':>7} {'rows':>4} | {'policy hit':>10} {'refills':>7} {'x':>5} | {'hot-set hit':>11} {'refills':>7} "
          f"{'x':>5} | {'belady hit':>10}")
    for rows in [int(r) for r in a.rows.split(",")]:
        trace = make_trace(a.trace, a.steps, a.layers, a.experts, a.top_k, rows=rows)
        for budget in [float(b) for b in a.budgets.split(",")]:
            slots = round(budget * a.experts)
            r = replay(trace, slots)
            hh, hr = hot_set_bound(a.trace, a.experts, a.top_k, rows, slots)
            bh = belady_hit_rate(trace, slots)
            print(f"{budget:>7.3f} {rows:>4} | {r.hit_rate:>10.3f} {r.refills_per_layer_step:>7.2f} "
                  f"{speedup(a.top_k, rows, r.hit_rate, r.refills_per_layer_step):>5.2f} | {hh:>11.3f} {hr:>7.2f} "
                  f"{speedup(a.top_k, rows, hh, hr):>5.2f} | {bh:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
