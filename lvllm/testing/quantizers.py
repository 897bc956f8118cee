"""Reference quantizers of every expert format, in the checkpoint's layout: one projection (or a
stack of them) w [..., N, K] fp32 -> the codes and scales a checkpoint of that format holds. The
dequantizers are lk_moe.reference's (the engine's tests check those against hand-built codes and
against vLLM's, transformers' and compressed-tensors' own decoders); these are the other direction,
shared by the tiny checkpoints and the tests."""
from __future__ import annotations

import torch

from lk_moe.reference import E2M1_VALUES

FP8_MAX = 448.0  # largest float8_e4m3fn value
E2M1_MAX = E2M1_VALUES[-1]
E2M1 = torch.tensor(E2M1_VALUES)
MXFP4_GROUP = 32
NVFP4_GROUP = 16


def quantize_fp8_block(w: torch.Tensor, bn: int = 128, bk: int = 128):
    """[..., N, K] -> (float8_e4m3fn [..., N, K], fp32 scale_inv [..., ceil(N/bn), ceil(K/bk)]): per
    bn x bk block scale = amax / 448, code = nearest e4m3 of w / scale (DeepSeek-V3 / Qwen3-FP8)."""
    *lead, N, K = w.shape
    nb, kb = -(-N // bn), -(-K // bk)
    padded = torch.zeros(*lead, nb * bn, kb * bk)
    padded[..., :N, :K] = w.float()
    tiles = padded.reshape(*lead, nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX
    q = (tiles / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(*lead, nb * bn, kb * bk)[..., :N, :K].contiguous(), scale.float().contiguous()


# compressed-tensors W8A8 per output channel: quant -> (code dtype, largest code, compressed-tensors
# type and format).
W8A8_CHANNEL = {
    "fp8_channel": (torch.float8_e4m3fn, FP8_MAX, "float", "float-quantized"),
    "int8_channel": (torch.int8, 127.0, "int", "int-quantized"),
}


def quantize_w8a8_channel(w: torch.Tensor, quant: str, scale_dtype=torch.bfloat16):
    """fp32 [..., N, K] -> (codes [..., N, K], scales [..., N, 1] in scale_dtype): scale = row amax /
    largest code (rounded to scale_dtype first, so the codes are computed against the scale the file
    holds: bf16 in compressed-tensors checkpoints, fp32 as vLLM holds it); fp8 codes are the nearest
    e4m3 value, int8 codes round half to even."""
    dtype, qmax, _, _ = W8A8_CHANNEL[quant]
    w = w.float()
    scale = (w.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=1e-12).to(scale_dtype)
    x = (w / scale.float()).clamp(-qmax, qmax)
    codes = x.to(dtype) if dtype.is_floating_point else torch.round(x).to(dtype)
    return codes.contiguous(), scale.contiguous()


def pack_int4(u: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes [..., L] (L a multiple of 8) -> int32 [..., L/8]: element 8w + i in bits
    4i..4i+3 of word w (compressed-tensors pack_to_int32)."""
    u = u.to(torch.int64)
    words = torch.zeros(*u.shape[:-1], u.shape[-1] // 8, dtype=torch.int64)
    for i in range(8):
        words |= u[..., i::8] << (4 * i)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # two's complement


def quantize_int4(w: torch.Tensor, group: int, asym: bool = False, scale_dtype=torch.bfloat16,
                  code_max: float = 7.5):
    """[..., N, K] -> (signed codes q in [-8, 7] as float [..., N, K], scale [..., N, K/group] in
    scale_dtype, zero points zp [..., N, K/group] as float, 0 when symmetric); w ~ (q - zp) * scale.
    Symmetric: scale = group amax / code_max; asymmetric: the group's [min, max] (with 0) over 15 steps.
    Stored as q + 8 and zp + 8 (pack_int4)."""
    *lead, N, K = w.shape
    g = w.reshape(*lead, N, K // group, group)
    if asym:
        lo, hi = g.amin(dim=-1).clamp(max=0), g.amax(dim=-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp_min(1e-8).to(scale_dtype)
        zp = (torch.round(-lo / scale.float()) - 8).clamp(-8, 7)
    else:
        scale = (g.abs().amax(dim=-1) / code_max).clamp_min(1e-8).to(scale_dtype)
        zp = torch.zeros(*lead, N, K // group)
    q = (torch.round(g / scale.float()[..., None]) + zp[..., None]).clamp(-8, 7)
    return q.reshape(*lead, N, K), scale, zp


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code of each value (bit 3 = sign, bits 0-2 the magnitude's index; -0 is +0)."""
    idx = (x.abs()[..., None] - E2M1).abs().argmin(dim=-1)
    return (idx | ((x < 0) & (idx > 0)).to(torch.int64) << 3).to(torch.uint8)


def _pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()  # element 2i in the low nibble


def quantize_mxfp4(w: torch.Tensor):
    """fp32 [..., N, K] -> (blocks uint8 [..., N, K/32, 16], scales uint8 [..., N, K/32]): per 32 inputs
    an e8m0 scale 2^(s-127) and e2m1 codes, two per byte (the OCP MX layout of gpt-oss checkpoints;
    vLLM holds the blocks flattened to [..., N, K/2])."""
    *lead, N, K = w.shape
    g = w.reshape(*lead, N, K // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(dim=-1).clamp(min=2.0 ** -100)
    e = torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-127, 127)
    codes = _e2m1_codes(g / torch.exp2(e)[..., None])
    return _pack_pairs(codes), (e + 127).to(torch.uint8).contiguous()


def quantize_mxfp8(w: torch.Tensor):
    """fp32 [..., N, K] (K a multiple of 32) -> (float8_e4m3fn [..., N, K], uint8 e8m0 [..., N, K/32]): per 32
    inputs of a row the power of two 2^(s-127) that takes the group's largest magnitude to at most 448, and the
    codes of w / 2^(s-127) (OCP MX FP8, as ModelOpt's MXFP8 checkpoints hold it)."""
    *lead, N, K = w.shape
    g = w.float().reshape(*lead, N, K // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(dim=-1).clamp(min=2.0 ** -100)
    e = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
    codes = (g / torch.exp2(e)[..., None]).to(torch.float8_e4m3fn).reshape(*lead, N, K)
    return codes.contiguous(), (e + 127).to(torch.uint8).contiguous()


def quantize_nvfp4(w: torch.Tensor):
    """fp32 [N, K] -> (uint8 codes [N, K/2], float8_e4m3fn block scales [N, K/16], fp32 global scale []),
    ModelOpt's recipe: global = amax / (6 * 448), block scale = fp8(block amax / 6 / global), code =
    nearest e2m1 of w / (block scale * global)."""
    N, K = w.shape
    w = w.float()
    gs = (w.abs().amax() / (E2M1_MAX * FP8_MAX)).clamp(min=2.0 ** -100)
    g = w.reshape(N, K // NVFP4_GROUP, NVFP4_GROUP)
    sf = (g.abs().amax(dim=-1) / E2M1_MAX / gs).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = (sf.float() * gs).clamp(min=2.0 ** -126)[..., None]
    codes = _e2m1_codes(g / denom).reshape(N, K)
    return _pack_pairs(codes), sf.contiguous(), gs.reshape(()).float()
