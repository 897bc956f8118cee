"""CPU engine demo: one MoE layer of a real model's shape, checked against torch and timed.

    python -m lk_moe.demo [--experts 128] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import lk_moe
from lk_moe.reference import moe_reference, moe_torch_baseline, random_routing


def gpu_status() -> str:
    try:
        if torch.cuda.is_available():
            return f"NVIDIA GPU found: {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - a broken driver counts as no GPU here
        pass
    return ""


def main(argv=None, why_not_serving: str = "") -> int:
    """why_not_serving: the reason the serving demo did not run (lvllm.cli.demo_serve), if it was asked."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=128, help="experts in the layer (Qwen3-30B-A3B: 128)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default: LK_THREADS or all cores)")
    args = p.parse_args(argv)

    why = why_not_serving or ("" if gpu_status() else "No NVIDIA GPU found")
    if why:
        print(f"{why}: serving a model (`vllm serve`) needs an NVIDIA GPU and the pinned vLLM.\n"
              "Running the CPU engine demo instead: the routed experts of one MoE layer on lk_moe.")

    H, I, E, K = 2048, 768, args.experts, 8
    print(f"\nLayer: Qwen3-30B-A3B shape, H={H} I={I} E={E} top-{K}, bf16 "
          f"({E * 3 * H * I * 2 / 2**30:.2f} GiB of experts)")
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16()
    pool = lk_moe.make_pool(threads=args.threads) if args.threads else lk_moe.default_pool()
    t0 = time.perf_counter()
    layer = lk_moe.MoELayer(w13, w2, pool=pool)
    print(f"Engine: ISA tier {lk_moe.isa()}, {pool.num_threads} threads on {pool.num_nodes} NUMA node(s), "
          f"packed in {time.perf_counter() - t0:.2f} s, {layer.nbytes / 2**30:.2f} GiB held "
          f"({layer.nbytes / layer.expert_bytes:.3f}x the expert bytes)")
    torch.set_num_threads(pool.num_threads)
    read_bw = statistics.median(pool.measure_read_bandwidth(1 << 30, 5))

    ok = True
    print(f"\n{'tokens':>6} {'max err/rms':>12} {'engine ms':>10} {'torch ms':>9} {'speedup':>8} {'weights GB/s':>13}")
    for M in (1, 16, 256):
        x = torch.randn(M, H, generator=g).bfloat16()
        ids, w = random_routing(M, E, K, generator=g)
        out = layer.forward(x, ids, w)
        ref = moe_reference(x, w13, w2, ids, w)
        err = ((out.float() - ref).abs().max() / ref.pow(2).mean().sqrt()).item()
        ok &= err < 2 ** -5
        times = []
        for _ in range(7):
            ids, w = random_routing(M, E, K, generator=g)
            t = time.perf_counter()
            layer.forward_into(out, x, ids, w)
            times.append(time.perf_counter() - t)
        eng = statistics.median(times)
        moe_torch_baseline(x, w13, w2, ids, w)  # warm-up
        base_times = []
        for _ in range(3):
            t = time.perf_counter()
            moe_torch_baseline(x, w13, w2, ids, w)
            base_times.append(time.perf_counter() - t)
        base = statistics.median(base_times)
        gbs = len(torch.unique(ids)) * 3 * H * I * 2 / eng / 1e9
        print(f"{M:>6} {err:>12.4f} {eng * 1e3:>10.2f} {base * 1e3:>9.2f} {base / eng:>8.2f} {gbs:>13.1f}")
    print(f"\nHost read bandwidth with the same threads: {read_bw:.1f} GB/s (decode is bound by it).")
    print("Result check against the fp32 torch reference:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
