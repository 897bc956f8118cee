"""CPU prefill of every expert format against bf16 prefill of the same shape, in the same run (not a test).

For each ISA tier asked for, each M and each format it prints the median layer time, the ratio to bf16
and the achieved TFLOP/s with its fraction of the tier's compute peak measured by a probe in the same run
(the bf16 tile on one small hot expert with many rows, the fastest the engine's tile runs on these cores).
The ratio is paired: each of a format's forwards runs between two bf16 forwards on the same inputs and is
divided by their mean, so drift slower than one forward (other tenants, clocks) cancels; the median over
every pair of every round is printed, and per round the median of its pairs (formats take turns in an
order that rotates each round).

    python benchmarks/prefill_formats.py                                   # Qwen3-30B-A3B shape, M 64/256/1024
    python benchmarks/prefill_formats.py --shape deepseek-v3 --tokens 256 --rounds 3
    python benchmarks/prefill_formats.py --isa avx2,avx512,avx512_bf16 --formats bf16,wna16_int4-g32
    python benchmarks/prefill_formats.py --formats wna16_int4-g32,wna16_int4-g32+int,wna16_int4-g32+int8

A 4-bit format (wna16_int4-*, mxfp4, nvfp4) with "+int" runs its prefill on the decode path's integer tiles
on 15-bit activation rows (lk_moe._C._set_int_acts_max_tokens around that format's forwards only: the A/B of
issue 29's integer route at bf16's accuracy), "+int8" (those and int8_channel) is the layer built with
LK_INT8_ACT=1 (int8 activations, in prefill too on the tiers where the engine takes them there).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lk_moe  # noqa: E402
from lk_moe.reference import random_routing  # noqa: E402
from benchmarks.moe_layer import (SHAPES, make_channel_tensors, make_fp8_tensors, make_mxfp4_tensors,  # noqa: E402
                                  make_mxfp8_tensors, make_nvfp4_tensors, make_wna16_tensors, make_weights)

FORMATS = ("bf16", "fp8_block", "fp8_channel", "int8_channel", "wna16_int4-g32", "wna16_int4-g128-asym",
           "mxfp4", "nvfp4", "mxfp8")


INT_VARIANTS = ("+int", "+int8")


def build_variant(name: str, E: int, H: int, I: int, pool):
    """A format, or a 4-bit one with an integer-activation variant (INT_VARIANTS)."""
    fmt, plus, variant = name.partition("+")
    if not plus:
        return build(fmt, E, H, I, pool)
    four_bit = fmt.startswith(("wna16_int4", "mxfp4", "nvfp4"))
    if "+" + variant not in INT_VARIANTS or not (four_bit or (variant == "int8" and fmt == "int8_channel")):
        raise SystemExit(f"{name!r}: {', '.join(INT_VARIANTS)} go with a 4-bit format (wna16_int4-*, mxfp4, nvfp4); "
                         "+int8 with int8_channel too")
    with patch.dict(os.environ, LK_INT8_ACT="1" if variant == "int8" else "0"):  # read when the layer is built
        return build(fmt, E, H, I, pool)


def build(fmt: str, E: int, H: int, I: int, pool):
    if fmt == "bf16":
        w13, w2 = make_weights(E, H, I)
        return lk_moe.MoELayer(w13, w2, pool=pool)
    if fmt == "fp8_block":
        return lk_moe.MoELayer.from_checkpoint(fmt, make_fp8_tensors(E, H, I), pool=pool)
    if fmt in ("fp8_channel", "int8_channel"):
        return lk_moe.MoELayer.from_checkpoint(fmt, make_channel_tensors(fmt, E, H, I), pool=pool)
    if fmt.startswith("wna16_int4-g"):
        gs = int(fmt.split("-g")[1].split("-")[0])
        return lk_moe.MoELayer.from_checkpoint("wna16_int4", make_wna16_tensors(E, H, I, gs, fmt.endswith("asym")),
                                               pool=pool)
    if fmt == "mxfp4":
        return lk_moe.MoELayer.from_checkpoint(fmt, make_mxfp4_tensors(E, H, I), pool=pool, activation="swigluoai")
    if fmt == "nvfp4":
        return lk_moe.MoELayer.from_checkpoint(fmt, make_nvfp4_tensors(E, H, I), pool=pool)
    if fmt == "mxfp8":
        return lk_moe.MoELayer.from_checkpoint(fmt, make_mxfp8_tensors(E, H, I), pool=pool)
    raise SystemExit(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def timed_forward(layer, x, ids, w, out, integer: bool = False) -> float:
    """One forward's seconds; integer: on the integer-activation tiles whatever the chunk's size."""
    if not integer:
        t = time.perf_counter()
        layer.forward_into(out, x, ids, w)
        return time.perf_counter() - t
    default = lk_moe._C._int_acts_max_tokens()
    lk_moe._C._set_int_acts_max_tokens(1 << 20)
    try:
        return timed_forward(layer, x, ids, w, out)
    finally:
        lk_moe._C._set_int_acts_max_tokens(default)


def compute_probe(pool, reps: int = 7) -> float:
    """TFLOP/s of the bf16 tile on hot weights: one small expert (H x I = 512 x 256 and 1024 x 512, 0.75 and
    3 MiB of bf16 weights) with 4096 rows routed to it; the better of the two, best of `reps` forwards."""
    best = 0.0
    for H, I in ((512, 256), (1024, 512)):
        w13, w2 = make_weights(1, H, I)
        layer = lk_moe.MoELayer(w13, w2, pool=pool)
        M = 4096
        x = torch.randn(M, H).bfloat16()
        ids = torch.zeros(M, 1, dtype=torch.int32)
        w = torch.ones(M, 1)
        out = torch.empty(M, H, dtype=torch.bfloat16)
        timed_forward(layer, x, ids, w, out)
        t = min(timed_forward(layer, x, ids, w, out) for _ in range(reps))
        best = max(best, 2 * M * 3 * H * I / t / 1e12)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    p.add_argument("--experts", type=int, default=16, help="experts loaded (routing spreads over them)")
    p.add_argument("--tokens", default="64,256,1024")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--isa", default="", help="comma list of ISA tiers (default: the best this CPU has)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default: every core)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="timed forwards per format, M and round (each between two bf16 ones)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    H, I, _, K = SHAPES[args.shape]
    E = max(K, args.experts)
    formats = args.formats.split(",")
    if "bf16" not in formats:
        formats.insert(0, "bf16")
    if len(formats) < 2:
        p.error("--formats: name at least one format besides bf16 (the reference every ratio is taken to)")
    tiers = args.isa.split(",") if args.isa else [lk_moe.isa()]
    for t in tiers:
        if t not in lk_moe.supported_isas():
            p.error(f"--isa: {t!r} is not a tier of this CPU ({', '.join(lk_moe.supported_isas())})")
    pool = lk_moe.make_pool(threads=args.threads)
    print(f"# {lk_moe._C.cpu_brand()}  threads {pool.num_threads}  shape {args.shape} H={H} I={I} E={E} K={K}  "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    layers = {f: build_variant(f, E, H, I, pool) for f in formats}
    results = []
    best_isa = lk_moe.isa()
    try:
        for tier in tiers:
            lk_moe.set_isa(tier)
            peak = compute_probe(pool)
            print(f"\n## tier {tier}: compute probe (bf16 tile, hot small experts) {peak:.3f} TFLOP/s")
            print(f"{'M':>5} {'format':<22} {'ms':>9} {'vs bf16':>8} {'rounds':<20} {'TFLOP/s':>8} {'/peak':>6}")
            for M in [int(m) for m in args.tokens.split(",")]:
                g = torch.Generator().manual_seed(M)
                x = torch.randn(M, H, generator=g).bfloat16()
                torch.manual_seed(M)
                ids, w = random_routing(M, E, K)
                out = torch.empty(M, H, dtype=torch.bfloat16)
                for f, layer in layers.items():
                    timed_forward(layer, x, ids, w, out, f.endswith("+int"))  # warm-up
                others = [f for f in formats if f != "bf16"]
                times = {f: [] for f in formats}
                pairs = {f: [[] for _ in range(args.rounds)] for f in others}  # per round: f / mean(bf16 around it)
                for r in range(args.rounds):
                    for f in others[r % len(others):] + others[:r % len(others)]:  # turns rotate
                        before = timed_forward(layers["bf16"], x, ids, w, out)
                        for _ in range(args.reps):
                            t = timed_forward(layers[f], x, ids, w, out, f.endswith("+int"))
                            after = timed_forward(layers["bf16"], x, ids, w, out)
                            times[f].append(t)
                            times["bf16"].append(after)
                            pairs[f][r].append(2 * t / (before + after))
                            before = after
                flop = 2 * M * K * 3 * H * I
                for f in formats:
                    rounds = [statistics.median(p) for p in pairs[f]] if f in pairs else [1.0] * args.rounds
                    ratio = statistics.median([v for p in pairs[f] for v in p]) if f in pairs else 1.0
                    ms = statistics.median(times[f]) * 1e3
                    tf = flop / (ms * 1e-3) / 1e12
                    print(f"{M:>5} {f:<22} {ms:>9.2f} {ratio:>8.2f} {' '.join(f'{v:.2f}' for v in rounds):<20} "
                          f"{tf:>8.3f} {tf / peak:>6.2f}", flush=True)
                    results.append(dict(tier=tier, M=M, format=f, ms=ms, vs_bf16=ratio, round_ratios=rounds,
                                        tflops=tf, peak_tflops=peak, shape=args.shape, threads=pool.num_threads))
    finally:
        lk_moe.set_isa(best_isa)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(cpu=lk_moe._C.cpu_brand(), results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
