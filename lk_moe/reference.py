"""Plain-torch versions of the layer: an fp32 reference for tests and a bf16 baseline for benchmarks."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def swigluoai(gate, up, alpha=1.702, limit=7.0):
    """gpt-oss activation (vLLM SwigluOAIAndMul.forward_native), in the inputs' dtype:
    g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha * g)."""
    g = gate.clamp(max=limit)
    u = up.clamp(min=-limit, max=limit)
    return (u + 1) * g * torch.sigmoid(alpha * g)


def silu_clamp(gate, up, limit):
    """silu with vLLM's swiglu_limit (DeepSeek-V4; fused_moe/activation.py silu_and_mul_with_clamp):
    silu(min(gate, limit)) * clamp(up, -limit, limit)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def situ(gate, up, beta, linear_beta=0.0):
    """Kimi's SituGLU (vLLM's SituAndMul.forward_native): beta * tanh(gate / beta) * sigmoid(gate) * up', with
    up' = linear_beta * tanh(up / linear_beta), or up when linear_beta is unset (0 or None)."""
    g = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    return g * (linear_beta * torch.tanh(up / linear_beta) if linear_beta else up)


ACTIVATIONS = ("silu", "silu_clamp", "swigluoai", "situ")


def gate_activation(activation, gate, up, alpha=1.702, limit=7.0):
    """The experts' activation of the pre-activations gate and up, by name (ACTIVATIONS), with its two
    constants as the engine holds them (MoELayer._impl.swiglu): swigluoai's (alpha, limit), silu_clamp's
    limit, situ's (beta, linear_beta)."""
    if activation == "swigluoai":
        return swigluoai(gate, up, alpha, limit)
    if activation == "silu_clamp":
        return silu_clamp(gate, up, limit)
    if activation == "situ":
        return situ(gate, up, alpha, limit)
    if activation == "silu":
        return F.silu(gate) * up
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")


def routed_experts(topk_ids):
    """(expert, token rows, top-k slots) of every expert at least one token routes to; -1 ids skipped."""
    for e in torch.unique(topk_ids).tolist():
        if e >= 0:
            tok, k = torch.nonzero(topk_ids == e, as_tuple=True)
            yield e, tok, k


def _dequantizing_baseline(x, topk_ids, topk_weights, expert_weights) -> torch.Tensor:
    """What a user would write in torch for quantized silu experts: expert_weights(e) dequantizes
    one routed expert (w13 [2I, H], w2 [H, I]) to the activations' dtype, then GEMMs in that dtype,
    fp32 sum."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e, tok, k in routed_experts(topk_ids):
        w13, w2 = expert_weights(e)
        I = w2.shape[1]
        h = F.linear(x[tok], w13)
        act = F.silu(h[:, :I]) * h[:, I:]
        out.index_add_(0, tok, F.linear(act, w2).float() * topk_weights[tok, k].unsqueeze(1))
    return out.to(x.dtype)


def moe_reference(x, w13, w2, topk_ids, topk_weights, return_magnitude=False, *, activation="silu",
                  interleaved=False, w13_bias=None, w2_bias=None, swiglu_alpha=1.702, swiglu_limit=7.0,
                  situ_beta=None, situ_linear_beta=0.0, act_round=None):
    """fp32 math on the given (bf16/fp16) values; returns fp32 [M, H].

    activation "silu": silu(gate) * up; "silu_clamp": see `silu_clamp`; "swigluoai": see `swigluoai`
    (both clamp at swiglu_limit); "situ": see `situ` (situ_beta, situ_linear_beta). interleaved: w13 rows are
    gate_0, up_0, gate_1, ... (gpt-oss) instead of [gate; up]. Biases (optional, [E, 2I] in w13's row
    order and [E, H]): h = x w13^T + b13 before the activation, y = act w2^T + b2 scaled by the weight.

    With return_magnitude, also returns sum_k |w_k| * |w2_e| @ |act_e|: the scale that rounding
    the activation perturbs each output by (used for rigorous error bounds). act_round: a function
    applied to the activation before the down projection (a kernel's own rounding of it, emulated)."""
    M, H = x.shape
    I = w2.shape[2]
    out = torch.zeros(M, H, dtype=torch.float32, device=x.device)
    mag = torch.zeros(M, H, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e, tok, k in routed_experts(topk_ids):
        w = w13[e].float()
        h = xf[tok] @ w.t()
        if w13_bias is not None:
            h = h + w13_bias[e].float()
        gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else (h[:, :I], h[:, I:])
        act = (situ(gate, up, situ_beta, situ_linear_beta) if activation == "situ" else
               gate_activation(activation, gate, up, swiglu_alpha, swiglu_limit))
        if act_round is not None:
            act = act_round(act)
        w2e = w2[e].float()
        y = act @ w2e.t()
        if w2_bias is not None:
            y = y + w2_bias[e].float()
        rw = topk_weights[tok, k].unsqueeze(1)
        out.index_add_(0, tok, y * rw)
        if return_magnitude:
            mag.index_add_(0, tok, (act.abs() @ w2e.abs().t()) * rw.abs())
    return (out, mag) if return_magnitude else out


def moe_like_triton(x, w13, w2, topk_ids, topk_weights, *, activation="silu", swiglu_alpha=1.702, swiglu_limit=7.0,
                    bf16_sum=False) -> torch.Tensor:
    """vLLM's TritonExperts' roundings emulated (fp32 sums, stored where its kernels store): the gate/up GEMM output
    in bf16, the activation (computed in fp32 from it) in bf16, each expert's output times its routing weight in bf16,
    then the top-k sum in fp32 (bf16_sum: in bf16, as a bf16 accumulator would); returns bf16 [M, H]."""
    I = w2.shape[2]
    w13f, w2f = w13.float(), w2.float()
    out = torch.zeros(x.shape, dtype=torch.bfloat16 if bf16_sum else torch.float32)
    for k in range(topk_ids.shape[1]):
        e = topk_ids[:, k].long()
        h = torch.einsum("mh,mnh->mn", x.float(), w13f[e]).bfloat16().float()
        act = gate_activation(activation, h[:, :I], h[:, I:], swiglu_alpha, swiglu_limit).bfloat16().float()
        y = (torch.einsum("mi,mhi->mh", act, w2f[e]) * topk_weights[:, k:k + 1]).bfloat16()
        out = (out.float() + y.float()).bfloat16() if bf16_sum else out + y.float()
    return out.bfloat16()


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


def dequantize_fp8_block(q: torch.Tensor, scale_inv: torch.Tensor, block=None) -> torch.Tensor:
    """[E, R, C] float8_e4m3fn and [E, ceil(R/bn), ceil(C/bk)] fp32 scales -> fp32 [E, R, C]. block:
    (bn, bk); by default the smallest blocks that the scales' shape allows (not 128 where R or C is
    not a multiple of it: 576 rows in 5 blocks would read as blocks of 116)."""
    E, R, C = q.shape
    bn, bk = block or (-(-R // scale_inv.shape[1]), -(-C // scale_inv.shape[2]))
    s = scale_inv.repeat_interleave(bn, dim=1)[:, :R].repeat_interleave(bk, dim=2)[:, :, :C]
    return q.float() * s


def moe_torch_baseline_fp8(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for fp8_block experts: dequantize each routed expert to the
    activations' dtype, then the bf16 baseline's GEMMs."""
    q13, q2 = tensors["w13_weight"], tensors["w2_weight"]
    s13, s2 = tensors["w13_weight_scale_inv"], tensors["w2_weight_scale_inv"]
    return _dequantizing_baseline(x, topk_ids, topk_weights, lambda e: (
        dequantize_fp8_block(q13[e:e + 1], s13[e:e + 1])[0].to(x.dtype),
        dequantize_fp8_block(q2[e:e + 1], s2[e:e + 1])[0].to(x.dtype)))


def dequantize_per_channel(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8_channel / int8_channel: [E, R, C] float8_e4m3fn or int8 codes and fp32 scales per output
    row ([E, R, 1] or [E, R]) -> fp32 [E, R, C]."""
    return q.float() * scale.reshape(*q.shape[:2], 1).float()


def moe_torch_baseline_channel(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for per-channel fp8/int8 experts: dequantize each routed
    expert to the activations' dtype, then the bf16 baseline's GEMMs."""
    q13, q2 = tensors["w13_weight"], tensors["w2_weight"]
    s13, s2 = tensors["w13_weight_scale"], tensors["w2_weight_scale"]
    return _dequantizing_baseline(x, topk_ids, topk_weights, lambda e: (
        dequantize_per_channel(q13[e:e + 1], s13[e:e + 1])[0].to(x.dtype),
        dequantize_per_channel(q2[e:e + 1], s2[e:e + 1])[0].to(x.dtype)))


# ---------------------------------------------------------------- wna16_int4 (compressed-tensors int4)
# Convention (compressed-tensors pack_to_int32 / unpack_from_int32, vLLM's loader transposes to
# K-first): 8 unsigned 4-bit codes u = q + 8 per int32, code i in bits 4i..4i+3; weights packed
# along K, zero points along N; weight = (u - z) * scale with z = 8 when there is no zero point.

def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 tensor -> unsigned 4-bit codes (int32, 0..15), dimension `dim` 8x longer; code i of
    each word (bits 4i..4i+3) becomes element 8 * index + i."""
    dim = dim % packed.dim()
    shifts = (torch.arange(8, dtype=torch.int32) * 4).view([8 if d == dim + 1 else 1
                                                            for d in range(packed.dim() + 1)])
    codes = (packed.unsqueeze(dim + 1) >> shifts) & 15  # arithmetic shift, then the low 4 bits
    shape = list(packed.shape)
    shape[dim] *= 8
    return codes.reshape(shape)


def dequantize_wna16_int4(packed: torch.Tensor, scale: torch.Tensor, zero_point=None) -> torch.Tensor:
    """vLLM's K-first tensors of one projection -> fp32 weights [E, N, K] (vLLM's unquantized layout).

    packed int32 [E, K/8, N], scale [E, K/gs, N] (bf16/fp16), zero_point int32 [E, K/gs, ceil(N/8)]
    or None (symmetric: z = 8). The result (u - z) * scale is computed in fp32, hence exactly."""
    E, K8, N = packed.shape
    K = K8 * 8
    gs = K // scale.shape[1]
    u = unpack_int4(packed, 1)                                      # [E, K, N]
    if zero_point is None:
        z = torch.full((E, scale.shape[1], N), 8, dtype=torch.int32)
    else:
        z = unpack_int4(zero_point, 2)[:, :, :N]                    # [E, K/gs, N]
    w = (u - z.repeat_interleave(gs, dim=1)).float() * scale.float().repeat_interleave(gs, dim=1)
    return w.transpose(1, 2).contiguous()


def moe_torch_baseline_wna16(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for wna16_int4 experts: dequantize each routed expert to the
    activations' dtype, then the bf16 baseline's GEMMs."""
    z13, z2 = tensors.get("w13_weight_zero_point"), tensors.get("w2_weight_zero_point")

    def expert_weights(e):
        sl = slice(e, e + 1)
        w13 = dequantize_wna16_int4(tensors["w13_weight_packed"][sl], tensors["w13_weight_scale"][sl],
                                    None if z13 is None else z13[sl])[0].to(x.dtype)
        w2 = dequantize_wna16_int4(tensors["w2_weight_packed"][sl], tensors["w2_weight_scale"][sl],
                                   None if z2 is None else z2[sl])[0].to(x.dtype)
        return w13, w2
    return _dequantizing_baseline(x, topk_ids, topk_weights, expert_weights)


# ---------------------------------------------------------------- mxfp4 (OCP MX FP4, gpt-oss)
# Convention (vLLM 0.33.0, see csrc/cpu/moe_layer.h): uint8 rows of e2m1 code pairs, element 2i in the
# low nibble of byte i; code bit 3 = sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}; one e8m0 scale
# byte s per 32 consecutive inputs of a row, worth 2^(s - 127) (255 is NaN).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def dequantize_mxfp4(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """uint8 [..., N, K/2] and uint8 e8m0 [..., N, ceil(K/32)] -> fp32 [..., N, K] (exact)."""
    lo = (codes & 0x0F).long()
    hi = (codes >> 4).long()
    c = torch.stack((lo, hi), dim=-1).flatten(-2)  # element 2i: low nibble, 2i + 1: high nibble
    mag = torch.tensor(E2M1_VALUES, dtype=torch.float32)[c & 7]
    v = torch.where((c & 8) != 0, -mag, mag)
    s = scale.to(torch.int32)
    sf = torch.where(s == 255, torch.tensor(float("nan")), torch.exp2((s - 127).float()))
    K = v.shape[-1]
    return v * sf.repeat_interleave(32, dim=-1)[..., :K]


def dequantize_mxfp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [..., N, K] and uint8 e8m0 [..., N, ceil(K/32)] -> fp32 [..., N, K] (exact): code x 2^(s - 127),
    255 NaN (OCP MX FP8)."""
    s = scale.to(torch.int32)
    sf = torch.where(s == 255, torch.tensor(float("nan")), torch.exp2((s - 127).float()))
    return codes.float() * sf.repeat_interleave(32, dim=-1)[..., :codes.shape[-1]]


def moe_torch_baseline_mxfp8(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for mxfp8 experts: dequantize each routed expert to the activations' dtype,
    then the bf16 baseline's GEMMs."""
    q13, q2 = tensors["w13_weight"], tensors["w2_weight"]
    s13, s2 = tensors["w13_weight_scale"], tensors["w2_weight_scale"]
    return _dequantizing_baseline(x, topk_ids, topk_weights, lambda e: (
        dequantize_mxfp8(q13[e], s13[e]).to(x.dtype), dequantize_mxfp8(q2[e], s2[e]).to(x.dtype)))


def moe_torch_baseline_mxfp4(x, tensors, topk_ids, topk_weights, activation="swigluoai", interleaved=True,
                             swiglu_alpha=1.702, swiglu_limit=7.0) -> torch.Tensor:
    """What a user would write in torch for mxfp4 experts: dequantize each routed expert to the
    activations' dtype, then GEMMs in that dtype, biases as gpt-oss adds them."""
    M, H = x.shape
    q13, s13, q2, s2 = (tensors[n] for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"))
    b13, b2 = tensors.get("w13_bias"), tensors.get("w2_bias")
    I = q13.shape[1] // 2
    out = torch.zeros(M, H, dtype=torch.float32)
    for e, tok, k in routed_experts(topk_ids):
        w13 = dequantize_mxfp4(q13[e], s13[e])[:, :H].to(x.dtype)
        w2 = dequantize_mxfp4(q2[e], s2[e])[:H, :I].to(x.dtype)
        h = F.linear(x[tok], w13, None if b13 is None else b13[e].to(x.dtype))
        gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else (h[:, :I], h[:, I:])
        act = gate_activation(activation, gate, up, swiglu_alpha, swiglu_limit)
        y = F.linear(act, w2, None if b2 is None else b2[e, :H].to(x.dtype))
        out.index_add_(0, tok, y.float() * topk_weights[tok, k].unsqueeze(1))
    return out.to(x.dtype)


# ---------------------------------------------------------------- nvfp4 (ModelOpt NVFP4)
# Convention (vLLM 0.33.0 ModelOptNvFp4FusedMoE, see csrc/cpu/moe_layer.h): uint8 rows of e2m1 code
# pairs as for mxfp4 (element 2i in the low nibble of byte i); one float8_e4m3fn block scale per 16
# consecutive inputs of a row; one fp32 global scale (weight_scale_2) per expert projection.
# weight = e2m1(code) * float(block scale) * global scale.

def dequantize_nvfp4(codes: torch.Tensor, scale: torch.Tensor, global_scale) -> torch.Tensor:
    """uint8 [..., N, K/2], float8_e4m3fn [..., N, K/16] and the global scale (a number, or a tensor
    broadcastable to [..., N, 1], e.g. [E, 1, 1]) -> fp32 [..., N, K]. The exact product code * scale *
    global (<= 30 significant bits: exact in float64) is rounded to fp32 once."""
    lo = (codes & 0x0F).long()
    hi = (codes >> 4).long()
    c = torch.stack((lo, hi), dim=-1).flatten(-2)  # element 2i: low nibble, 2i + 1: high nibble
    mag = torch.tensor(E2M1_VALUES, dtype=torch.float64)[c & 7]
    v = torch.where((c & 8) != 0, -mag, mag)
    s = scale.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=-1)[..., :v.shape[-1]]
    g = global_scale.double() if isinstance(global_scale, torch.Tensor) else float(global_scale)
    return (v * s * g).float()


def dequantize_nvfp4_experts(tensors: dict):
    """vLLM's nvfp4 tensors -> fp32 (w13 [E, 2I, H] with rows [gate; up], w2 [E, H, I]); gate and up use
    their own global scale (w13_weight_scale_2[:, 0] and [:, 1])."""
    q13, s13, g13 = tensors["w13_weight"], tensors["w13_weight_scale"], tensors["w13_weight_scale_2"]
    q2, s2, g2 = tensors["w2_weight"], tensors["w2_weight_scale"], tensors["w2_weight_scale_2"]
    I = q13.shape[1] // 2
    g13_rows = g13.float().repeat_interleave(I, dim=1)[:, :, None]  # [E, 2I, 1]: gate rows, then up rows
    return dequantize_nvfp4(q13, s13, g13_rows), dequantize_nvfp4(q2, s2, g2.float()[:, None, None])


def moe_torch_baseline_nvfp4(x, tensors, topk_ids, topk_weights) -> torch.Tensor:
    """What a user would write in torch for nvfp4 experts: dequantize each routed expert to the
    activations' dtype, then the bf16 baseline's GEMMs (silu)."""
    q13, s13, g13 = tensors["w13_weight"], tensors["w13_weight_scale"], tensors["w13_weight_scale_2"]
    q2, s2, g2 = tensors["w2_weight"], tensors["w2_weight_scale"], tensors["w2_weight_scale_2"]
    I = q13.shape[1] // 2
    return _dequantizing_baseline(x, topk_ids, topk_weights, lambda e: (
        torch.cat([dequantize_nvfp4(q13[e, :I], s13[e, :I], g13[e, 0]),
                   dequantize_nvfp4(q13[e, I:], s13[e, I:], g13[e, 1])]).to(x.dtype),
        dequantize_nvfp4(q2[e], s2[e], g2[e]).to(x.dtype)))
