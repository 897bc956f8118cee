"""Checksums of MoE layer forward outputs over a fixed case set, per ISA tier: the evidence that a
refactor or a fix left every output bit-identical. Run it on two builds and compare:

    python tools/forward_checksums.py --out /tmp/before.json            # on the old build
    python tools/forward_checksums.py --compare /tmp/before.json        # on the new build: exit 1 on a change

Cases: every expert format (wna16_int4 symmetric and with zero points, group 32 and 128; mxfp4 with
swigluoai + biases and with silu), x in bf16 and fp16, M across the decode/prefill boundary, the
integer-activation decode paths on and off (LK_INT8_ACT and the fp4 q15/bf16 hook), on every tier
this CPU has. Weights and inputs are seeded, so a checksum depends on the build only.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lk_moe  # noqa: E402
from lk_moe import _C  # noqa: E402
from lk_moe.reference import random_routing  # noqa: E402
from benchmarks.moe_layer import (make_channel_tensors, make_fp8_tensors, make_mxfp4_tensors,  # noqa: E402
                                  make_nvfp4_tensors, make_wna16_tensors)

E, H, I, K = 8, 512, 256, 4
MS = (1, 3, 16, 17, 64, 257)


def _bf16():
    g = torch.Generator().manual_seed(7)
    return dict(w13_weight=(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16(),
                w2_weight=(torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16())


# case name -> (format, tensors(), from_checkpoint options)
CASES = {
    "bf16": ("bf16", _bf16, {}),
    "fp8_block": ("fp8_block", lambda: make_fp8_tensors(E, H, I), {}),
    "fp8_channel": ("fp8_channel", lambda: make_channel_tensors("fp8_channel", E, H, I), {}),
    "int8_channel": ("int8_channel", lambda: make_channel_tensors("int8_channel", E, H, I), {}),
    "wna16_int4-g128-sym": ("wna16_int4", lambda: make_wna16_tensors(E, H, I, 128, False), {}),
    "wna16_int4-g32-asym": ("wna16_int4", lambda: make_wna16_tensors(E, H, I, 32, True), {}),
    "mxfp4-swigluoai": ("mxfp4", lambda: make_mxfp4_tensors(E, H, I), {"activation": "swigluoai"}),
    "mxfp4-silu": ("mxfp4", lambda: {k: v for k, v in make_mxfp4_tensors(E, H, I).items() if "bias" not in k},
                   {"activation": "silu"}),
    "nvfp4": ("nvfp4", lambda: make_nvfp4_tensors(E, H, I), {}),
}
FOUR_BIT = ("wna16_int4", "mxfp4", "nvfp4")


@contextlib.contextmanager
def int8_act(on: bool):
    before = os.environ.get("LK_INT8_ACT")
    os.environ["LK_INT8_ACT"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LK_INT8_ACT", None)
        else:
            os.environ["LK_INT8_ACT"] = before


def variants(fmt):
    """(name, int8 activations, fp4 decode activations or None) of a format's decode paths."""
    out = [("default", False, None)]
    if fmt in FOUR_BIT:
        out.append(("int8act", True, None))
    if fmt in ("mxfp4", "nvfp4"):
        out.append(("fp4-bf16", False, "bf16"))
    return out


def checksums() -> dict:
    inputs = {}
    for M in MS:
        g = torch.Generator().manual_seed(1000 + M)
        x = torch.randn(M, H, generator=g)
        torch.manual_seed(2000 + M)
        inputs[M] = (x, *random_routing(M, E, K))
    result = {}
    best = lk_moe.isa()
    try:
        for tier in lk_moe.supported_isas():
            lk_moe.set_isa(tier)
            for case, (fmt, make, opts) in CASES.items():
                tensors = make()
                for vname, i8, fp4_acts in variants(fmt):
                    with int8_act(i8):
                        layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors, **opts)
                    if fp4_acts:
                        _C._set_fp4_decode_acts(fp4_acts)
                    try:
                        for M, (x, ids, w) in inputs.items():
                            for dt in (torch.bfloat16, torch.float16):
                                out = layer.forward(x.to(dt), ids, w)
                                key = f"{tier} {case} {vname} M={M} {str(dt).split('.')[-1]}"
                                result[key] = hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
                    finally:
                        if fp4_acts:
                            _C._set_fp4_decode_acts("q15")
    finally:
        lk_moe.set_isa(best)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the checksums to this JSON file")
    p.add_argument("--compare", help="compare with a JSON file written by --out; exit 1 on any difference")
    args = p.parse_args(argv)
    sums = checksums()
    print(f"{len(sums)} forward outputs on tiers {', '.join(lk_moe.supported_isas())} ({_C.cpu_brand()})")
    if args.out:
        Path(args.out).write_text(json.dumps(sums, indent=1, sort_keys=True))
        print(f"written to {args.out}")
    if args.compare:
        old = json.loads(Path(args.compare).read_text())
        common = sorted(set(old) & set(sums))
        changed = [k for k in common if old[k] != sums[k]]
        for k in changed:
            print(f"CHANGED {k}: {old[k]} -> {sums[k]}")
        only = len(set(old) ^ set(sums))
        print(f"compared {len(common)} outputs: {len(changed)} changed, {only} present on one side only")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
