#!/usr/bin/env python3
"""The GPU expert cache through vLLM 0.33.0: decode tok/s against the cache's budget, per routing trace.

Random (dummy) weights route uniformly, so the router's expert ids are replaced inside the MoE op by
synthetic traces with controlled temporal locality (lk_moe.routing_trace: uniform; a per-layer LRU
cache of half the experts hitting ~50 / 67 / 80%; the 67% one with its hot set moved halfway), through
LVLLM_BENCH_ROUTING_REPLAY=1, which only this benchmark sets.

Two vLLM processes (LLM(), dummy weights, default CUDA-graph settings, --max-num-seqs 4 is NOT set:
vLLM's defaults), each driven over vLLM's collective_rpc:
  off    LVLLM_GPU_EXPERT_CACHE=0: the hybrid without a cache, per trace (the no-cache rate)
  cache  LVLLM_GPU_EXPERT_CACHE = the largest budget; smaller budgets use fewer slots of it (the cache
         emptied and refilled by its policy from the trace; a warm-up generation before each measure)
Per (trace, budget): the hit rate the cache reached (its own GPU counters), decode tok/s at 1 and 4
requests, the ratio to the no-cache rate of the same trace; in the same run: the host read bandwidth
(before and after) and the pure-CPU bound it sets (bandwidth / routed-expert bytes per token), and the
policy's hit rate simulated on the same trace (lk_moe.cache_policy.simulate). Writes a PNG of tok/s
against budget, one line per trace.

    python benchmarks/expert_cache.py                       # Qwen3-30B-A3B shape, 48 layers
    python benchmarks/expert_cache.py --simulate-only       # the policy's hit rates, no GPU needed
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import read_bandwidth, run_child  # noqa: E402

from lvllm.cli.checkpoint_info import expert_shape  # noqa: E402

SHAPES = {"qwen3-30b-a3b": "qwen3_moe", "gpt-oss-120b": "gpt_oss"}
# Rows the locality traces are made and calibrated with (their hit rates hold for batches of up to this many
# requests); the replay's further rows repeat them. The uniform trace fills every row: a speculative verify step's
# tokens route independently.
LOCALITY_ROWS = 8
# A --traces entry that is no trace: the router's own ids (dummy weights route near-uniformly), to tell
# what the replay itself costs from what the traces do.
ROUTER = "router"


def control(worker, op, *args):
    """Runs in the vLLM worker (collective_rpc): the cache and the routing replay of lvllm's runtime."""
    from lvllm import runtime
    rt = runtime._runtime
    cache, replay = rt.expert_cache, rt.replay
    if op == "info":
        return {"layers": rt.hybrid_count, "slots": cache.slots if cache is not None else 0,
                "slot_bytes": cache.layers[0].store.slot_bytes if cache is not None and cache.layers else 0,
                "experts": cache.num_experts if cache is not None else None,
                "cache": cache.describe() if cache is not None else "off",
                "replay": None if replay is None else list(replay.ids.shape)}
    if op == "trace":
        import numpy as np
        from lk_moe.routing_trace import make_trace
        name, seed, experts = args
        if name == ROUTER:
            replay.disable()
            return True
        steps, layers, rows, top_k = replay.ids.shape
        made = rows if name == "uniform" else LOCALITY_ROWS  # (rows % LOCALITY_ROWS == 0: lvllm.runtime's REPLAY_ROWS)
        replay.load(np.tile(make_trace(name, steps, layers, experts, top_k, rows=made, seed=seed),
                            (1, 1, rows // made, 1)))
        return True
    if op == "slots":
        cache.set_active_slots(args[0])
        return True
    if op == "totals":
        return cache.totals() if cache is not None else None
    raise ValueError(op)


def _worker(a) -> None:
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    llm = LLM(model=a.model, dtype="bfloat16", load_format="dummy", max_model_len=a.max_model_len,
              gpu_memory_utilization=a.gpu_util, seed=0, enable_prefix_caching=False)
    startup = time.time() - t0
    rng = random.Random(0)

    def rpc(*args):
        return llm.collective_rpc(control, args=args)[0]

    def gen(n_req, max_tokens):
        ps = [TokensPrompt(prompt_token_ids=[rng.randrange(10, 30000) for _ in range(32)]) for _ in range(n_req)]
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t = time.perf_counter()
        llm.generate(ps, sp, use_tqdm=False)
        return time.perf_counter() - t

    def rate(n_req):
        rates = []
        for _ in range(a.reps):
            t_first = gen(n_req, 1)
            t_all = gen(n_req, a.decode_tokens + 1)
            rates.append(n_req * a.decode_tokens / max(t_all - t_first, 1e-9))
        return statistics.median(rates)

    info = rpc("info")
    print("INFO " + json.dumps(dict(info, startup_s=round(startup, 1))), flush=True)
    experts = a.experts
    budgets = [0.0] if a.mode == "off" else [float(b) for b in a.budgets.split(",")]
    for trace in a.traces.split(","):
        rpc("trace", trace, 0, experts)
        for b in budgets:
            slots = 0
            if a.mode == "cache":  # the budget's bytes in slots (bf16 slots of 4-bit experts hold fewer)
                slots = min(info["slots"], int(b / 100 * experts * a.expert_bytes / info["slot_bytes"] + 1e-6))
                rpc("slots", slots)
            gen(4, a.warmup_tokens)  # the cache fills from the trace
            before = rpc("totals")
            r1 = rate(1)
            r4 = rate(4)
            after = rpc("totals")
            hit = None
            if before is not None and after["lookups"] > before["lookups"]:
                hit = (after["hits"] - before["hits"]) / (after["lookups"] - before["lookups"])
            refill_gb = None if before is None else (after["refill_bytes"] - before["refill_bytes"]) / 1e9
            print("RESULT " + json.dumps({"mode": a.mode, "trace": trace, "budget_pct": b, "slots": slots,
                                          "hit": hit, "tok_s_1": r1, "tok_s_4": r4, "refill_gb": refill_gb}),
                  flush=True)


def _simulated(cfg, traces, budgets, steps=300):
    from lk_moe.cache_policy import replay
    from lk_moe.expert_cache import REFILLS_PER_LAYER, REFILLS_PER_STEP_PER_LAYER
    from lk_moe.routing_trace import make_trace
    E, K, layers = expert_shape(cfg)[0], cfg["num_experts_per_tok"], 4
    out = {}
    for trace in [t for t in traces if t != ROUTER]:
        t = make_trace(trace, steps, layers, E, K, rows=4, seed=0)
        for b in budgets:  # the cache's own refill limits
            out[(trace, b)] = replay(t, int(round(b / 100 * E)), max_refills_per_layer=REFILLS_PER_LAYER,
                                     limit=REFILLS_PER_STEP_PER_LAYER * layers)
    return out


def _plot(path, results, budgets, traces, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not importable: no PNG)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "tok_s_1", "1 request"), (axes[1], "tok_s_4", "4 requests")):
        for trace in traces:
            pts = [(r["budget_pct"], r[key]) for r in results if r["mode"] == "cache" and r["trace"] == trace]
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=trace)
            off = [r[key] for r in results if r["mode"] == "off" and r["trace"] == trace]
            if off and trace == traces[0]:
                ax.axhline(off[0], color="gray", ls="--", lw=1, label=f"no cache ({trace})")
        ax.set_xlabel("cache budget, % of the routed-expert bytes")
        ax.set_ylabel("decode tok/s")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=list(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the real model (the bound scales)")
    ap.add_argument("--budgets", default="0,5,10,25,50", help="%% of the routed-expert bytes")
    ap.add_argument("--traces", default="uniform,lru50,lru67,lru80,shift67",
                    help=f"lk_moe.routing_trace names, and {ROUTER!r}: the router's own ids")
    ap.add_argument("--modes", default="off,cache")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--warmup-tokens", type=int, default=24)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--gpu-util", type=float, default=0.85)
    ap.add_argument("--gpu-prefill", type=int, default=1024)
    ap.add_argument("--out", default="", help="folder for the logs, results JSON and the PNG")
    ap.add_argument("--results", default="", help="JSON file that accumulates results across invocations "
                    "(e.g. --modes off in one device run, --modes cache in the next)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds for all the vLLM processes together: the "
                    "one running when they are spent is stopped, every thread's stack into its log")
    ap.add_argument("--simulate-only", action="store_true")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--experts", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--expert-bytes", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    t_start = time.time()
    if a.mode:
        _worker(a)
        return 0
    from lvllm.testing.tiny_checkpoint import make_checkpoint
    arch = SHAPES[a.shape]
    model = make_checkpoint(arch, os.path.join(tempfile.gettempdir(), f"lvllm-{a.shape}-L{a.layers or 'all'}"),
                            "big", layers=a.layers)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    E, H, I = expert_shape(cfg)
    K, L = cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    expert_bytes = 3 * H * I * 2 if arch != "gpt_oss" else 3 * H * I * 17 // 32  # bf16; mxfp4: 4.25 bits
    bytes_per_token = L * K * expert_bytes
    budgets = [float(b) for b in a.budgets.split(",")]
    traces = a.traces.split(",")
    out = a.out or tempfile.mkdtemp(prefix="expert_cache-")
    os.makedirs(out, exist_ok=True)
    print(f"{a.shape}: {L} layers, {E} experts of {expert_bytes / 2**20:.1f} MiB, top-{K}: routed-expert bytes per "
          f"token {bytes_per_token / 1e9:.2f} GB, all experts {L * E * expert_bytes / 2**30:.1f} GiB", flush=True)
    sim = _simulated(cfg, traces, budgets)
    print("policy simulated on the traces (300 steps, 4 layers, 4 rows): hit rate / refills per layer and step")
    for trace in [t for t in traces if t != ROUTER]:
        print(f"  {trace:>8}: " + "  ".join(f"{b:g}%: {sim[(trace, b)].hit_rate:.2f} / "
                                             f"{sim[(trace, b)].refills_per_layer_step:.2f}" for b in budgets), flush=True)
    if a.simulate_only:
        return 0
    bw_before = read_bandwidth()
    print(f"host read bandwidth {bw_before:.1f} GB/s: pure-CPU bound {bw_before * 1e9 / bytes_per_token:.2f} tok/s",
          flush=True)
    results = []
    if a.results and os.path.exists(a.results):
        with open(a.results) as f:
            kept = json.load(f)["results"]
        new_modes = set(a.modes.split(","))
        results = [r for r in kept if r["mode"] not in new_modes]
    max_budget_gib = max(budgets) / 100 * L * E * expert_bytes / 2**30
    for mode in [m for m in a.modes.split(",") if m]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        # collective_rpc sends `control` (a function) to the engine process pickled: vLLM asks for this.
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        env.update(LVLLM_MOE_NUMA_ENABLED="1", LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=str(a.gpu_prefill),
                   LVLLM_BENCH_ROUTING_REPLAY="1", LVLLM_STATS_INTERVAL="30",
                   LVLLM_GPU_EXPERT_CACHE=f"{max_budget_gib * 1.02:.3f}" if mode == "cache" else "0")
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--model", model, "--experts", str(E),
               "--expert-bytes", str(expert_bytes),
               "--budgets", a.budgets, "--traces", a.traces, "--reps", str(a.reps),
               "--decode-tokens", str(a.decode_tokens), "--warmup-tokens", str(a.warmup_tokens),
               "--max-model-len", str(a.max_model_len), "--gpu-util", str(a.gpu_util)]
        log_path = os.path.join(out, f"expert_cache-{mode}.log")
        marks = ("Model loading took", "lk_moe: hybrid", "KV cache size", "init engine", "Graph capturing finished",
                 "lk_moe stats", "INFO ", "RESULT ", "Error")

        def keep(r):  # as they come: a run cut by its time limit keeps what it measured
            results.append(r)
            if a.results:
                with open(a.results, "w") as f:
                    json.dump({"results": results}, f)
        left = a.timeout - (time.time() - t_start)
        if left < 60:
            print(f"[{mode}] not started: {left:.0f} s of --timeout left", flush=True)
            continue
        rc, _ = run_child(cmd, env, log_path, mode, marks, left, on_result=keep)
        if rc != 0:
            print(f"[{mode}] failed (rc {rc}); log: {log_path}", flush=True)
    bw_after = read_bandwidth()
    bw = (bw_before + bw_after) / 2
    bound = bw * 1e9 / bytes_per_token
    if a.results:
        with open(a.results, "w") as f:
            json.dump({"results": results}, f)
    with open(os.path.join(out, "expert_cache.json"), "w") as f:
        json.dump({"shape": a.shape, "layers": L, "read_bw": [bw_before, bw_after], "bound_tok_s": bound,
                   "results": results, "simulated": {f"{t}@{b}": v._asdict() for (t, b), v in sim.items()}}, f, indent=1)
    print(f"\nhost read bandwidth {bw_before:.1f} / {bw_after:.1f} GB/s (before / after): pure-CPU bound "
          f"{bound:.2f} tok/s at 1 request")
    off = {r["trace"]: r for r in results if r["mode"] == "off"}
    print(f"{'trace':>8} {'budget':>7} {'slots':>5} {'hit':>6} {'sim':>5} {'tok/s@1':>8} {'x off':>6} {'tok/s@4':>8} "
          f"{'x off':>6} {'refill GB':>9} {'CPU bound@hit':>13}")
    for r in results:
        o = off.get(r["trace"])
        x1 = f"{r['tok_s_1'] / o['tok_s_1']:.2f}" if o else "-"
        x4 = f"{r['tok_s_4'] / o['tok_s_4']:.2f}" if o else "-"
        hit = r["hit"] if r["hit"] is not None else 0.0
        s = sim.get((r["trace"], r["budget_pct"]))
        s = None if s is None else s.hit_rate
        print(f"{r['trace']:>8} {r['budget_pct'] if r['mode'] == 'cache' else 'off':>7} {r['slots']:>5} "
              f"{hit:6.3f} {'' if s is None or r['mode'] == 'off' else f'{s:.2f}':>5} {r['tok_s_1']:8.2f} {x1:>6} "
              f"{r['tok_s_4']:8.2f} {x4:>6} {(r['refill_gb'] or 0):9.2f} {bound / max(1e-9, 1 - hit):13.2f}")
    _plot(os.path.join(out, "expert_cache.png"), results, budgets, traces,
          f"{a.shape} ({L} layers), GPU expert cache: decode tok/s vs budget; pure-CPU bound {bound:.1f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
