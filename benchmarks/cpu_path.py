"""Decode latency of the CPU expert path seen from the GPU (not a test; needs a GPU).

A stack of L layer calls (like one decode step) runs eagerly and as one captured CUDA graph, with
fresh routing every step. Per layer it prints:
  total      GPU-side time per layer (CUDA events around the L calls, / L)
  compute    the engine's own compute (first worker in to last worker out, measured inside the pool)
  host node  time inside the host-function node (id check + pool dispatch + compute + completion;
             for mailbox/kernel: the same run inside the poller thread)
  copies     the same D2H/H2D copies without the host node (a graph of copies only; the kernel
             signal does not issue them: its copies are inside its one kernel)
  overhead   total - compute: everything that is not the engine's compute (target <= 40 us at M=1,
             graph-captured)

    python benchmarks/cpu_path.py [--shapes qwen3-30b-a3b,deepseek-v3] [--tokens 1,4,16] [--layers 8]
        [--signals hostfn,mailbox,kernel] [--kernel-copy-max-bytes 262144]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lk_moe  # noqa: E402
from lk_moe.cpu_path import CpuExpertPath  # noqa: E402
from lk_moe.reference import random_routing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_layer import SHAPES, make_weights, mem_available  # noqa: E402


def gpu_time_us(fn, reps):
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def run_case(layers, copies, E, K, H, L, M, signal, args):
    paths = [CpuExpertPath(layers[i % copies], max_tokens=max(16, M), top_k=K, signal=signal,
                           kernel_copy_max_bytes=args.kernel_copy_max_bytes)
             for i in range(L)]
    xs = [torch.randn(M, H, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
    ids = [torch.zeros(M, K, device="cuda", dtype=torch.int32) for _ in range(L)]
    ws = [torch.zeros(M, K, device="cuda", dtype=torch.float32) for _ in range(L)]

    def new_routing():
        for i in range(L):
            r, w = random_routing(M, E, K)
            ids[i].copy_(r, non_blocking=True)
            ws[i].copy_(w, non_blocking=True)
        torch.cuda.synchronize()

    def step():
        for i in range(L):
            paths[i](xs[i], ids[i], ws[i])

    def copies_only():
        for i in range(L):
            p = paths[i]
            p._x[:M].copy_(xs[i], non_blocking=True)
            p._ids[:M].copy_(ids[i], non_blocking=True)
            p._w[:M].copy_(ws[i], non_blocking=True)
            xs[i].copy_(p._out[:M], non_blocking=True)

    new_routing()
    step()
    torch.cuda.synchronize()
    graph, cgraph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    with torch.cuda.graph(cgraph):
        copies_only()
    for mode, fn in (("eager", step), ("graph", graph.replay)):
        totals, computes, hosts = [], [], []
        for _ in range(args.reps):
            new_routing()
            totals.append(gpu_time_us(fn, 1)[0] / L)
            computes.append(statistics.mean(p.layer.last_compute_us for p in paths))
            hosts.append(statistics.mean(p._calls[M].last_host_us for p in paths))
        cp = statistics.median(gpu_time_us(cgraph.replay, args.reps)) / L
        tot, comp, host = (statistics.median(v) for v in (totals, computes, hosts))
        print(f"{M:>4} {signal + ' ' + mode:>14} {tot:>9.1f} {comp:>8.1f} {host:>9.1f} {cp:>7.1f} {tot - comp:>9.1f}", flush=True)
    for p in paths:
        p.check_errors()


def bench(name, args):
    H, I, E, K = SHAPES[name]
    expert_bytes = 3 * H * I * 2
    budget = int(mem_available() * 0.6)
    E = max(K, min(E, budget // (3 * expert_bytes)))
    copies = max(1, min(4, budget // (E * expert_bytes) - 1))
    w13, w2 = make_weights(E, H, I)
    pool = lk_moe.default_pool()
    layers = [lk_moe.MoELayer(w13, w2, pool=pool) for _ in range(copies)]
    del w13, w2
    L = args.layers
    print(f"\n## {name}: H={H} I={I} E={E} K={K}; {L} layer calls per step over {copies} packed "
          f"cop{'y' if copies == 1 else 'ies'}; {pool.num_threads} threads, isa {lk_moe.isa()}")
    print(f"{'M':>4} {'signal mode':>14} {'total us':>9} {'compute':>8} {'host node':>9} {'copies':>7} {'overhead':>9}")
    for M in [int(m) for m in args.tokens.split(",")]:
        for signal in args.signals.split(","):
            run_case(layers, copies, E, K, H, L, M, signal, args)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v3")
    p.add_argument("--tokens", default="1,4,16")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--signals", default="hostfn,mailbox,kernel",
                   help="comma-separated: hostfn, mailbox, kernel (LK_CPU_SIGNAL values)")
    p.add_argument("--kernel-copy-max-bytes", type=int, default=256 << 10,
                   help="kernel signal: inputs above this many bytes move with DMA copies around the kernel")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("No NVIDIA GPU: this benchmark measures the GPU<->CPU path and needs one.")
        return
    print(f"# lk_moe {lk_moe.__version__}  cpu: {lk_moe._C.cpu_brand()}  gpu: {torch.cuda.get_device_name(0)}  "
          f"torch {torch.__version__}  LK_SPIN_US={lk_moe.default_pool().spin_us}")
    for name in args.shapes.split(","):
        bench(name, args)


if __name__ == "__main__":
    main()
