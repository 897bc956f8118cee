"""Plain-torch versions of the layer: an fp32 reference for tests and a bf16 baseline for benchmarks."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_reference(x, w13, w2, topk_ids, topk_weights, return_magnitude=False):
    """fp32 math on the given (bf16/fp16) values; returns fp32 [M, H].

    With return_magnitude, also returns sum_k |w_k| * |w2_e| @ |act_e|: the scale that rounding
    the activation perturbs each output by (used for rigorous error bounds)."""
    M, H = x.shape
    I = w2.shape[2]
    out = torch.zeros(M, H, dtype=torch.float32, device=x.device)
    mag = torch.zeros(M, H, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:
            continue
        tok, k = torch.nonzero(topk_ids == e, as_tuple=True)
        w = w13[e].float()
        h = xf[tok] @ w.t()
        act = F.silu(h[:, :I]) * h[:, I:]
        w2e = w2[e].float()
        y = act @ w2e.t()
        rw = topk_weights[tok, k].unsqueeze(1)
        out.index_add_(0, tok, y * rw)
        if return_magnitude:
            mag.index_add_(0, tok, (act.abs() @ w2e.abs().t()) * rw.abs())
    return (out, mag) if return_magnitude else out


def moe_torch_baseline(x, w13, w2, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch: per-expert GEMMs in the weights' dtype, fp32 sum."""
    M, H = x.shape
    I = w2.shape[2]
    out = torch.zeros(M, H, dtype=torch.float32)
    flat = topk_ids.flatten()
    order = torch.argsort(flat)
    counts = torch.bincount(flat[flat >= 0], minlength=w13.shape[0]).tolist()
    start = int((flat < 0).sum())
    tok_all = order // topk_ids.shape[1]
    w_all = topk_weights.flatten()[order]
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tok = tok_all[start:start + n]
        h = F.linear(x[tok], w13[e])
        act = F.silu(h[:, :I]) * h[:, I:]
        y = F.linear(act, w2[e])
        out.index_add_(0, tok, y.float() * w_all[start:start + n].unsqueeze(1))
        start += n
    return out.to(x.dtype)


def random_routing(M: int, E: int, K: int, generator=None):
    """Distinct experts per token, softmax-like positive weights (as a router would give)."""
    scores = torch.rand(M, E, generator=generator)
    w, ids = torch.topk(scores, K, dim=1)
    w = w / w.sum(dim=1, keepdim=True)
    return ids.to(torch.int32).contiguous(), w.float().contiguous()


def dequantize_fp8_block(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """[E, R, C] float8_e4m3fn and [E, ceil(R/bn), ceil(C/bk)] fp32 scales -> fp32 [E, R, C]."""
    E, R, C = q.shape
    bn, bk = -(-R // scale_inv.shape[1]), -(-C // scale_inv.shape[2])
    s = scale_inv.repeat_interleave(bn, dim=1)[:, :R].repeat_interleave(bk, dim=2)[:, :, :C]
    return q.float() * s


def moe_torch_baseline_fp8(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for fp8_block experts: dequantize each routed expert to the
    activations' dtype, then the bf16 baseline's GEMMs."""
    q13, q2 = tensors["w13_weight"], tensors["w2_weight"]
    s13, s2 = tensors["w13_weight_scale_inv"], tensors["w2_weight_scale_inv"]
    M, H = x.shape
    I = q2.shape[2]
    out = torch.zeros(M, H, dtype=torch.float32)
    for e in torch.unique(topk_ids).tolist():
        if e < 0:
            continue
        tok, k = torch.nonzero(topk_ids == e, as_tuple=True)
        w13 = dequantize_fp8_block(q13[e:e + 1], s13[e:e + 1])[0].to(x.dtype)
        w2 = dequantize_fp8_block(q2[e:e + 1], s2[e:e + 1])[0].to(x.dtype)
        h = F.linear(x[tok], w13)
        act = F.silu(h[:, :I]) * h[:, I:]
        out.index_add_(0, tok, F.linear(act, w2).float() * topk_weights[tok, k].unsqueeze(1))
    return out.to(x.dtype)
