"""One MoE layer's experts in every expert format of lk_moe.formats: fp32 weights w13 [E, 2I, H]
(rows [gate; up]) and w2 [E, H, I] -> the tensors vLLM's MoE method holds after loading (the
format row's names and layouts) and the fp32 weights they encode (lk_moe.reference's
dequantizers), for the tests that walk the format table. A new row needs its entry in QUANTIZE."""
from __future__ import annotations

import torch

from lk_moe import formats
from lk_moe.reference import (dequantize_fp8_block, dequantize_mxfp4, dequantize_mxfp8, dequantize_nvfp4_experts,
                              dequantize_per_channel, dequantize_wna16_int4)

from .quantizers import (pack_int4, quantize_fp8_block, quantize_int4, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4,
                         quantize_w8a8_channel)


def _bf16(w13, w2, optional):
    t = dict(w13_weight=w13.bfloat16(), w2_weight=w2.bfloat16())
    return t, t["w13_weight"].float(), t["w2_weight"].float()


def _fp8_block(w13, w2, optional):
    (q13, s13), (q2, s2) = quantize_fp8_block(w13), quantize_fp8_block(w2)
    t = dict(w13_weight=q13, w2_weight=q2, w13_weight_scale_inv=s13, w2_weight_scale_inv=s2)
    return t, dequantize_fp8_block(q13, s13, (128, 128)), dequantize_fp8_block(q2, s2, (128, 128))


def _channel(fmt):
    def build(w13, w2, optional):
        # vLLM holds the per-channel scales as fp32 [E, N, 1]
        (q13, s13), (q2, s2) = (quantize_w8a8_channel(w, fmt, scale_dtype=torch.float32) for w in (w13, w2))
        t = dict(w13_weight=q13, w2_weight=q2, w13_weight_scale=s13, w2_weight_scale=s2)
        return t, dequantize_per_channel(q13, s13), dequantize_per_channel(q2, s2)
    return build


def _wna16_int4(w13, w2, optional, group=32):
    # optional: asymmetric groups with zero points. vLLM's hand-over to the engine is K-first
    # (packed [E, K/8, N], scales [E, K/gs, N], zero points packed along N [E, K/gs, N/8]).
    t = {}
    for p, w in (("w13", w13), ("w2", w2)):
        q, scale, zp = quantize_int4(w, group, asym=optional)
        t[f"{p}_weight_packed"] = pack_int4(q + 8).transpose(1, 2).contiguous()
        t[f"{p}_weight_scale"] = scale.transpose(1, 2).contiguous()
        if optional:
            t[f"{p}_weight_zero_point"] = pack_int4((zp + 8).transpose(1, 2)).contiguous()
    d13, d2 = (dequantize_wna16_int4(t[f"{p}_weight_packed"], t[f"{p}_weight_scale"], t.get(f"{p}_weight_zero_point"))
               for p in ("w13", "w2"))
    return t, d13, d2


def _mxfp4(w13, w2, optional):
    # optional: gpt-oss's bf16 biases w13_bias [E, 2I] (in w13's row order), w2_bias [E, H].
    (b13, s13), (b2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    t = dict(w13_weight=b13.flatten(-2), w2_weight=b2.flatten(-2), w13_weight_scale=s13, w2_weight_scale=s2)
    if optional:
        g = torch.Generator().manual_seed(w13.shape[1])
        t.update(w13_bias=(0.5 * torch.randn(w13.shape[:2], generator=g)).bfloat16(),
                 w2_bias=(0.1 * torch.randn(w2.shape[:2], generator=g)).bfloat16())
    return t, dequantize_mxfp4(t["w13_weight"], s13), dequantize_mxfp4(t["w2_weight"], s2)


def _nvfp4(w13, w2, optional):
    # Per expert projection one global scale (gate and up each their own: weight_scale_2 [E, 2]);
    # optional: the activation scales (checked, then ignored by the engine).
    I = w13.shape[1] // 2
    parts13 = [[quantize_nvfp4(w13[e, :I]), quantize_nvfp4(w13[e, I:])] for e in range(w13.shape[0])]
    parts2 = [quantize_nvfp4(w2[e]) for e in range(w2.shape[0])]
    t = dict(w13_weight=torch.stack([torch.cat([g[0], u[0]]) for g, u in parts13]),
             w2_weight=torch.stack([p[0] for p in parts2]),
             w13_weight_scale=torch.stack([torch.cat([g[1], u[1]]) for g, u in parts13]),
             w2_weight_scale=torch.stack([p[1] for p in parts2]),
             w13_weight_scale_2=torch.stack([torch.stack([g[2], u[2]]) for g, u in parts13]),
             w2_weight_scale_2=torch.stack([p[2] for p in parts2]))
    if optional:
        E = w13.shape[0]
        t.update(w13_input_scale=torch.full((E, 2), 1e-3), w2_input_scale=torch.full((E,), 1e-3))
    return (t, *dequantize_nvfp4_experts(t))


def _mxfp8(w13, w2, optional):
    (q13, s13), (q2, s2) = quantize_mxfp8(w13), quantize_mxfp8(w2)
    t = dict(w13_weight=q13, w2_weight=q2, w13_weight_scale=s13, w2_weight_scale=s2)
    return t, dequantize_mxfp8(q13, s13), dequantize_mxfp8(q2, s2)


QUANTIZE = {"bf16": _bf16, "fp8_block": _fp8_block, "fp8_channel": _channel("fp8_channel"),
            "int8_channel": _channel("int8_channel"), "wna16_int4": _wna16_int4, "mxfp4": _mxfp4,
            "nvfp4": _nvfp4, "mxfp8": _mxfp8}


def quantize_experts(fmt: str, w13: torch.Tensor, w2: torch.Tensor, optional: bool = False):
    """(tensors, d13, d2): vLLM's tensors of `fmt` (with the row's optional tensors when `optional`)
    and the fp32 weights they encode, [E, 2I, H] / [E, H, I] in w13's row order."""
    row = formats.get(fmt)
    tensors, d13, d2 = QUANTIZE[fmt](w13.float(), w2.float(), optional and bool(row.optional))
    return tensors, d13, d2
