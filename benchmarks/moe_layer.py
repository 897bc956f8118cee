"""Benchmark of one MoE layer on the CPU engine (not a test).

For every case it prints, from the same run:
  - the engine's median time, and the share of it spent inside the worker pool (the rest is
    the call, the job hand-off and the wake-up: what a faster kernel cannot win back),
  - effective weight bandwidth: bytes of the distinct experts the routing touched / time,
  - the machine's read bandwidth measured with the same threads (the physical limit of decode),
    and the ratio of the two (the probe runs again after the cases, to show drift),
  - the median time of a plain torch implementation of the same layer (bf16 GEMMs per expert,
    the same threads) and the speed-up over it,
  - achieved TFLOP/s (2 * routed slots * 3 * H * I per forward).

Decode runs rotate over several packed copies of the layer (like the layers of a model), so
experts cached from the previous forward do not inflate the bandwidth.

    python benchmarks/moe_layer.py                     # Qwen3-30B-A3B + DeepSeek-V3 shapes
    python benchmarks/moe_layer.py --shapes qwen3-30b-a3b --tokens 1 --threads all
    python benchmarks/moe_layer.py --format mxfp4 --shapes gpt-oss-120b   # mxfp4 + swigluoai + biases
    python benchmarks/moe_layer.py --format nvfp4                        # ModelOpt NVFP4 (Qwen3-30B-A3B-FP4 shape)
    python benchmarks/moe_layer.py --format int8_channel                 # compressed-tensors W8A8/W8A16 int8
    python benchmarks/moe_layer.py --format nvfp4 --tokens 1,4 --decode-schedule units \
        --decode-units int8_act:4,quantized:4                                                        # A/B
    python benchmarks/moe_layer.py --format fp8_block --tokens 1,4 --decode-prefetch 0,8192           # A/B
    python benchmarks/moe_layer.py --format mxfp4 --tokens 1,4 --decode-schedule units,guided        # A/B
    python benchmarks/moe_layer.py --format nvfp4 --tokens 1,4 --fp4-acts q15,bf16                   # A/B
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lk_moe  # noqa: E402
from lvllm.hugepages import huge_page_text  # noqa: E402
from lvllm.threads import plan_threads  # noqa: E402
from lk_moe.reference import (moe_torch_baseline, moe_torch_baseline_channel, moe_torch_baseline_fp8,  # noqa: E402
                               moe_torch_baseline_mxfp4, moe_torch_baseline_mxfp8, moe_torch_baseline_nvfp4,
                               moe_torch_baseline_wna16,
                               random_routing)

PHASE_KEYS = ("gate_up", "down", "gate_up_spread", "down_spread")  # MoELayer.last_phase_us

SHAPES = {
    # name: (H, I, E, K)
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
    "gpt-oss-120b": (2880, 2880, 128, 4),
    "deepseek-v4-flash": (4096, 2048, 256, 6),
    "qwen3-next-80b-a3b": (2048, 512, 512, 10),  # small experts: overheads, not bandwidth, decide
    "minimax-m2": (3072, 1536, 256, 8),
    "kimi-k3": (3584, 3072, 896, 16),  # its routed experts on the 3584-wide latent (the activation aside: SituGLU)
}


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def make_weights(E, H, I, seed=0):
    """Random experts (one random expert copied with a per-expert sign flip: fast to build, and
    the data does not change the speed)."""
    g = torch.Generator().manual_seed(seed)
    b13 = (torch.randn(2 * I, H, generator=g) / H ** 0.5).bfloat16()
    b2 = (torch.randn(H, I, generator=g) / I ** 0.5).bfloat16()
    w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16)
    w2 = torch.empty(E, H, I, dtype=torch.bfloat16)
    for e in range(E):
        w13[e].copy_(b13 if e % 2 == 0 else -b13)
        w2[e].copy_(b2)
    return w13, w2


def random_fp8_codes(r, c, g):
    """[r, c] random finite float8_e4m3fn codes as uint8 bytes (magnitude bytes below 0x7E, any sign)."""
    return torch.randint(0, 0x7E, (r, c), generator=g, dtype=torch.uint8) | (
        torch.randint(0, 2, (r, c), generator=g, dtype=torch.uint8) << 7)


def make_fp8_tensors(E, H, I, seed=0, block=128):
    """fp8_block tensors as vLLM's Fp8MoEMethod holds them: random finite e4m3 codes (one random
    expert copied, fast to build) and positive block scales."""
    g = torch.Generator().manual_seed(seed)
    c13, c2 = random_fp8_codes(2 * I, H, g), random_fp8_codes(H, I, g)
    q13 = torch.empty(E, 2 * I, H, dtype=torch.uint8)
    q2 = torch.empty(E, H, I, dtype=torch.uint8)
    for e in range(E):
        q13[e].copy_(c13)
        q2[e].copy_(c2)
    s13 = torch.rand(E, 2 * I // block, H // block, generator=g) * 1e-3 + 1e-4
    s2 = torch.rand(E, H // block, I // block, generator=g) * 1e-3 + 1e-4
    return dict(w13_weight=q13.view(torch.float8_e4m3fn), w2_weight=q2.view(torch.float8_e4m3fn),
                w13_weight_scale_inv=s13, w2_weight_scale_inv=s2)


def make_mxfp8_tensors(E, H, I, seed=0):
    """mxfp8 tensors as vLLM's ModelOptMxFp8FusedMoE creates them: random finite e4m3 codes (one random expert copied,
    fast to build) and e8m0 scales of released checkpoints' range (lvllm.dummy_weights)."""
    from lvllm.dummy_weights import E8M0_HIGH, E8M0_LOW
    g = torch.Generator().manual_seed(seed)
    c13, c2 = random_fp8_codes(2 * I, H, g), random_fp8_codes(H, I, g)
    def scales(r, c):
        return torch.randint(E8M0_LOW, E8M0_HIGH + 1, (r, c // 32), generator=g, dtype=torch.uint8)
    return dict(w13_weight=c13.expand(E, -1, -1).contiguous().view(torch.float8_e4m3fn),
                w2_weight=c2.expand(E, -1, -1).contiguous().view(torch.float8_e4m3fn),
                w13_weight_scale=scales(2 * I, H).expand(E, -1, -1).contiguous(),
                w2_weight_scale=scales(H, I).expand(E, -1, -1).contiguous())


def make_channel_tensors(fmt, E, H, I, seed=0):
    """fp8_channel / int8_channel tensors as vLLM's compressed-tensors W8A8 MoE methods hold them:
    random finite codes (one random expert copied, fast to build), fp32 scales [E, R, 1]."""
    g = torch.Generator().manual_seed(seed)
    def codes(r, c):
        if fmt == "int8_channel":
            return torch.randint(-127, 128, (r, c), generator=g, dtype=torch.int8)
        return random_fp8_codes(r, c, g).view(torch.float8_e4m3fn)
    c13, c2 = codes(2 * I, H), codes(H, I)
    return dict(w13_weight=c13.expand(E, -1, -1).contiguous(), w2_weight=c2.expand(E, -1, -1).contiguous(),
                w13_weight_scale=torch.rand(E, 2 * I, 1, generator=g) * 1e-3 + 1e-4,
                w2_weight_scale=torch.rand(E, H, 1, generator=g) * 1e-3 + 1e-4)


def make_wna16_tensors(E, H, I, gs=128, asym=False, seed=0):
    """wna16_int4 tensors as vLLM's CompressedTensorsWNA16*MoEMethod holds them after loading (K-first):
    random int4 codes (one random expert copied, fast to build), positive bf16 group scales."""
    g = torch.Generator().manual_seed(seed)
    def words(*shape):
        return torch.randint(-2 ** 31, 2 ** 31 - 1, shape, generator=g, dtype=torch.int32)
    p13, p2 = words(H // 8, 2 * I), words(I // 8, H)
    t = dict(w13_weight_packed=p13.expand(E, -1, -1).contiguous(), w2_weight_packed=p2.expand(E, -1, -1).contiguous(),
             w13_weight_scale=(torch.rand(E, H // gs, 2 * I, generator=g) * 1e-2 + 1e-3).bfloat16(),
             w2_weight_scale=(torch.rand(E, I // gs, H, generator=g) * 1e-2 + 1e-3).bfloat16())
    if asym:
        t.update(w13_weight_zero_point=words(E, H // gs, 2 * I // 8), w2_weight_zero_point=words(E, I // gs, H // 8))
    return t


def make_mxfp4_tensors(E, H, I, seed=0):
    """mxfp4 tensors as vLLM's GptOssMxfp4MoEMethod holds them after loading (interleaved gate/up rows,
    bf16 biases): random e2m1 codes (one random expert copied, fast to build), e8m0 scales near 2^-6."""
    g = torch.Generator().manual_seed(seed)
    def codes(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    c13, c2 = codes(2 * I, H // 2), codes(H, I // 2)
    return dict(w13_weight=c13.expand(E, -1, -1).contiguous(), w2_weight=c2.expand(E, -1, -1).contiguous(),
                w13_weight_scale=torch.randint(119, 123, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8),
                w2_weight_scale=torch.randint(119, 123, (E, H, I // 32), generator=g, dtype=torch.uint8),
                w13_bias=(torch.randn(E, 2 * I, generator=g) * 0.1).bfloat16(),
                w2_bias=(torch.randn(E, H, generator=g) * 0.1).bfloat16())


def make_nvfp4_tensors(E, H, I, seed=0):
    """nvfp4 tensors as vLLM's ModelOptNvFp4FusedMoE holds them after loading: random e2m1 codes (one
    random expert copied, fast to build), positive fp8 block scales, per-expert gate/up/down global
    scales and activation scales (ignored by the engine)."""
    g = torch.Generator().manual_seed(seed)
    def codes(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    def scales(*shape):
        return (torch.rand(*shape, generator=g) * 2 + 0.5).to(torch.float8_e4m3fn)
    c13, c2 = codes(2 * I, H // 2), codes(H, I // 2)
    return dict(w13_weight=c13.expand(E, -1, -1).contiguous(), w2_weight=c2.expand(E, -1, -1).contiguous(),
                w13_weight_scale=scales(E, 2 * I, H // 16), w2_weight_scale=scales(E, H, I // 16),
                w13_weight_scale_2=torch.rand(E, 2, generator=g) * 1e-2 + 1e-3,
                w2_weight_scale_2=torch.rand(E, generator=g) * 1e-2 + 1e-3,
                w13_input_scale=torch.rand(E, 2, generator=g) * 1e-2, w2_input_scale=torch.rand(E, generator=g) * 1e-2)


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_shape(name, args, results):
    H, I, E, K = SHAPES[name]
    fp8 = args.format == "fp8_block"
    channel = args.format in ("fp8_channel", "int8_channel")
    int4 = args.format == "wna16_int4"
    fp4 = args.format == "mxfp4"
    nv = args.format == "nvfp4"
    mx8 = args.format == "mxfp8"
    gs = args.group_size
    if fp4:  # quantized bytes read per expert: codes + e8m0 scales + bf16 biases
        expert_bytes = 3 * H * I // 2 + 3 * H * I // 32 + (2 * I + H) * 2
    elif nv:  # quantized bytes read per expert: codes + fp8 scales per 16 (+ 3 fp32 global scales)
        expert_bytes = 3 * H * I // 2 + 3 * H * I // 16 + 12
    elif int4:  # quantized bytes read per expert: codes + bf16 scales (+ 4-bit zero points)
        expert_bytes = 3 * H * I // 2 + 3 * H * I // gs * 2 + (3 * H * I // gs // 2 if args.asym else 0)
    elif mx8:  # codes + e8m0 scales per 32 inputs
        expert_bytes = 3 * H * I + 3 * H * I // 32
    else:
        expert_bytes = 3 * H * I * (1 if fp8 or channel else 2)
    if args.max_experts:
        E = min(E, args.max_experts)
    # Budget: source weights + packed copies + torch baseline temporaries within ~60% of free RAM.
    budget = int(mem_available() * 0.6)
    E = max(K, min(E, budget // (3 * expert_bytes)))
    layer_bytes = E * expert_bytes
    copies = max(1, min(args.max_copies, int(args.rotate_bytes // layer_bytes) + 1,
                        (budget - layer_bytes) // layer_bytes))
    fmt = f"{args.format} gs={gs}{' asym' if args.asym else ' sym'}" if int4 else args.format
    print(f"\n## {name} {fmt}: H={H} I={I} E={E} K={K}  ({layer_bytes / 2**30:.2f} GiB of experts, "
          f"{copies} packed cop{'y' if copies == 1 else 'ies'} for decode rotation)", flush=True)
    if nv:
        tensors = make_nvfp4_tensors(E, H, I)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint("nvfp4", tensors, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline_nvfp4(x, tensors, ids, w)  # noqa: E731
    elif fp4:
        tensors = make_mxfp4_tensors(E, H, I)
        if args.mxfp4_scale_byte >= 0:
            for n in ("w13_weight_scale", "w2_weight_scale"):
                tensors[n].fill_(args.mxfp4_scale_byte)
            print(f"   every e8m0 scale byte = {args.mxfp4_scale_byte} (2^{args.mxfp4_scale_byte - 127})", flush=True)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint("mxfp4", tensors, pool=pool,  # noqa: E731
                                                             activation="swigluoai")
        baseline = lambda x, ids, w: moe_torch_baseline_mxfp4(x, tensors, ids, w)  # noqa: E731
    elif int4:
        tensors = make_wna16_tensors(E, H, I, gs, args.asym)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint("wna16_int4", tensors, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline_wna16(x, tensors, ids, w)  # noqa: E731
    elif channel:
        tensors = make_channel_tensors(args.format, E, H, I)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint(args.format, tensors, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline_channel(x, tensors, ids, w)  # noqa: E731
    elif mx8:
        tensors = make_mxfp8_tensors(E, H, I)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint("mxfp8", tensors, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline_mxfp8(x, tensors, ids, w)  # noqa: E731
    elif fp8:
        tensors = make_fp8_tensors(E, H, I)
        build = lambda pool: lk_moe.MoELayer.from_checkpoint("fp8_block", tensors, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline_fp8(x, tensors, ids, w)  # noqa: E731
    else:
        w13, w2 = make_weights(E, H, I)
        build = lambda pool: lk_moe.MoELayer(w13, w2, pool=pool)  # noqa: E731
        baseline = lambda x, ids, w: moe_torch_baseline(x, w13, w2, ids, w)  # noqa: E731
    cores = lk_moe.make_pool(threads=0).num_threads
    # what `vllm serve` gives one rank's engine here by default (cores left to its busy threads)
    serve_threads = plan_threads(0, 1, None).threads
    default_units = lk_moe._C._decode_units()
    default_prefetch = lk_moe._C._decode_prefetch()
    default_schedule = lk_moe._C._decode_schedule()
    default_acts = lk_moe._C._fp4_decode_acts()
    units = [(w, int(n)) for w, n in (item.split(":") for item in args.decode_units.split(","))] \
        if args.decode_units else [None]
    prefetch = [int(b) for b in args.decode_prefetch.split(",")] if args.decode_prefetch else [None]
    schedules = args.decode_schedule.split(",") if args.decode_schedule else [None]
    acts = args.fp4_acts.split(",") if args.fp4_acts else [None]
    # every combination; `defaults` (all None): the engine's settings
    settings = [(u, b, sch, a) for u in units for b in prefetch for sch in schedules for a in acts]
    defaults = (None,) * len(settings[0])

    def apply(setting):
        u, b, sch, a = setting
        lk_moe._C._set_decode_units(*(u or default_units))
        lk_moe._C._set_decode_prefetch(default_prefetch if b is None else b)
        lk_moe._C._set_decode_schedule(sch or default_schedule)
        lk_moe._C._set_fp4_decode_acts(a or default_acts)

    def label(setting):
        u, b, sch, a = setting
        return "".join([f"  {u[0]}:{u[1]}" if u else "", f"  pf {b}" if b is not None else "",
                        f"  {sch}" if sch else "", f"  acts {a}" if a else ""])
    for threads_arg in args.threads.split(","):
        threads = {"all": cores, "serve": serve_threads}.get(threads_arg) or int(threads_arg)
        pool = lk_moe.make_pool(threads=threads)
        torch.set_num_threads(threads)
        hot = statistics.median(pool.round_trip_us(200, 0))
        parked = statistics.median(pool.round_trip_us(30, pool.spin_us + 2000))
        prewoken = statistics.median(pool.round_trip_us(30, pool.spin_us + 2000, 100))
        bw = pool.measure_read_bandwidth(args.read_bytes, 7)
        read_bw = statistics.median(bw)
        t0 = time.perf_counter()
        layers = [build(pool) for _ in range(copies)]
        repack_s = (time.perf_counter() - t0) / copies
        # whether the copies got 2 MiB pages (decode over tens of GiB of 4 KiB pages walks page tables)
        print(f"packed copies {copies * layer_bytes / 2**30:.2f} GiB: {huge_page_text(copies * layer_bytes)}", flush=True)
        which = " (serve default)" if threads_arg == "serve" else ""
        print(f"threads={threads}{which} isa={lk_moe.isa()} read bandwidth {read_bw:.1f} GB/s "
              f"(median of {len(bw)}; min {min(bw):.1f} max {max(bw):.1f}); repack "
              f"{layer_bytes / repack_s / 1e9:.1f} GB/s; nbytes/expert bytes "
              f"{layers[0].nbytes / layer_bytes:.4f}; empty-job round trip: {hot:.1f} us spinning, "
              f"{parked:.1f} us from parked, {prewoken:.1f} us from parked with wake() 100 us ahead",
              flush=True)
        print(f"{'M':>6} {'engine ms':>10} {'in pool':>8} {'eff GB/s':>9} {'/read':>6} {'torch ms':>9} "
              f"{'speedup':>8} {'TFLOP/s':>8}{'  decode setting' if len(settings) > 1 else ''}")
        for M in [int(m) for m in args.tokens.split(",")]:
            reps = args.reps if M <= 16 else max(3, args.reps // 4)
            g = torch.Generator().manual_seed(M)
            cases = []
            for _ in range(reps + 2):
                x = torch.randn(M, H, generator=g).bfloat16()
                ids, w = random_routing(M, E, K, generator=g)
                cases.append((x, ids, w, torch.empty(M, H, dtype=torch.bfloat16)))
            # The decode settings take turns on every case (same routing, same machine noise).
            runs = settings if M <= 16 else [defaults]
            rounds = args.rounds if M <= 16 else 1
            # per setting and round: median time, in-pool share, median GB/s, the round's read bandwidth,
            # median phase times
            per_round = {s: [] for s in runs}
            n = 0
            for _ in range(rounds):
                # several rounds: each against the mean of a probe just before and just after it
                before = read_bw if rounds == 1 else statistics.median(pool.measure_read_bandwidth(args.read_bytes, 3))
                times = {s: [] for s in runs}
                pool_us = {s: [] for s in runs}
                bws = {s: [] for s in runs}
                phases = {s: [] for s in runs}
                for i, (x, ids, w, out) in enumerate(cases):
                    for s in runs:
                        apply(s)
                        layer = layers[n % copies]
                        n += 1
                        t = time.perf_counter()
                        layer.forward_into(out, x, ids, w)
                        dt = time.perf_counter() - t
                        if i >= 2:  # warm-up
                            times[s].append(dt)
                            pool_us[s].append(layer.last_compute_us)
                            bws[s].append(len(torch.unique(ids)) * expert_bytes / dt / 1e9)
                            phases[s].append(layer.last_phase_us)
                after = read_bw if rounds == 1 else statistics.median(pool.measure_read_bandwidth(args.read_bytes, 3))
                for s in runs:
                    eng = statistics.median(times[s])
                    per_round[s].append((eng, statistics.median(pool_us[s]) * 1e-6 / eng, statistics.median(bws[s]),
                                         (before + after) / 2,
                                         {k: statistics.median(p[k] for p in phases[s]) for k in PHASE_KEYS}))
            apply(defaults)
            treps = max(2, min(reps, 5 if M <= 16 else 3))
            x, ids, w, _ = cases[-1]
            baseline(x, ids, w)  # warm-up
            base = statistics.median(timed(lambda: baseline(x, ids, w), treps))
            for s in runs:
                rs = per_round[s]
                eng = statistics.median(r[0] for r in rs)
                in_pool = statistics.median(r[1] for r in rs)
                eff = statistics.median(r[2] for r in rs)
                ratios = [r[2] / r[3] for r in rs]
                ratio = statistics.median(ratios)
                tflops = 2 * M * K * 3 * H * I / eng / 1e12
                rounds_note = f"  rounds {' '.join(f'{v:.2f}' for v in ratios)}" if rounds > 1 else ""
                phase = {k: statistics.median(r[4][k] for r in rs) for k in PHASE_KEYS}
                print(f"{M:>6} {eng * 1e3:>10.3f} {in_pool:>8.2f} {eff:>9.1f} {ratio:>6.2f} {base * 1e3:>9.3f} "
                      f"{base / eng:>8.2f} {tflops:>8.3f}{label(s)}{rounds_note}", flush=True)
                if M <= 16:  # where a decode forward's time goes (last chunk; prefill runs several)
                    print(f"{'':>6} phases, us: gate/up {phase['gate_up']:.1f} (last {phase['gate_up_spread']:.1f} "
                          f"after the first worker done), down {phase['down']:.1f} (last "
                          f"{phase['down_spread']:.1f} after the first); engine {eng * 1e6:.1f}", flush=True)
                results.append(dict(shape=name, format=args.format, H=H, I=I, E=E, K=K, threads=threads,
                                    isa=lk_moe.isa(), M=M, engine_ms=eng * 1e3, in_pool=in_pool, eff_gbs=eff,
                                    read_gbs=read_bw, bw_ratio=ratio, round_ratios=ratios, torch_ms=base * 1e3,
                                    speedup=base / eng, tflops=tflops, reps=reps, rounds=rounds,
                                    decode_units=list(s[0] or default_units),
                                    decode_prefetch=default_prefetch if s[1] is None else s[1],
                                    decode_schedule=s[2] or default_schedule,
                                    fp4_decode_acts=s[3] or default_acts, phase_us=phase))
        # The same probe once more: a shared machine's bandwidth drifts while the cases run, and the
        # ratios above are to the first probe only.
        after = statistics.median(pool.measure_read_bandwidth(args.read_bytes, 7))
        print(f"read bandwidth after the cases {after:.1f} GB/s ({after / read_bw:.2f} of the first probe)", flush=True)
        del layers, pool


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v3")
    p.add_argument("--tokens", default="1,4,16,256,1024")
    p.add_argument("--threads", default="all,1",
                   help="comma list of numbers, 'all' (every core) or 'serve' (the engine threads of a "
                        "TP=1 `vllm serve` here: all but the cores its busy threads keep)")
    p.add_argument("--reps", type=int, default=20, help="timed forwards per decode case (prefill: /4)")
    p.add_argument("--max-experts", type=int, default=0, help="cap E (default: as memory allows)")
    p.add_argument("--read-bytes", type=int, default=0, help="read-bandwidth probe size (default 2-4 GiB)")
    p.add_argument("--rotate-bytes", type=float, default=4 * 2**30,
                   help="decode rotates over packed copies until this many bytes (defeats the LLC)")
    p.add_argument("--max-copies", type=int, default=4)
    p.add_argument("--format", default="bf16", choices=["bf16", "fp8_block", "fp8_channel", "int8_channel",
                                                        "wna16_int4", "mxfp4", "nvfp4", "mxfp8"])
    p.add_argument("--group-size", type=int, default=128, help="wna16_int4: scale group size")
    p.add_argument("--asym", action="store_true", help="wna16_int4: asymmetric (zero points)")
    p.add_argument("--decode-units", default="",
                   help="A/B of decode work units (M <= 16): comma list of WIDE:UNITS_PER_THREAD, WIDE one of "
                        "int8_act, 4bit (the default, with 4), quantized, all; e.g. int8_act:4,4bit:4,quantized:4 "
                        "(they cut decode chunks under --decode-schedule units only)")
    p.add_argument("--decode-prefetch", default="",
                   help="A/B of the quantized decode tiles' far prefetch (M <= 16): comma list of bytes ahead "
                        "(0 = off; default 8192), e.g. 0,8192")
    p.add_argument("--decode-schedule", default="",
                   help="A/B of how decode chunks hand out work (M <= 16): comma list of units (fixed units, "
                        "see --decode-units) and guided (guided self-scheduling, the default); with the other "
                        "A/B options, every combination")
    p.add_argument("--fp4-acts", default="",
                   help="A/B of the 4-bit formats' decode chunks' activations (M <= 16): comma list of q15 (15-bit "
                        "integer rows, the default) and bf16 (the vdpbf16ps tile)")
    p.add_argument("--mxfp4-scale-byte", type=int, default=-1,
                   help="mxfp4: every e8m0 scale byte set to this (default: random 119-122, a released checkpoint's "
                        "range); 0 is the subnormal 2^-127 a zero-filled dummy load gave before 2026-12-04 (the "
                        "multiplies by it are microcode assists on Intel cores)")
    p.add_argument("--rounds", type=int, default=1,
                   help="decode cases (M <= 16) this many times, each round's ratio against the mean of a read "
                        "probe just before and just after it; prints the median and every round's ratio")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if not -1 <= args.mxfp4_scale_byte <= 254:
        p.error("--mxfp4-scale-byte: 0..254 (255 is NaN), or -1 for random normal scales")
    for item in args.threads.split(","):
        if item not in ("all", "serve") and not (item.isdigit() and int(item) > 0):
            p.error(f"--threads: '{item}' is not a positive number, 'all' or 'serve'")
    if not args.read_bytes:
        args.read_bytes = (4 << 30) if mem_available() > (48 << 30) else (2 << 30)
    print(f"# lk_moe {lk_moe.__version__}  cpu: {lk_moe._C.cpu_brand()}  isa: {lk_moe.isa()} "
          f"(supported: {', '.join(lk_moe.supported_isas())})  torch {torch.__version__}  "
          f"python {platform.python_version()}  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    results = []
    for name in args.shapes.split(","):
        bench_shape(name, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(cpu=lk_moe._C.cpu_brand(), results=results), indent=1))


if __name__ == "__main__":
    main()
