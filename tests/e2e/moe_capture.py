#!/usr/bin/env python3
"""One vLLM run that records what its MoE layers compute, for the MoE-layer oracle (tests/e2e/moe_oracle.py).

Why: on a model transformers lacks (DeepSeek-V4.1) the e2e comparison has no fp32 truth, only stock vLLM, and a
switch-on run whose experts round differently from stock's kernels (more exactly, or worse) moves its logprobs
through the routers either way. The experts themselves have a truth independent of both: the checkpoint's weights
in fp32 applied to the very inputs and routing each run's layers received. This run records those
(lvllm.testing.moe_capture, in vLLM's worker: LVLLM_TEST_MOE_CAPTURE) for generate.py's scored prompts, with the
switch as the environment sets it and generate.py's settings, but eager (a captured graph replays without Python).
What startup computed (the memory profile's dummy batch, warmups) is dropped; the rest becomes one file.

    python tests/e2e/moe_capture.py --model DIR --out run.pt [--prompts 2] [--calls 2]
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def gather(directory: str, calls: int) -> dict:
    """The recorded calls in the order they ran (per process), at most `calls` per layer: {layer name: [call]}."""
    import torch
    layers: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.pt"))):
        rec = torch.load(path, weights_only=False)
        kept = layers.setdefault(rec.pop("layer_name"), [])
        if len(kept) < calls:
            kept.append(rec)
    return layers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=2, help="generate.py's scored prompts (seed 1, 600 tokens) to run")
    ap.add_argument("--calls", type=int, default=2, help="prefill chunks kept per layer")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--gpu-util", type=float, default=0.30)
    ap.add_argument("--kv-bytes", type=int, default=0)
    ap.add_argument("--language-model-only", action="store_true", help="as generate.py's")
    a = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="moe-capture-")
    os.environ["LVLLM_TEST_MOE_CAPTURE"] = directory  # before vLLM starts its processes: they load the plugin
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tests.e2e.generate import memory_args, prompts, shut_down, special_token_ids, vocab_size

    vocab = vocab_size(a.model)
    mem_args = memory_args(a.kv_bytes, a.gpu_util)
    if a.language_model_only:
        mem_args["language_model_only"] = True
    t0 = time.time()
    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=2048, max_num_seqs=4,
              max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=True, seed=0, enforce_eager=True,
              **mem_args)
    startup_s = time.time() - t0
    for path in glob.glob(os.path.join(directory, "*.pt")):  # startup's batches are no prompt
        os.remove(path)
    sps = prompts(vocab, [600] * a.prompts, seed=1, avoid=special_token_ids(a.model))  # generate.py's scored ones
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in sps], SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False)
    layers = gather(directory, a.calls)
    env = {k: v for k, v in os.environ.items() if k.startswith(("LVLLM_", "LK_"))}
    torch.save({"model": os.path.abspath(a.model), "env": env, "layers": layers}, a.out)
    n = sum(len(v) for v in layers.values())
    print(f"[moe_capture] {a.model}: startup {startup_s:.1f}s, {n} calls of {len(layers)} layers -> {a.out}",
          flush=True)
    print(f"[moe_capture] {shut_down(llm)}", flush=True)
    return 0 if n else 1


if __name__ == "__main__":
    raise SystemExit(main())
