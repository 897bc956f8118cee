#!/usr/bin/env python3
"""End-to-end decode speed and TTFT through vLLM 0.33.0 on a real model's shape with dummy weights:
Qwen3-30B-A3B in bf16 by default, or --arch deepseek_v4 --quant mxfp4 (DeepSeek-V4-Flash as released:
MXFP4 experts, FP8 block projections; --layers 20 where its 43 layers of experts exceed host RAM).

Modes (each its own vLLM process, as a user would run it):
  hybrid   LVLLM_MOE_NUMA_ENABLED=1: routed experts in host RAM on lk_moe, GPU prefill from
           --gpu-prefill tokens, CPU call captured in vLLM's CUDA graphs (default modes)
  hybrid-mailbox   the same with LK_CPU_SIGNAL=mailbox
  hybrid-eager     the same with --enforce-eager (no CUDA graphs: the MoE op runs eagerly)
  hybrid-v1        the same under vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0; V2 is 0.33's default)
  hybrid-excl      the same with LVLLM_EXCLUSIVE_ENGINE_CPUS=1 (no other thread on the engine workers' CPUs, the poller on a spare one alone)
  hybrid-bsync     the same with LVLLM_CUDA_BLOCKING_SYNC=1 (the GPU-driving thread sleeps on the GPU)
  hybrid-t12       the same with LK_THREADS=12 (any count); variants combine: hybrid-excl-bsync-t12
  hybrid-ng3       the same with vLLM's n-gram speculative decoding, 3 draft tokens a step (any count); its
                   acceptance from vLLM's own spec-decode counters, its step time against plain decode's
                   (with --prompt-period: prompts that repeat, so the drafts find matches)
  hybrid-eg3       the same with EAGLE-3 drafts, 3 tokens a step (any count): the draft at --eagle3-draft, or a
                   random-weight one written for the model (lvllm.testing.eagle3_draft: its acceptance is ~0, so the
                   figure is what drafting and verifying cost a step)
  hybrid-mt1       the same with MTP drafts from the checkpoint's own MTP layer, 1 token a step (any count; a
                   generated model gets the family's MTP layer, dummy weights: the cost side)
  hybrid-ru        the same with every row of every step routed uniformly by the benchmark-only routing replay
                   (LVLLM_BENCH_ROUTING_REPLAY, lk_moe.routing_trace): dummy weights route a request's tokens nearly
                   alike, so a verify step's cost needs it (hybrid-eg3-ru against hybrid-ru); outputs are meaningless
  hybrid-ds4       the same with DSpark drafts (DeepSeek-V4.1: a block of 4 from its DSpark stages; a generated
                   model gets 3 stages, lvllm.testing.deepseek_v41.dspark_fields)
  stock    stock vLLM, everything on the GPU (the upper reference)
  offload  stock vLLM with --cpu-offload-gb sized to the experts (the baseline to beat)

Reports per mode: decode tokens/s at 1 and 4 concurrent requests (128 generated tokens after the
first, median of --reps), TTFT of 1K and 8K-token prompts (fresh prompts: no prefix-cache hits), the GPU
memory vLLM reports for the weights, the KV-cache size, startup. In the same run, around each mode's
process: the host read bandwidth (lk_moe's probe, one thread per physical core, just before and just after
the mode; the host's bandwidth drifts by 10-20% between minutes), the bound it sets on hybrid decode =
bandwidth / routed-expert bytes per token, and each hybrid mode's fraction of its own bound; where a
hybrid decode step's time goes (the engine's share, from its own counters, against the same layers called
straight from Python in the serving process after the measurements: the engine and its memory alone), and which threads of the
machine used the CPUs during the first measured decode (benchmarks/cpu_census.py: share of a core and
preemptions per thread; the engine's workers are lk_moe-w<N>).

    python benchmarks/e2e_decode.py --modes hybrid,stock,offload
    python benchmarks/e2e_decode.py --modes hybrid,hybrid-ng1,hybrid-ng2,hybrid-ng3,hybrid-ng4 --prompt-period 16
    python benchmarks/e2e_decode.py --modes hybrid,hybrid-eg1,hybrid-eg3
    python benchmarks/e2e_decode.py --modes hybrid-ru,hybrid-eg1-ru,hybrid-eg2-ru,hybrid-eg3-ru,hybrid-eg4-ru
    python benchmarks/e2e_decode.py --arch deepseek_v4 --quant mxfp4 --layers 20 --modes hybrid,stock
    python benchmarks/e2e_decode.py --arch qwen3_next --quant fp8 --modes hybrid,stock   # Qwen3-Next-80B-A3B-FP8
    python benchmarks/e2e_decode.py --arch deepseek_v4 --quant mxfp4 --layers 20 --modes hybrid,hybrid-mt1,hybrid-mt2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

import cpu_census
from harness import read_bandwidth, run_child
from lvllm.stats import graph_steps_in
from lvllm.testing.spec_decode import repeated, spec_counters


def _engine_decode_totals(worker):
    """Runs in the vLLM worker (collective_rpc): the engine's decode-sized runs so far, all layers together
    (nanoseconds of engine wall time, nanoseconds waiting for the pool), and the first layer's decode rows."""
    from lvllm import runtime
    t = runtime._runtime.monitor.totals()
    return t.cpu_decode_ns, t.cpu_queue_ns, t.cpu_decode_tokens


def _engine_direct_step(worker, reps: int = 15, tokens: int = 1):
    """Runs in the vLLM worker (collective_rpc), between requests: the engine's time for one decode step's hybrid
    layers, each called straight from Python in this process (no GPU, no signal thread, the serving process's
    own expert memory and pool), `tokens` rows with fresh uniform routing per call. Median of `reps` steps, ms.
    Against the engine's time inside decode it tells the engine and its memory from how it runs in the loop."""
    import torch
    from lk_moe.reference import random_routing
    from lvllm import runtime
    hybrids = runtime._runtime.monitor.hybrids()
    if not hybrids:
        return None
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hybrids[0].layer.hidden_size, generator=g).to(torch.bfloat16)
    steps = []
    for _ in range(reps):
        routes = [random_routing(tokens, h.layer.num_experts, h.top_k, generator=g) for h in hybrids]
        t = time.perf_counter()
        for h, (ids, w) in zip(hybrids, routes):
            h.layer.forward(x, ids, w)
        steps.append(time.perf_counter() - t)
    return round(statistics.median(steps) * 1e3, 3), len(hybrids)


def engine_kwargs(a) -> dict:
    """vLLM's LLM(...) arguments of one mode (a: the worker's parsed arguments)."""
    kwargs = dict(model=a.model, dtype="bfloat16", load_format="dummy", max_model_len=a.max_model_len,
                  max_num_seqs=a.max_num_seqs, gpu_memory_utilization=a.gpu_util, seed=0,
                  enable_prefix_caching=False)
    if a.mode == "offload":
        kwargs["cpu_offload_gb"] = a.offload_gb
    spec = mode_speculation(a.mode, a.eagle3_draft)
    if spec is not None:
        kwargs.update(speculative_config=spec, disable_log_stats=False)  # the spec-decode counters need stats on
    if "eager" in a.mode.split("-"):
        kwargs["enforce_eager"] = True
    if a.language_model_only:
        kwargs["language_model_only"] = True
    if a.no_jit_warmup:
        kwargs["kernel_config"] = {"enable_jit_warmup": False}
    return kwargs


def _worker(a) -> None:
    """One mode in this process: load, warm up, measure, print one JSON line."""
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_kwargs(a)
    spec = kwargs.get("speculative_config")
    if a.no_jit_warmup:
        # DeepSeek-V4's FP8 projections: DeepGEMM's own warmup (2541 shapes, ~25 min on a fresh H200) is not the JIT one
        os.environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    t0 = time.time()
    llm = LLM(**kwargs)
    startup = time.time() - t0
    if "ru" in a.mode.split("-"):  # before the warm-up: every measured step follows the trace
        import cloudpickle
        import expert_cache  # (sent by value: the engine process need not find benchmarks/ on its path)
        cloudpickle.register_pickle_by_value(expert_cache)
        llm.collective_rpc(expert_cache.control, args=("trace", RU_TRACE, 0, a.experts))
    rng = random.Random(0)

    def prompt(n):
        ids = [rng.randrange(10, min(30000, a.vocab)) for _ in range(a.prompt_period or n)]
        return TokensPrompt(prompt_token_ids=repeated(ids, n))

    def gen(prompts, max_tokens):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - t

    def engine():
        return llm.collective_rpc(_engine_decode_totals)[0] if a.mode.startswith("hybrid") else None

    # Warm-up over every shape the measurement uses (1 and 4 requests, 1K and 8K prompts): on a fresh machine the
    # first use of a batch shape compiles kernels for seconds to minutes (DeepSeek-V4 with its warmups skipped)
    for conc in (1, 4):  # both runs of a rep below: 1 token and 1 + N (a drafter's first proposal has its own shapes)
        gen([prompt(32) for _ in range(conc)], 1)
        gen([prompt(32) for _ in range(conc)], 8)
    for n in (1024, 8192):
        gen([prompt(n)], 1)
    res = {"mode": a.mode, "startup_s": round(startup, 1)}
    for conc in (1, 4):
        spec0 = spec_counters(llm) if spec is not None else None
        rates, engine_ms, queue_ms = [], [], []
        for rep in range(a.reps):
            # decode time = a run of 1 + N tokens less a run of 1 token (same prompt sizes): the prompts'
            # prefill cancels; so does its engine time (a 32-token prompt is a decode-sized CPU call)
            ps = [prompt(32) for _ in range(conc)]
            e0 = engine()
            t_first = gen(ps, 1)
            e1 = engine()
            ps = [prompt(32) for _ in range(conc)]
            census0, c0 = (cpu_census.snapshot(), time.perf_counter()) if conc == 1 and rep == 0 else (None, 0)
            t_all = gen(ps, a.decode_tokens + 1)
            if census0 is not None:  # who used the CPUs during the first measured decode
                res["census_1"] = cpu_census.busiest(census0, cpu_census.snapshot(), time.perf_counter() - c0)
            e2 = engine()
            if t_all <= t_first:  # the 1-token run took longer (a first-use compile, a stall): no figure
                print(f"rep {rep} @{conc}: the {a.decode_tokens + 1}-token run ({t_all:.3f} s) was not longer than "
                      f"the 1-token run ({t_first:.3f} s): left out", flush=True)
                continue
            rates.append(conc * a.decode_tokens / (t_all - t_first))
            if e0 is not None and spec is None:  # (a verify step's rows vary with the drafts: no per-step figure)
                rows = (e2[2] - e1[2]) - (e1[2] - e0[2])  # the decode steps' rows (conc each), first layer
                if rows > 0:
                    steps = rows / conc
                    engine_ms.append(((e2[0] - e1[0]) - (e1[0] - e0[0])) / 1e6 / steps)
                    queue_ms.append(((e2[1] - e1[1]) - (e1[1] - e0[1])) / 1e6 / steps)
        res[f"decode_tok_s_{conc}"] = statistics.median(rates) if rates else None
        if spec0 is not None:  # what vLLM counted over this concurrency's runs: drafts, draft tokens, accepted
            spec1 = spec_counters(llm)
            drafts, drafted, accepted = (spec1[k] - spec0[k] for k in ("drafts", "draft_tokens", "accepted_tokens"))
            res[f"spec_accept_rate_{conc}"] = round(accepted / drafted, 3) if drafted else None
            res[f"spec_tokens_per_step_{conc}"] = round(1 + accepted / drafts, 3) if drafts else None
        res[f"decode_tok_s_{conc}_all"] = [round(r, 2) for r in rates]
        if engine_ms:  # where a decode step's time goes: the engine's share of it tells CPU from GPU/sync time
            res[f"engine_ms_per_step_{conc}"] = round(statistics.median(engine_ms), 3)
            res[f"engine_queue_ms_per_step_{conc}"] = round(statistics.median(queue_ms), 3)
        print("RESULT " + json.dumps(dict(res, partial=True)), flush=True)  # what a stopped mode still reports
    for n in (1024, 8192):
        ts = [gen([prompt(n)], 1) for _ in range(a.reps)]
        res[f"ttft_{n}_s"] = statistics.median(ts)
    print("RESULT " + json.dumps(dict(res, partial=True)), flush=True)
    if a.mode.startswith("hybrid"):
        direct = llm.collective_rpc(_engine_direct_step)[0]
        if direct is not None:
            res["engine_direct_ms_1"], res["engine_direct_layers"] = direct
    print("RESULT " + json.dumps(res), flush=True)


SPEC_VARIANT = r"(ng|eg|mt|ds)[1-9][0-9]*"  # n-gram / EAGLE-3 / MTP / DSpark drafts, k tokens a step


def mode_speculation(mode: str, eagle3_draft: str = ""):
    """vLLM's speculative_config of a mode's ng<k> variant (n-gram drafts, k tokens a step), eg<k> variant (EAGLE-3
    drafts from the draft model at eagle3_draft), mt<k> variant (the checkpoint's MTP layer) or ds<k> variant (its
    DSpark stages, a block of k), or None."""
    for v in mode.split("-")[1:]:
        if re.fullmatch(SPEC_VARIANT, v):
            if v.startswith("ng"):
                return {"method": "ngram", "num_speculative_tokens": int(v[2:]), "prompt_lookup_min": 2,
                        "prompt_lookup_max": 4}
            if v.startswith(("mt", "ds")):
                return {"method": "mtp" if v.startswith("mt") else "dspark", "num_speculative_tokens": int(v[2:])}
            if not eagle3_draft:
                raise SystemExit(f"mode {mode!r}: EAGLE-3 drafts need a draft model (--eagle3-draft)")
            return {"method": "eagle3", "model": eagle3_draft, "num_speculative_tokens": int(v[2:])}
    return None


def probes_disagree(probes, decode_gbs: float) -> str:
    """A note when the read-bandwidth probes around a mode differ by more than 25% (a noisy host: the mean bound
    is then loose), with the decode rate against the higher probe; else nothing. decode_gbs: the bytes the decode
    rate reads per second."""
    lo, hi = min(probes), max(probes)
    if lo <= 0 or hi / lo <= 1.25:
        return ""
    return f"; the probes differ {hi / lo:.2f}x (a noisy host): {decode_gbs / hi:.2f} of the higher one"


def decode1_split_lines(mode: str, r: dict, stock, bytes_per_token: int) -> list:
    """A decode step at 1 request split three ways: the engine's expert time (measured inside the serving process),
    the GPU's share, and what is left: the hand-offs (signals, copies, the graph breaks around the CPU call). The
    GPU's share is stock vLLM's whole step on the same checkpoint when the run has one: it holds every layer's GPU
    work plus the routed experts' (which the hybrid step does not run there), so it is an upper bound and the
    hand-offs a lower one."""
    if "engine_ms_per_step_1" not in r or not r.get("decode_tok_s_1"):
        return []
    step_ms, eng = 1e3 / r["decode_tok_s_1"], r["engine_ms_per_step_1"]
    lines = [f"{mode} decode @1 step {step_ms:.2f} ms: engine {eng:.2f} ms ({eng / step_ms:.0%}; of it "
             f"{r['engine_queue_ms_per_step_1']:.2f} ms waiting for the pool) at {bytes_per_token / eng / 1e6:.1f} "
             f"GB/s = {bytes_per_token / eng / 1e6 / r['read_bw_gbs']:.2f} of the read bandwidth; the other "
             f"{step_ms - eng:.2f} ms: GPU work and hand-offs"]
    if speculative(mode) or not (stock and stock.get("decode_tok_s_1")):
        return lines
    gpu_ms = 1e3 / stock["decode_tok_s_1"]
    rest = step_ms - eng - gpu_ms
    lines.append(f"{mode} decode @1 step split: engine {eng:.2f} ms ({eng / step_ms:.0%}), GPU at most {gpu_ms:.2f} ms "
                 f"({gpu_ms / step_ms:.0%}; stock's whole step, its experts included), hand-offs and graph breaks at "
                 f"least {max(rest, 0.0):.2f} ms ({max(rest, 0.0) / step_ms:.0%})"
                 + ("" if rest >= 0 else f" (the parts overlap by {-rest:.2f} ms)"))
    return lines


def decode4_lines(mode: str, r: dict, experts: int, top_k: int, bytes_per_token: int) -> list:
    """Decode at 4 requests against the bandwidth bound of the same run: a step of 4 tokens reads the union of their
    experts, taken as 4 tokens routed independently and uniformly draw it (exact in expectation for the -ru modes;
    dummy weights may route the requests alike, which reads less and can pass 1.0); with the engine's own step time
    against the read bandwidth when it was measured."""
    tok_s, bw = r.get("decode_tok_s_4"), r.get("read_bw_gbs")
    if speculative(mode) or not (tok_s and bw and r.get("bound_tok_s")):
        return []
    from lvllm.speculation import expected_distinct_experts
    union = expected_distinct_experts(experts, top_k, 4) / top_k  # a step's expert bytes, in one token's
    bound = r["bound_tok_s"] * 4 / union
    lines = [f"{mode} decode @4 = {tok_s / bound:.2f} of the bandwidth bound ({bound:.1f} tok/s: a step of 4 "
             f"independently routed tokens reads {union:.2f}x one token's experts)"]
    eng = r.get("engine_ms_per_step_4")
    if eng:
        gbs = union * bytes_per_token / eng / 1e6
        lines.append(f"{mode} decode @4 step {4e3 / tok_s:.2f} ms: engine {eng:.2f} ms at {gbs:.1f} GB/s = "
                     f"{gbs / bw:.2f} of the read bandwidth (for that union)")
    return lines


def speculative(mode: str) -> bool:
    """Whether a mode drafts tokens (any speculative variant)."""
    return any(re.fullmatch(SPEC_VARIANT, v) for v in mode.split("-")[1:])


def _uses(kind: str, modes) -> bool:
    return any(v.startswith(kind) and re.fullmatch(SPEC_VARIANT, v) for m in modes for v in m.split("-")[1:])


def uses_eagle3(modes) -> bool:
    return _uses("eg", modes)


def uses_mtp(modes) -> bool:
    return _uses("mt", modes)


def uses_dspark(modes) -> bool:
    return _uses("ds", modes)


# Where a config says how many MTP layers its model has (DeepSeek, GLM, Qwen3-Next, Kimi: nextn; Qwen3.5: mtp_num_...)
MTP_COUNT_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def mtp_layers(config: dict) -> int:
    """The MTP layers a checkpoint's config declares (its own fields or its text_config's), 0 if none."""
    text = config.get("text_config") or {}
    return max([int(c.get(f) or 0) for c in (config, text) for f in MTP_COUNT_FIELDS] + [0])


def plain_twin(mode: str) -> str:
    """The mode without its drafts: hybrid-eg2-ru -> hybrid-ru."""
    return "-".join(v for v in mode.split("-") if not re.fullmatch(SPEC_VARIANT, v))


def step_cost(r: dict, plain: dict, conc: int):
    """(step ms, x a plain step) of a speculative mode at `conc` requests against its plain twin, or None without the
    figures: at c requests a step makes c x tokens_per_step tokens, so its time is c x tokens_per_step / tok/s (tok/s
    counts every request's tokens), a plain step's c / tok/s."""
    tok_s, per_step = r.get(f"decode_tok_s_{conc}"), r.get(f"spec_tokens_per_step_{conc}")
    base = plain.get(f"decode_tok_s_{conc}") if plain else None
    if not (tok_s and per_step and base):
        return None
    return 1e3 * conc * per_step / tok_s, per_step * base / tok_s


def speculation_lines(results: dict) -> list:
    """Each speculative mode against its plain twin of the same run (hybrid-eg2-ru against hybrid-ru): decode speed-up,
    vLLM's acceptance, and the step's cost (step_cost)."""
    lines = []
    for m, r in results.items():
        if "spec_tokens_per_step_1" not in r:
            continue
        plain = results.get(plain_twin(m))
        for conc in (1, 4):
            tok_s, per_step = r.get(f"decode_tok_s_{conc}"), r.get(f"spec_tokens_per_step_{conc}")
            base = plain.get(f"decode_tok_s_{conc}") if plain else None
            if not (tok_s and per_step):
                lines.append(f"{m} @{conc}: no figure (decode {tok_s}, tokens a step {per_step})")
                continue
            cost = step_cost(r, plain, conc)
            vs = (f"; {tok_s / base:.2f}x plain decode's {base:.2f} tok/s, step {cost[0]:.2f} ms = "
                  f"{cost[1]:.2f}x a plain step's {1e3 * conc / base:.2f} ms") if cost else ""
            lines.append(f"{m} @{conc}: {tok_s:.2f} tok/s, acceptance {r[f'spec_accept_rate_{conc}']:.2f}, "
                         f"{per_step:.2f} tokens a step{vs}")
    return lines


def mode_result(rc, lines: list):
    """A mode's result from its child's RESULT lines: the last one (the final, or the last partial of a mode stopped
    while it measured; an exit code other than 0 recorded with it), None when it printed none."""
    if not lines:
        return None
    return lines[-1] if rc == 0 else dict(lines[-1], rc=rc)


def measured(r: dict) -> list:
    """The figures a (partial) result holds: decode rates and TTFTs."""
    return [k for k in r if k.startswith(("decode_tok_s", "ttft")) and not k.endswith("_all")]


def speculation_table(results: dict) -> list:
    """The cost table of the speculative modes, by draft tokens k: each step's time against its plain twin's at 1 and
    4 requests (through vLLM), beside what the engine measured at startup for k + 1 uniformly routed tokens and the
    bytes of their expert union (the floor of a bandwidth-bound engine), and vLLM's acceptance."""
    rows = []
    for m, r in results.items():
        k = next((int(v[2:]) for v in m.split("-") if re.fullmatch(SPEC_VARIANT, v)), None)
        plain = results.get(plain_twin(m))
        if k is None or not plain:
            continue
        cells = [step_cost(r, plain, conc) for conc in (1, 4)]
        rows.append((k, m, cells, r.get("spec_accept_rate_1"), r.get("engine_verify_ratio"), r.get("verify_union_ratio")))
    if not rows:
        return []
    lines = [f"{'mode':>16} {'k':>2} {'step@1':>8} {'x plain':>7} {'step@4':>8} {'x plain':>7} {'engine':>7} "
             f"{'union':>6} {'accept':>6}   (steps in ms; engine, union: k + 1 uniformly routed tokens vs one)"]
    for k, m, cells, accept, engine, union in sorted(rows):
        cols = " ".join(f"{c[0]:8.2f} {c[1]:6.2f}x" if c else f"{'n/a':>8} {'':>7}" for c in cells)
        ratio = (lambda v, w: f"{v:.2f}x".rjust(w) if isinstance(v, (int, float)) else "n/a".rjust(w))
        lines.append(f"{m:>16} {k:>2} {cols} {ratio(engine, 7)} {ratio(union, 6)} {_num(accept, 6, 2)}")
    return lines


def _log_figures(log_path: str) -> dict:
    """What vLLM itself reports at startup: GPU memory of the weights, KV-cache tokens."""
    out = {}
    with open(log_path, errors="replace") as f:
        text = f.read()
    m = re.findall(r"Model loading took ([\d.]+) GiB", text)
    if m:
        out["weights_gib"] = float(m[-1])
    m = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
    if m:
        out["kv_tokens"] = int(m[-1].replace(",", ""))
    m = re.findall(r"costs ([\d.]+)x a plain decode step's CPU expert time", text)  # lvllm.speculation.advice
    if m:
        out["engine_verify_ratio"] = float(m[-1])
    m = re.findall(r"its tokens route to ([\d.]+)x one token's expert bytes", text)
    if m:
        out["verify_union_ratio"] = float(m[-1])
    # lvllm.stats lines: CPU-path steps, and those replayed from CUDA graphs (decode inside graphs)
    steps, graph = graph_steps_in(text)
    if steps:
        out["cpu_steps"], out["cpu_graph_steps"] = steps, graph
    return out


def graph_line(mode: str, r: dict) -> str:
    """How many of the run's CPU-path steps replayed from CUDA graphs ("" where its log had no statistics line)."""
    if not r.get("cpu_steps"):
        return ""
    return (f"{mode} CPU-path steps replayed from CUDA graphs: {r['cpu_graph_steps']} of {r['cpu_steps']} "
            f"({r['cpu_graph_steps'] / r['cpu_steps']:.0%}; the others eager: prompts, warm-up, capture and profile "
            "runs)")


# A hybrid mode's variants, joined with '-' (hybrid-excl-t12): the setting each one changes
VARIANTS = {"mailbox": {"LK_CPU_SIGNAL": "mailbox"}, "v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "eager": {},
            "excl": {"LVLLM_EXCLUSIVE_ENGINE_CPUS": "1"}, "bsync": {"LVLLM_CUDA_BLOCKING_SYNC": "1"},
            "ru": {"LVLLM_BENCH_ROUTING_REPLAY": "1"}}
# The ru variant's trace (lk_moe.routing_trace): every row of every step routed independently and uniformly. With the
# dummy weights' own routing a verify step of 3 tokens cost 1.40x a plain step through vLLM (H200, 2026-12-05), where
# the engine measured 2.73x for 3 independently routed tokens: one request's tokens route to overlapping experts.
RU_TRACE = "uniform"


def mode_env(mode: str) -> dict:
    """The environment a mode adds: hybrid[-variant...] (VARIANTS, t<N> for LK_THREADS=N, ng<k> / eg<k> / mt<k> /
    ds<k>: no environment, see mode_speculation), offload, stock."""
    base, *variants = mode.split("-")
    if base not in ("hybrid", "offload", "stock") or (variants and base != "hybrid"):
        raise SystemExit(f"unknown mode {mode!r}: hybrid[-{'|-'.join(VARIANTS)}|-t<threads>|-ng<k>|-eg<k>|-mt<k>|"
                         f"-ds<k>], offload or stock")
    env = {}
    for v in variants:
        if v in VARIANTS:
            env.update(VARIANTS[v])
        elif re.fullmatch(r"t[1-9][0-9]*", v):
            env["LK_THREADS"] = v[1:]
        elif not re.fullmatch(SPEC_VARIANT, v):  # ng<k>, eg<k>, mt<k>, ds<k>: mode_speculation
            raise SystemExit(f"unknown variant {v!r} of mode {mode!r}: {', '.join(VARIANTS)}, t<threads>, "
                             f"ng<draft tokens>, eg<draft tokens>, mt<draft tokens> or ds<draft tokens>")
    return env


def load_results(path: str, checkpoint: str) -> dict:
    """The modes measured earlier on this checkpoint (a --results file adds up over runs, one checkpoint at a time:
    a row of another model's, or one that does not say, is dropped, never shown beside this one's)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        stored = json.load(f)
    kept = {m: r for m, r in stored.items() if r.get("checkpoint") == checkpoint}
    if len(kept) < len(stored):
        print(f"{path}: dropped {', '.join(sorted(set(stored) - set(kept)))}: measured on another checkpoint",
              flush=True)
    return kept


def _num(v, width: int, digits: int) -> str:
    return f"{v:{width}.{digits}f}" if isinstance(v, (int, float)) else f"{'n/a':>{width}}"


def mode_share(left_s: float, modes_left: int, cap: int, floor: int) -> int:
    """A mode's seconds under --total-timeout: what is left less `floor` seconds for each later mode, never less than
    an even share of it, at most `cap`, at least 1. The first mode on a fresh machine compiles cold and needs more than
    the later ones (an even split stopped all three modes of a run there while they measured)."""
    later = max(0, modes_left - 1)
    return max(1, min(cap, int(max(left_s - floor * later, left_s / max(1, modes_left)))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="hybrid")
    ap.add_argument("--model", default="", help="checkpoint dir (default: a generated config of --arch's real shape)")
    ap.add_argument("--arch", default="qwen3_moe", help="generated model: a tools/make_tiny_checkpoint.py --arch")
    ap.add_argument("--quant", default="bf16", help="generated model: its format (deepseek_v4: mxfp4, as released; "
                    "qwen3_next, qwen3_5_moe, minimax_m2: fp8, their block-FP8 releases)")
    ap.add_argument("--size", default="big", choices=("big", "tiny"),
                    help="generated model: the real shape (default), or the tiny one (startup probes of a new architecture)")
    ap.add_argument("--layers", type=int, default=0,
                    help="generated model: fewer layers than the real model (faster start, less host RAM; the "
                         "bound scales with it)")
    ap.add_argument("--ple-rows", type=int, default=0,
                    help="generated model: the n-gram vocabulary base of its PLE tables (Qwen3.8-Flash-Next, qwen4_exp: "
                         "20M rows as released, a ~48 GiB FP8 table whose dummy fill needs ~95 GiB of host RAM)")
    ap.add_argument("--log-dir", default="", help="write each mode's full vLLM log here")
    ap.add_argument("--results", default="",
                    help="JSON file that accumulates results across invocations (one mode per device run)")
    ap.add_argument("--gpu-prefill", type=int, default=1024)
    ap.add_argument("--offload-gb", type=float, default=58)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prompt-period", type=int, default=0,
                    help="every mode's prompts repeat a random run of this many tokens (n-gram drafts then find "
                         "matches); 0: random prompts")
    ap.add_argument("--eagle3-draft", default="",
                    help="the EAGLE-3 draft model of the eg<k> modes (default: a random-weight one written next to "
                         "the model)")
    ap.add_argument("--max-model-len", type=int, default=9216)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--gpu-util", type=float, default=0.85)
    ap.add_argument("--timeout", type=int, default=1500, help="seconds per mode")
    ap.add_argument("--total-timeout", type=int, default=0,
                    help="seconds for all modes: each gets what is left when it starts less --mode-floor for each later "
                         "mode, at least an even share (a mode that fails fast leaves its time to the next), capped by "
                         "--timeout; a mode stopped by it reports what it had measured")
    ap.add_argument("--mode-floor", type=int, default=150,
                    help="--total-timeout: seconds kept for each later mode (a warm start of the Qwen3-30B-A3B shape "
                         "and its measurement: ~110-130 s on the H200; a cold one ~230 s)")
    ap.add_argument("--language-model-only", action="store_true",
                    help="every mode: vLLM's --language-model-only (a vision-language model's text part alone; on by "
                         "default for the generated checkpoints of releases written without their vision tower)")
    ap.add_argument("--no-jit-warmup", action="store_true",
                    help="every mode: vLLM's --kernel-config '{\"enable_jit_warmup\": false}' (DeepSeek-V4: its ~200 "
                         "TileLang kernels then compile at first use instead of >4 min of startup on a fresh machine) "
                         "and VLLM_DEEP_GEMM_WARMUP=skip (its FP8 projections: 2541 DeepGEMM shapes, ~25 min)")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=30000, help=argparse.SUPPRESS)  # prompt ids stay below it
    ap.add_argument("--experts", type=int, default=0, help=argparse.SUPPRESS)  # routed experts a layer (ru's trace)
    a = ap.parse_args()
    if a.mode:
        _worker(a)
        return 0
    modes = [m for m in a.modes.split(",") if m]
    for mode in modes:
        mode_env(mode)  # a typo stops here, before the checkpoint and any mode's minutes-long start
    if not a.model:
        from lvllm.testing.tiny_checkpoint import LANGUAGE_MODEL_ONLY, make_checkpoint
        a.language_model_only = a.language_model_only or a.arch in LANGUAGE_MODEL_ONLY
        mtp = 3 if uses_dspark(modes) else 1 if uses_mtp(modes) else 0  # DSpark: vLLM's default of 3 stages
        name = (f"lvllm-{a.arch}-{a.quant}-{a.size}-L{a.layers or 'all'}" + (f"-mtp{mtp}" if mtp else "")
                + (f"-ple{a.ple_rows}" if a.ple_rows else ""))
        a.model = make_checkpoint(a.arch, os.path.join(tempfile.gettempdir(), name), a.size, layers=a.layers,
                                  quant=a.quant, mtp=mtp, ple_rows=a.ple_rows)
    elif (uses_mtp(modes) or uses_dspark(modes)) and not mtp_layers(
            json.load(open(os.path.join(a.model, "config.json")))):
        raise SystemExit(f"the mt<k> / ds<k> modes draft with the model's MTP layers or DSpark stages: {a.model}'s "
                         "config declares none")
    if uses_eagle3(modes) and not a.eagle3_draft:
        from lvllm.testing.eagle3_draft import make_eagle3_draft
        a.eagle3_draft = a.model.rstrip("/") + "-eagle3"
        if not os.path.exists(os.path.join(a.eagle3_draft, "model.safetensors")):
            make_eagle3_draft(a.model, a.eagle3_draft)
    from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, read_checkpoint
    info = read_checkpoint(a.model)  # its weight files, or config.json's shapes for a config-only model
    K = experts_per_token(info.config)
    experts = expert_shape(info.config)[0]
    bytes_per_token = info.expert_bytes * K // experts  # K experts in each MoE layer, every step
    print(f"{info.architecture}: {info.moe_layers} MoE layers of {experts} experts, top-{K}, "
          f"{', '.join(info.expert_dtypes)}: routed-expert bytes per token {bytes_per_token / 1e9:.2f} GB, "
          f"all experts {info.expert_bytes / 2**30:.2f} GiB", flush=True)
    results = load_results(a.results, a.model)
    deadline = time.time() + a.total_timeout if a.total_timeout > 0 else None
    for i, mode in enumerate(modes):
        timeout = a.timeout if deadline is None else mode_share(deadline - time.time(), len(modes) - i, a.timeout, a.mode_floor)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        # collective_rpc sends the engine-counter reader (a function) to the engine process pickled: vLLM asks for this
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        if mode.startswith("hybrid"):
            env.update(LVLLM_MOE_NUMA_ENABLED="1", LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=str(a.gpu_prefill))
            env.setdefault("LVLLM_STATS_INTERVAL", "15")  # the engine's own per-step numbers in the log
        env.update(mode_env(mode))
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--model", a.model,
               "--offload-gb", str(a.offload_gb), "--reps", str(a.reps), "--decode-tokens", str(a.decode_tokens),
               "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs),
               "--gpu-util", str(a.gpu_util), "--vocab", str(info.config.get("vocab_size") or 30000), "--experts", str(experts),
               "--prompt-period", str(a.prompt_period), "--eagle3-draft", a.eagle3_draft] + \
            (["--no-jit-warmup"] if a.no_jit_warmup else []) + \
            (["--language-model-only"] if a.language_model_only else [])
        bw_before = read_bandwidth()
        t = time.time()
        log_path = os.path.join(a.log_dir or tempfile.gettempdir(), f"e2e_decode-{mode}.log")
        if a.log_dir:
            os.makedirs(a.log_dir, exist_ok=True)
        # The child's log streams to a file, and its milestones to our stdout as they happen.
        milestones = ("Loading weights took", "Model loading took", "lk_moe:", "torch.compile took",
                      "KV cache size", "init engine", "Graph capturing finished", "lk_moe stats", "RESULT", "Error", "error")
        rc, lines = run_child(cmd, env, log_path, mode, milestones, timeout)
        r = mode_result(rc, lines)
        if r is None or r.get("partial") or "rc" in r:
            print(f"[{mode}] failed (rc {rc}) after {time.time() - t:.0f}s; full log: {log_path}")
            if r is None:  # an earlier run's row for this mode would stand in the table as if measured now
                if results.pop(mode, None) is not None and a.results:
                    with open(a.results, "w") as f:
                        json.dump(results, f, indent=1)
                continue
            print(f"[{mode}] keeping what it measured before it stopped: {', '.join(measured(r))}")
        bw_after = read_bandwidth()
        bw = (bw_before + bw_after) / 2
        r.update(_log_figures(log_path), checkpoint=a.model, read_bw_gbs=round(bw, 1), read_bw_before_after=[round(bw_before, 1), round(bw_after, 1)],
                 bound_tok_s=round(bw * 1e9 / bytes_per_token, 2))
        results[mode] = r
        print(f"[{mode}] " + json.dumps(r), flush=True)
        if a.results:
            with open(a.results, "w") as f:
                json.dump(results, f, indent=1)
    print(f"\n{'mode':>12} {'tok/s@1':>8} {'tok/s@4':>8} {'TTFT 1K':>8} {'TTFT 8K':>8} {'weights':>8} {'KV tokens':>10} "
          f"{'startup':>8} {'read BW':>8}")
    for m, r in results.items():
        w = f"{r['weights_gib']:.2f}G" if "weights_gib" in r else "?"
        kv = f"{r['kv_tokens']:,}" if "kv_tokens" in r else "?"
        print(f"{m:>12} {_num(r.get('decode_tok_s_1'), 8, 2)} {_num(r.get('decode_tok_s_4'), 8, 2)} "
              f"{_num(r.get('ttft_1024_s'), 8, 3)} {_num(r.get('ttft_8192_s'), 8, 3)} "
              f"{w:>8} {kv:>10} {r['startup_s']:7.1f}s {r['read_bw_gbs']:6.1f}GB/s" + ("  (stopped early)" if r.get("partial") else ""))
    for m in [m for m in results if m.startswith("hybrid") and results[m].get("decode_tok_s_1")]:
        r = results[m]
        if not speculative(m):  # a verify step reads k + 1 tokens' experts: the speculation lines compare it
            print(f"{m} decode @1 = {r['decode_tok_s_1'] / r['bound_tok_s']:.2f} of the bandwidth bound "
                  f"({r['bound_tok_s']:.1f} tok/s at {r['read_bw_gbs']:.1f} GB/s, probes {r['read_bw_before_after']})"
                  + probes_disagree(r['read_bw_before_after'], r['decode_tok_s_1'] / r['bound_tok_s'] * r['read_bw_gbs']))
        for line in decode1_split_lines(m, r, results.get("stock"), bytes_per_token):
            print(line)
        if r.get("engine_direct_ms_1"):
            d = r["engine_direct_ms_1"]
            inside = (f"; inside decode {r['engine_ms_per_step_1']:.2f} ms = {r['engine_ms_per_step_1'] / d:.2f}x"
                      if "engine_ms_per_step_1" in r else "")
            print(f"{m} engine called directly in the serving process (no GPU, {r['engine_direct_layers']} layers, "
                  f"M = 1): {d:.2f} ms a step = {bytes_per_token / d / 1e6 / r['read_bw_gbs']:.2f} of the read "
                  f"bandwidth{inside}")
        for line in decode4_lines(m, r, experts, K, bytes_per_token) + [graph_line(m, r)]:
            if line:
                print(line)
        if r.get("census_1"):
            print(f"{m} CPUs during decode @1: {cpu_census.summary(r['census_1'], os.cpu_count())}")
            for t in r["census_1"][:8]:
                print(f"    {t['name']:>16} pid {t['pid']:>7} tid {t['tid']:>7}  {t['core_share']:.2f} of a core, "
                      f"{t['preempted']} preemptions, last on CPU {t['cpu']}")
    for line in speculation_lines(results) + speculation_table(results):
        print(line)
    if "hybrid" in results:
        h = results["hybrid"]
        if "offload" in results and not (h.get("partial") or results["offload"].get("partial")):
            o = results["offload"]
            print(f"hybrid vs offload: decode @1 {h['decode_tok_s_1'] / o['decode_tok_s_1']:.1f}x, "
                  f"TTFT 8K {o['ttft_8192_s'] / h['ttft_8192_s']:.1f}x better")
        if "stock" in results and "weights_gib" in h and "weights_gib" in results["stock"]:
            saved = results["stock"]["weights_gib"] - h["weights_gib"]
            experts_gib = info.expert_bytes / 2**30
            print(f"GPU weight memory: hybrid {h['weights_gib']:.2f} GiB vs stock {results['stock']['weights_gib']:.2f} GiB: "
                  f"{saved:.2f} GiB less; the routed experts are {experts_gib:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
