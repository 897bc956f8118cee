"""How far the CPU engine and vLLM's Triton fused MoE each round away from exact math, on one MoE layer of a tiny
DeepSeek-V4.1 checkpoint (bf16 experts, clamped SwiGLU). Why: switch-on runs with CPU prefill sit further from stock
vLLM than GPU-prefill runs on that model (H100, 2026-12-07); this tells whose rounding the distance is.

    python tools/make_tiny_checkpoint.py --arch deepseek_v41 --out /tmp/tiny-v41
    python dev/moe_rounding.py /tmp/tiny-v41 [--layer 1]

Truth: fp64 over the same bf16 weights and inputs. The Triton emulation rounds where vLLM 0.33's TritonExperts
stores: the gate/up GEMM output (bf16), the activation (computed in fp32 from it, stored bf16), each expert's output
times its routing weight (bf16), then the top-k sum (fp32, or bf16 as a bf16 accumulator would)."""
import argparse
import glob

import torch
import torch.nn.functional as F
from safetensors import safe_open

from lk_moe.layer import MoELayer


def load_experts(ckpt: str, layer: int):
    w = {}
    prefix = f"layers.{layer}.ffn.experts."
    for f in glob.glob(f"{ckpt}/*.safetensors"):
        with safe_open(f, "pt") as s:
            w.update({k: s.get_tensor(k) for k in s.keys() if k.startswith(prefix)})
    n = len({k.split(".")[4] for k in w})
    stack = lambda name: torch.stack([w[f"{prefix}{e}.{name}.weight"] for e in range(n)])  # noqa: E731
    return torch.cat([stack("w1"), stack("w3")], 1).contiguous(), stack("w2").contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--limit", type=float, default=10.0, help="swiglu_limit (the tiny V4.1's)")
    ap.add_argument("--rows", type=int, default=512)
    a = ap.parse_args()
    w13, w2 = load_experts(a.checkpoint, a.layer)
    E, I = w13.shape[0], w2.shape[2]
    g = torch.Generator().manual_seed(0)

    def act(h):
        return F.silu(h[..., :I].clamp(max=a.limit)) * h[..., I:].clamp(-a.limit, a.limit)

    engine = MoELayer(w13, w2, "silu_clamp", swiglu_limit=a.limit)
    for x_std in (1.0, 4.0, 16.0):
        x = (torch.randn(a.rows, w13.shape[2], generator=g) * x_std).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:a.top_k] for _ in range(a.rows)]).int()
        wt = torch.rand(a.rows, a.top_k, generator=g) + 0.1
        wt = (wt / wt.sum(1, keepdim=True)).float()
        truth = torch.zeros(a.rows, w13.shape[2], dtype=torch.float64)
        tri32 = torch.zeros_like(truth, dtype=torch.float32)
        tri16 = torch.zeros_like(truth, dtype=torch.bfloat16)
        for k in range(a.top_k):
            e = ids[:, k].long()
            h = torch.einsum("mh,mnh->mn", x.double(), w13[e].double())
            truth += torch.einsum("mi,mhi->mh", act(h), w2[e].double()) * wt[:, k:k + 1].double()
            hb = torch.einsum("mh,mnh->mn", x.float(), w13[e].float()).bfloat16()
            yb = (torch.einsum("mi,mhi->mh", act(hb.float()).bfloat16().float(), w2[e].float())
                  * wt[:, k:k + 1]).bfloat16()
            tri32 += yb.float()
            tri16 = (tri16.float() + yb.float()).bfloat16()
        out = engine.forward(x, ids, wt).double()
        rms = truth.pow(2).mean().sqrt()

        def err(o, ref=truth):
            return float((o.double() - ref).pow(2).mean().sqrt() / rms)
        print(f"x std {x_std:4}: relative RMS error vs fp64: engine {err(out):.5f}; "
              f"Triton-like {err(tri32.bfloat16()):.5f} (fp32 top-k sum), {err(tri16):.5f} (bf16 top-k sum); "
              f"exact math rounded to bf16 "
              f"{err(truth.bfloat16()):.5f}; engine vs Triton-like {err(out, tri32.bfloat16().double()):.5f}")


if __name__ == "__main__":
    main()
