"""Streamed GPU prefill over a stack of layers (not a test; needs a GPU).

Prints, from the same run: the pinned host->GPU copy bandwidth (torch copy of 1 GiB), and for
each M the stack's time, tokens/s, the achieved H2D GB/s of the expert streaming and its ratio
to the pinned bandwidth (target >= 0.8 over 8+ layers), and the staging ring's size.

    python benchmarks/gpu_prefill.py [--layers 8] [--tokens 2048,8192,16384]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lk_moe  # noqa: E402,F401
from lk_moe.hybrid import ExpertStreamer, HybridMoE  # noqa: E402
from lk_moe.reference import random_routing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_layer import SHAPES, make_weights  # noqa: E402


def pinned_h2d_gbs(nbytes=1 << 30, reps=5):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        out.append(nbytes / (a.elapsed_time(b) * 1e-3) / 1e9)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", default="2048,8192,16384")
    p.add_argument("--slot-mib", type=int, default=256)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("No NVIDIA GPU: this benchmark measures host->GPU expert streaming and needs one.")
        return
    H, I, E, K = SHAPES[args.shape]
    w13, w2 = make_weights(E, H, I)
    expert_bytes = 3 * H * I * 2
    per_slot = max(1, (args.slot_mib << 20) // expert_bytes)
    ring = ExpertStreamer(per_slot * expert_bytes, args.slots)
    layers = [HybridMoE(w13, w2, max_tokens=16, top_k=K, gpu_min_batch=1024, streamer=ring)
              for _ in range(args.layers)]
    for a, b in zip(layers, layers[1:]):
        a.link_next(b)
    del w13, w2
    layer_bytes = E * expert_bytes
    bw = pinned_h2d_gbs()
    print(f"# {args.shape}: H={H} I={I} E={E} K={K}; {args.layers} layers x {layer_bytes / 2**30:.2f} GiB; "
          f"staging ring {len(ring.slots)} x {ring.slot_bytes / 2**20:.0f} MiB = {ring.nbytes / 2**30:.2f} GiB "
          f"({ring.nbytes / layer_bytes:.2f} layers); gpu {torch.cuda.get_device_name(0)}")
    print(f"pinned H2D bandwidth (1 GiB torch copy, median of 5): {bw:.1f} GB/s")
    print(f"{'M':>6} {'stack ms':>9} {'tokens/s':>10} {'H2D GB/s':>9} {'/pinned':>8}")
    for M in [int(m) for m in args.tokens.split(",")]:
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(M, E, K)
        ids, w = ids.cuda(), w.cuda()
        layers[0](x, ids, w)  # warm-up (allocator, cuBLAS)
        torch.cuda.synchronize()
        times, rates = [], []
        for _ in range(args.reps):
            before = ring.bytes_copied
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for layer in layers:
                layer(x, ids, w)
            b.record()
            b.synchronize()
            dt = a.elapsed_time(b) * 1e-3
            times.append(dt)
            rates.append((ring.bytes_copied - before) / dt / 1e9)
        dt, rate = statistics.median(times), statistics.median(rates)
        print(f"{M:>6} {dt * 1e3:>9.1f} {M / dt:>10.0f} {rate:>9.1f} {rate / bw:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
