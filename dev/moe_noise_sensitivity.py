#!/usr/bin/env python3
"""How far a tiny checkpoint's logprobs move when its MoE outputs carry kernel-sized rounding: the fp32 model of the
e2e oracle (tests/e2e/oracle.py, transformers), Gaussian noise of relative RMS --rel added to every MoE block's routed
output, the top-5 |dlogprob| per position (the e2e criterion's measure) against the noiseless forward. The e2e suite
compares engine and vLLM kernels whose layer outputs differ by ~0.2-0.3% (rel. RMS against fp32 ~0.0023 each): a
checkpoint that moves several times further than the others fails that suite on rounding alone.

    python dev/moe_noise_sensitivity.py --arch minimax_m3 qwen3_moe --rel 0.003
    python dev/moe_noise_sensitivity.py --arch minimax_m3 --norms 1     # every norm weight set to 1 first
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sensitivity(model_dir: str, rel: float, prompts: int = 4, length: int = 200, draws: int = 3):
    """(MoE blocks hooked, median, 90th percentile of the per-position top-5 |dlogprob|, median top-1 probability)."""
    from tests.e2e.oracle import _load
    model = _load(model_dir, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(1)
    noisy = [False]

    def add_noise(module, args, out):
        return out + rel * out.std() * torch.randn(out.shape, generator=gen) if noisy[0] else out
    blocks = [m.experts for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock")]
    for experts in blocks:
        experts.register_forward_hook(add_noise)
    rng = random.Random(0)
    diffs, top1 = [], []
    with torch.no_grad():
        for _ in range(prompts):
            ids = torch.tensor([[rng.randrange(3, 2000) for _ in range(length)]])
            noisy[0] = False
            ref = model(ids).logits[0].log_softmax(-1)
            top = ref.topk(5, dim=-1).indices
            top1.append(ref.exp().max(-1).values.median().item())
            noisy[0] = True
            for _ in range(draws):
                lp = model(ids).logits[0].log_softmax(-1)
                diffs += (ref.gather(1, top) - lp.gather(1, top)).abs().max(-1).values.tolist()
    diffs.sort()
    return len(blocks), diffs[len(diffs) // 2], diffs[int(0.9 * len(diffs))], sorted(top1)[len(top1) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", default=["minimax_m3"], help="tools/make_tiny_checkpoint.py architectures")
    ap.add_argument("--rel", type=float, nargs="+", default=[0.003])
    ap.add_argument("--norms", type=float, default=None, help="set every *norm.weight to this value first")
    a = ap.parse_args()
    from safetensors.torch import load_file, save_file

    from lvllm.testing.tiny_checkpoint import make_checkpoint
    with tempfile.TemporaryDirectory() as root:
        for arch in a.arch:
            d = make_checkpoint(arch, os.path.join(root, arch))
            if a.norms is not None:
                t = load_file(f"{d}/model.safetensors")
                t = {k: (torch.full_like(v, a.norms) if k.endswith("norm.weight") else v) for k, v in t.items()}
                save_file(t, f"{d}/model.safetensors", metadata={"format": "pt"})
            for rel in a.rel:
                n, med, p90, top1 = sensitivity(d, rel)
                print(f"{arch}{f' (norms {a.norms:g})' if a.norms is not None else ''}: noise {rel:g} in {n} MoE blocks: "
                      f"|dlogprob| median {med:.4f} p90 {p90:.4f}; top-1 probability median {top1:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
