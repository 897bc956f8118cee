#!/usr/bin/env python3
"""One vLLM run that records what its MoE layers compute, for the MoE-layer oracle (tests/e2e/moe_oracle.py).

Why: on a model transformers lacks (DeepSeek-V4.1) the e2e comparison has no fp32 truth, only stock vLLM, and a
switch-on run whose experts round differently from stock's kernels (more exactly, or worse) moves its logprobs
through the routers either way. The experts themselves have a truth independent of both: the checkpoint's weights
in fp32 applied to the very inputs and routing each run's layers received. This run records those: for every routed
expert layer and prefill chunk of at least --min-rows rows, the layer's input rows, topk ids and weights and its
output (vLLM's RoutedExperts.forward_modular, where stock's kernels and lvllm's hybrid method alike are called).

Same settings as generate.py (the switch from the environment, the same scored prompts and token budget), but the
engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and eager (a captured graph replays without Python).

    python tests/e2e/moe_capture.py --model DIR --out run.pt [--prompts 2] [--calls 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def layer_index(layer_name: str):
    """The decoder layer of a RoutedExperts layer name (None for draft / MTP layers: the oracle's reference reads
    the target's layers)."""
    if "mtp" in layer_name.split("."):
        return None
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", layer_name)
    return int(m.group(1)) if m else None


def install(records: dict, min_rows: int, calls: int) -> None:
    """Wrap RoutedExperts.forward_modular: keep the first `calls` calls of >= min_rows rows per layer (host copies)."""
    import torch
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    inner = RoutedExperts.forward_modular

    def forward_modular(self, x, topk_weights, topk_ids, *args, **kwargs):
        out = inner(self, x, topk_weights, topk_ids, *args, **kwargs)
        idx = layer_index(self.layer_name)
        kept = records.setdefault(self.layer_name, [])
        if (idx is not None and x.shape[0] >= min_rows and len(kept) < calls and isinstance(out, torch.Tensor)
                and not torch.cuda.is_current_stream_capturing()):
            kept.append({"layer": idx, "x": x.detach().cpu(), "topk_ids": topk_ids.detach().cpu(),
                         "topk_weights": topk_weights.detach().float().cpu(), "out": out.detach().cpu()})
        return out

    RoutedExperts.forward_modular = forward_modular


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=2, help="generate.py's scored prompts (seed 1, 600 tokens) to run")
    ap.add_argument("--calls", type=int, default=2, help="prefill chunks kept per layer")
    ap.add_argument("--min-rows", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--gpu-util", type=float, default=0.30)
    ap.add_argument("--kv-bytes", type=int, default=0)
    a = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the layers run in this process, where the wrapper is
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tests.e2e.generate import prompts, special_token_ids

    records: dict = {}
    install(records, a.min_rows, a.calls)
    with open(os.path.join(a.model, "tokenizer.json")) as f:
        vocab = len(json.load(f)["model"]["vocab"])
    mem_args = ({"kv_cache_memory_bytes": a.kv_bytes, "gpu_memory_utilization": 0.05} if a.kv_bytes
                else {"gpu_memory_utilization": a.gpu_util})
    t0 = time.time()
    print(f"[moe_capture] {a.model}: starting vLLM in this process (eager)", flush=True)
    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=2048, max_num_seqs=4,
              max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=True, seed=0, enforce_eager=True,
              **mem_args)
    startup_s = time.time() - t0
    records.clear()  # the memory profile's dummy batch is no prompt
    sps = prompts(vocab, [600] * a.prompts, seed=1, avoid=special_token_ids(a.model))  # generate.py's scored ones
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in sps], SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False)
    env = {k: v for k, v in os.environ.items() if k.startswith(("LVLLM_", "LK_"))}
    torch.save({"model": os.path.abspath(a.model), "env": env, "layers": records}, a.out)
    n = sum(len(v) for v in records.values())
    print(f"[moe_capture] {a.model}: startup {startup_s:.1f}s, {n} calls of {len(records)} layers -> {a.out}",
          flush=True)
    return 0 if n else 1


if __name__ == "__main__":
    raise SystemExit(main())
