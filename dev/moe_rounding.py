"""How far the CPU engine and vLLM's Triton fused MoE each round away from exact math, on one MoE layer of a tiny
DeepSeek-V4.1 checkpoint (bf16 experts, clamped SwiGLU). Why: switch-on runs with CPU prefill sit further from stock
vLLM than GPU-prefill runs on that model (H100, 2026-12-07); this tells whose rounding the distance is.

    python tools/make_tiny_checkpoint.py --arch deepseek_v41 --out /tmp/tiny-v41
    python dev/moe_rounding.py /tmp/tiny-v41 [--layer 1]

Truth: fp64 over the same bf16 weights and inputs. The Triton emulation (lk_moe.reference.moe_like_triton) rounds
where vLLM 0.33's TritonExperts stores: the gate/up GEMM output, the activation and each expert's weighted output in
bf16, then the top-k sum in fp32 (or bf16, as a bf16 accumulator would)."""
import argparse

import torch

from lk_moe.layer import MoELayer
from lk_moe.reference import moe_like_triton, silu_clamp
from lvllm.testing.expert_reference import reference_layer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--rows", type=int, default=512)
    a = ap.parse_args()
    ref = reference_layer(a.checkpoint, "deepseek_v41", "bf16", a.layer)  # fp32 of the files' bf16: exact
    w13, w2, limit = ref["w13"].bfloat16(), ref["w2"].bfloat16(), ref["swiglu_limit"]
    E, I = w13.shape[0], w2.shape[2]
    g = torch.Generator().manual_seed(0)
    engine = MoELayer(w13, w2, "silu_clamp", swiglu_limit=limit)
    for x_std in (1.0, 4.0, 16.0):
        x = (torch.randn(a.rows, w13.shape[2], generator=g) * x_std).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:a.top_k] for _ in range(a.rows)]).int()
        wt = torch.rand(a.rows, a.top_k, generator=g) + 0.1
        wt = (wt / wt.sum(1, keepdim=True)).float()
        truth = torch.zeros(a.rows, w13.shape[2], dtype=torch.float64)
        for k in range(a.top_k):
            e = ids[:, k].long()
            h = torch.einsum("mh,mnh->mn", x.double(), w13[e].double())
            act = silu_clamp(h[:, :I], h[:, I:], limit)
            truth += torch.einsum("mi,mhi->mh", act, w2[e].double()) * wt[:, k:k + 1].double()
        like = dict(activation="silu_clamp", swiglu_limit=limit)
        tri32 = moe_like_triton(x, w13, w2, ids, wt, **like)
        tri16 = moe_like_triton(x, w13, w2, ids, wt, bf16_sum=True, **like)
        out = engine.forward(x, ids, wt).double()
        rms = truth.pow(2).mean().sqrt()

        def err(o, ref=truth):
            return float((o.double() - ref).pow(2).mean().sqrt() / rms)
        print(f"x std {x_std:4}: relative RMS error vs fp64: engine {err(out):.5f}; "
              f"Triton-like {err(tri32):.5f} (fp32 top-k sum), {err(tri16):.5f} (bf16 top-k sum); "
              f"exact math rounded to bf16 {err(truth.bfloat16()):.5f}; engine vs Triton-like "
              f"{err(out, tri32.double()):.5f}")


if __name__ == "__main__":
    main()
