"""Routed experts on the GPU from plain (unpacked, padded) matrices: per-expert GEMMs in bf16
with fp32 accumulation of the weighted sum. Used by the streamed prefill path and by
GPU-resident layers; vLLM's fused-MoE kernel can take its place behind the same call."""
from __future__ import annotations

import torch

from .reference import ACTIVATIONS, gate_activation


_OUT_DTYPE_OK = True


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 -> fp32 without rounding the product to bf16 (cuBLAS with an fp32 output on
    CUDA; plain fp32 math elsewhere, where this path only runs in tests)."""
    global _OUT_DTYPE_OK
    if a.is_cuda and _OUT_DTYPE_OK:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except (RuntimeError, TypeError):  # older cuBLAS/torch without bf16->fp32 mm
            _OUT_DTYPE_OK = False
    return a.float() @ b.float()


class RoutedBatch:
    """The batch's (token, slot) pairs grouped by expert, computed once per forward."""

    def __init__(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int):
        flat = topk_ids.reshape(-1).long()
        valid = flat >= 0
        order = torch.argsort(torch.where(valid, flat, num_experts), stable=True)
        k = topk_ids.shape[1]
        self.tokens = (order // k)
        self.weights = topk_weights.reshape(-1)[order].float()
        counts = torch.bincount(flat[valid], minlength=num_experts)
        bad = ((flat < -1) | (flat >= num_experts)).sum().view(1)
        # One host sync per forward: the per-expert loop needs the counts (eager prefill only).
        fetched = torch.cat([counts, bad]).tolist()
        if fetched[-1]:
            raise ValueError(f"topk_ids holds {fetched[-1]} expert id(s) outside 0..{num_experts - 1} (or -1)")
        self.counts = fetched[:num_experts]
        self.offsets = [0]
        for c in self.counts:
            self.offsets.append(self.offsets[-1] + c)

    def routed_experts(self):
        return [e for e, c in enumerate(self.counts) if c]


def experts_forward(x_pad: torch.Tensor, batch: RoutedBatch, w13: torch.Tensor, w2: torch.Tensor,
                    first_expert: int, out_acc: torch.Tensor, expert_ids=None, *, biases=None,
                    activation: str = "silu", swiglu=(1.702, 7.0)) -> None:
    """Add sum_k w * (down(act(gate x + b_gate, up x + b_up)) + b_down) for experts first_expert.. (or
    expert_ids, with w13/w2 indexed by position in that list) into out_acc [M, h_pad] fp32.
    w13: [n, 2*kp2, kp1], w2: [n, h_pad, kp2], x_pad: [M, kp1]; biases: None or (b13 [n, 2*kp2],
    b2 [n, h_pad]) bf16 (mxfp4, as the engine holds them); act: lk_moe.reference.gate_activation
    ("silu", "silu_clamp", "situ" or "swigluoai", with swiglu = the engine's two constants: (alpha, limit),
    situ's (beta, linear_beta))."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    kp2 = w2.shape[2]
    ids = expert_ids if expert_ids is not None else range(first_expert, first_expert + w13.shape[0])
    for j, e in enumerate(ids):
        n = batch.counts[e]
        if n == 0:
            continue
        lo, hi = batch.offsets[e], batch.offsets[e + 1]
        rows = batch.tokens[lo:hi]
        # Same roundings as the CPU engine: fp32 pre-activations (+ bias), activation output in bf16,
        # fp32 sums; the down bias is part of the expert output the router weight scales.
        h = _mm_f32(x_pad.index_select(0, rows), w13[j].t())
        if biases is not None:
            h += biases[0][j].float()
        gate, up = h[:, :kp2], h[:, kp2:]
        act = gate_activation(activation, gate, up, *swiglu)
        y = _mm_f32(act.to(x_pad.dtype), w2[j].t())
        if biases is not None:
            y += biases[1][j].float()
        out_acc.index_add_(0, rows, y * batch.weights[lo:hi, None])
