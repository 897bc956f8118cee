#!/usr/bin/env python3
"""One vLLM run for the e2e tests: greedy generation with top-5 logprobs, written as JSON.

The switch settings come from the environment (the test sets LVLLM_* per run), so each run is
its own process, exactly as a user would start vLLM. Prompts are token ids (seeded), long enough
that routing reaches every expert; run twice over the same prompts to exercise prefix caching,
with several requests in flight (batched decode) and a small token budget (chunked prefill).
Then scores other prompts with prompt_logprobs (top-5 at every position) for the teacher-forced
check against fp32 (tests/e2e/compare.py).

    python tests/e2e/generate.py --model DIR --out run.json [--tp 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time

from lvllm.testing.spec_decode import repeated, spec_counters


def special_token_ids(model_dir: str) -> set:
    """The ids of the tokenizer's added tokens (end of text, chat and media markers): text never holds
    them, and a media placeholder without its media is read differently by vLLM and transformers (Kimi-K2.5's
    video placeholder in a scored prompt moved the fp32 truth by up to 12 nats from there on, H200, 2026-12-03)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        return {0, 1, 2}
    with open(path) as f:
        return {t["id"] for t in json.load(f).get("added_tokens", [])} | {0, 1, 2}


def prompts(vocab: int, lengths, seed: int = 0, avoid=frozenset({0, 1, 2}), period: int = 0):
    """Seeded random token ids of the text vocabulary (none of `avoid`); period > 0: each prompt repeats a random run
    of that many tokens (n-gram drafts then find matches)."""
    import random
    rng = random.Random(seed)
    ids = [i for i in range(vocab) if i not in avoid]
    out = []
    for n in lengths:
        run = [rng.choice(ids) for _ in range(period or n)]
        out.append(repeated(run, n))
    return out


def gpu_memory_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return [int(x) for x in out.split()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


# vLLM 0.33's front-end daemon threads (v1/engine/core_client.py) that shut_down lets end
FRONT_END_THREADS = ("EngineCoreOutputQueueThread", "MPClientEngineMonitor")


def shut_down(llm) -> str:
    """vLLM 0.33's LLM has no shutdown(): its engine goes down in finalizers at interpreter exit while
    the front end's daemon threads (engine monitor, output queue) still run, and one that resumes
    during finalization can abort the process. On the loaded H200 machine, 2026-12-01, 2 of 29
    switch-on front ends (no lk_moe code in them; 0 of 21 switch-off or stock ones) died so after
    writing their results ("terminate called without an active exception"; "PyEval_SaveThread ...
    finalizing"). Shut the engine down and let those threads end while Python is whole. Returns
    what was done, for the log."""
    t0 = time.time()
    llm.llm_engine.engine_core.shutdown()
    left = []
    for t in threading.enumerate():
        if t.name in FRONT_END_THREADS:
            t.join(timeout=10)
            if t.is_alive():
                left.append(t.name)
    return f"engine shut down in {time.time() - t0:.1f}s" + (f", still running: {left}" if left else "")


def vocab_size(model_dir: str) -> int:
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        return len(json.load(f)["model"]["vocab"])


def memory_args(kv_bytes: int, gpu_util: float) -> dict:
    """LLM()'s memory arguments: a fixed KV-cache size (kv_bytes > 0), else a share of the GPU. With a fixed KV size
    vLLM (0.26 seen; 0.33 has the same check) still checks at start-up that free memory >= utilization x total
    (default 0.92): runs sharing a GPU failed that check on 2026-12-01 (14 at a time). A low value keeps the check
    meaningful (7 GiB free) without touching the sizing, which the fixed bytes decide."""
    return ({"kv_cache_memory_bytes": kv_bytes, "gpu_memory_utilization": 0.05} if kv_bytes
            else {"gpu_memory_utilization": gpu_util})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lengths", default="300,700,45,500,120,200,64,400")
    ap.add_argument("--score-lengths", default="600,600,600,600,600,600",
                    help="prompts (seed 1) scored with prompt_logprobs for the teacher-forced check "
                         "(tests/e2e/compare.py); empty: none")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--gpu-util", type=float, default=0.30)
    ap.add_argument("--kv-bytes", type=int, default=0,
                    help="fixed KV-cache bytes (skips vLLM's memory sizing: for runs that share the GPU)")
    ap.add_argument("--implicit-exit", action="store_true",
                    help="leave the engine to vLLM's exit-time finalizers, as a plain LLM() script does "
                         "(dev/exit_check.sh measures that path)")
    ap.add_argument("--speculative-config", default="",
                    help="JSON for LLM(speculative_config=...), "
                         "e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'")
    ap.add_argument("--language-model-only", action="store_true",
                    help="vLLM's --language-model-only: a vision-language release's text model alone (checkpoints "
                         "written without the vision tower's weights)")
    ap.add_argument("--prompt-period", type=int, default=0,
                    help="the generated prompts repeat a random run of this many tokens (n-gram drafts find matches)")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = vocab_size(a.model)
    t0 = time.time()
    mem_args = memory_args(a.kv_bytes, a.gpu_util)
    extra = {}
    if a.tp > 1:
        # vLLM (0.26 seen, 0.33 has the same pass) fuses all-reduce + RMSNorm through FlashInfer and picks its "mnnvl" backend,
        # which wants NVLink multicast. The GPU machine keeps multicast off (it can take shared
        # GPUs down); there the TP=2 run died with illegal memory accesses. The fusion is a speed
        # pass only: the all-reduce stays NCCL/custom all-reduce, the math the same.
        extra["compilation_config"] = {"pass_config": {"fuse_allreduce_rms": False}}
    if a.language_model_only:
        extra["language_model_only"] = True
    if a.speculative_config:
        extra.update(speculative_config=json.loads(a.speculative_config), disable_log_stats=False)  # its counters
    llm = LLM(model=a.model, dtype="bfloat16", tensor_parallel_size=a.tp, max_model_len=2048,
              max_num_seqs=4, max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=True,
              seed=0, **mem_args, **extra)
    startup_s = time.time() - t0
    mem = gpu_memory_used_mib()
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, logprobs=5, ignore_eos=True)
    avoid = special_token_ids(a.model)
    ps = [TokensPrompt(prompt_token_ids=p)
          for p in prompts(vocab, [int(x) for x in a.lengths.split(",")], avoid=avoid, period=a.prompt_period)]
    runs = []
    for _ in range(2):  # the second pass hits the prefix cache
        outs = llm.generate(ps, sp, use_tqdm=False)
        runs.append([{
            "tokens": list(o.outputs[0].token_ids),
            "logprobs": [{str(t): lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs],
        } for o in outs])
    scored = []
    if a.score_lengths:
        # Teacher-forced: every position predicted from the same context in every run, so a flip
        # does not end the comparison (prefill path: CPU chunks, or GPU ones from the threshold up).
        sp_score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=5)
        sps = prompts(vocab, [int(x) for x in a.score_lengths.split(",")], seed=1, avoid=avoid)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in sps], sp_score, use_tqdm=False)
        for p, o in zip(sps, outs):
            top = [{str(t): lp.logprob for t, lp in pos.items() if lp.rank is not None and lp.rank <= 5}
                   for pos in o.prompt_logprobs[1:]]  # position 0 has no prediction
            scored.append({"tokens": p, "top": top})
    cache = llm.llm_engine.vllm_config.cache_config
    result = {
        "model": os.path.abspath(a.model),
        "prompts": [p["prompt_token_ids"] for p in ps],  # for the fp32 oracle (tests/e2e/oracle.py)
        "env": {k: v for k, v in os.environ.items() if k.startswith(("LVLLM_", "LK_", "VLLM_PLUGINS"))},
        "startup_s": startup_s,
        "gpu_memory_used_mib": mem,
        "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
        "block_size": getattr(cache, "block_size", None),
        "runs": runs,
        "scored": scored,
        "spec_counters": spec_counters(llm) if a.speculative_config else None,
    }
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(f"[generate] pid {os.getpid()} {a.model}: startup {startup_s:.1f}s, gpu blocks {result['num_gpu_blocks']}, "
          f"GPU memory used {mem} MiB, first tokens {runs[0][0]['tokens'][:8]}", flush=True)
    if not a.implicit_exit:
        print(f"[generate] {shut_down(llm)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
