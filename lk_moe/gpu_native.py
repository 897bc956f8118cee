"""The native GPU expert path: vLLM's own fused-MoE kernel computes a streamed chunk of experts
from the format's codes and scales, with no dequantization to bf16.

The streamed bytes are the engine's packed blocks (lk_moe.hybrid.GpuCopyLayout): no second host
copy in vLLM's layout exists (host memory stays the engine's one copy). After the H2D copy, `relayout`
rearranges codes and scales on the GPU into the layout vLLM 0.33.0's Triton fused-MoE kernels read
(one permute per tensor, plus a nibble swap for int4): a copy at GPU memory speed, the size of the
codes, next to a PCIe transfer of the same bytes.

What runs (vllm.model_executor.layers.fused_moe.fused_moe.fused_experts, i.e. the Triton
fused_moe_kernel family, with the FusedMoEQuantConfig of vLLM's own method for that checkpoint):

  fp8_block    sm_89+  fp8 W8A8, 128x128 weight-scale blocks (fp8_w8a8_moe_quant_config, block_shape
                       [128, 128]); activations quantized to fp8 per token and 128 inputs
                       (per_token_group_quant_fp8), as vLLM's Fp8MoEMethod does on its Triton backend.
  fp8_channel  sm_89+  fp8 W8A8, one weight scale per output channel, activations quantized to fp8
                       per token (per_act_token_quant=per_out_ch_quant=True), as vLLM's CT W8A8-FP8
                       channel method does.
  int8_channel sm_80+  int8 W8A16, one weight scale per output channel (int8_w8a16_moe_quant_config):
                       bf16 activations, codes converted exactly to bf16 in registers, the fp32 scale
                       applied to the fp32 sums. (vLLM's own CT W8A8-int8 method quantizes activations
                       to int8 per token; W8A16 keeps the activations as the CPU engine and the fallback
                       do, at least as accurate as the fallback.)
  wna16_int4   sm_80+  int4 W4A16, group size G, with or without zero points
                       (int4_w4a16_moe_quant_config, block_shape [0, G]): vLLM's Triton gptq/awq kernel
                       ((u - z) x scale rounded to bf16 in registers), or its moe_wna16 CUDA kernel for
                       very sparse chunks, as vLLM chooses.

mxfp4 and nvfp4 have no native path: FP4 tensor-core MMA needs sm_100+, and vLLM's FP4 MoE kernels
(FlashInfer / CUTLASS / Marlin) want their own swizzled or repacked scale layouts; they take the
fallback on every GPU (lk_moe.gpu_dequant).

Numerics versus the fallback (bf16 weights, fp32 pre-activations, bf16 activation output): vLLM's
kernel rounds the pre-activations to bf16 (its intermediate cache), the activation output to bf16,
each (token, expert) output times its router weight to bf16 and each chunk's sum to bf16 (added to the
fp32 accumulator); the fp8 formats also round both GEMMs' inputs to fp8 e4m3 (relative error <= 2^-4
per element, 16 times bf16's 2^-8). tests/gpu/test_native.py derives the bound it checks.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .gpu_layout import blocks_w13, blocks_w2, unpack_w13, unpack_w2
from .reference import dequantize_fp8_block, dequantize_per_channel

# format -> (first compute capability, what computes the chunk). gpu_dequant.gpu_path reads it.
KERNELS = {
    "fp8_block": ((8, 9), "vLLM fused_experts (Triton fused_moe_kernel), fp8 W8A8 with 128x128 weight blocks, "
                          "activations quantized to fp8 per token and 128 inputs"),
    "fp8_channel": ((8, 9), "vLLM fused_experts (Triton fused_moe_kernel), fp8 W8A8 with per-channel weight scales, "
                            "activations quantized to fp8 per token"),
    "int8_channel": ((8, 0), "vLLM fused_experts (Triton fused_moe_kernel), int8 W8A16 with per-channel weight "
                             "scales, bf16 activations"),
    "wna16_int4": ((8, 0), "vLLM fused_experts (Triton gptq/awq fused-MoE kernel or moe_wna16 CUDA kernel), "
                           "int4 W4A16 with group scales, bf16 activations"),
}
FP8_BLOCK = 128  # the weight-scale block of fp8_block, both directions (vLLM's Triton path takes only this)


class NativeWeights(NamedTuple):
    """One chunk of n experts in the layout vLLM's kernel reads (all on one device).

    fp8/int8: w1 [n, 2*kp2, kp1], w2 [n, kp1, kp2] float8_e4m3fn / int8; scales fp32: fp8_block
    w1s [n, 2*kp2/128, kp1/128], w2s [n, kp1/128, kp2/128]; channel formats [n, 2*kp2, 1], [n, kp1, 1].
    wna16_int4: w1 uint8 [n, 2*kp2, kp1/2], w2 [n, kp1, kp2/2] (input k in byte k/2, low nibble for even
    k: unsigned codes u); scales [n, 2*kp2, kp1/G], [n, kp1, kp2/G]; zero points None or uint8
    [n, kp2, kp1/G], [n, kp1/2, kp2/G] (row r in byte r/2, low nibble for even r).
    Rows of w2 past the layer's h_pad (kp1 may exceed it) hold zero codes and zero scales."""
    w1: torch.Tensor
    w2: torch.Tensor
    w1s: torch.Tensor
    w2s: torch.Tensor
    w1z: Optional[torch.Tensor] = None
    w2z: Optional[torch.Tensor] = None


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t [n, r, ...] -> [n, rows, ...] with zero rows appended (contiguous)."""
    if t.shape[1] < rows:
        pad = torch.zeros((t.shape[0], rows - t.shape[1]) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
        return torch.cat([t, pad], dim=1)
    return t.contiguous()


def _swap_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Engine int4 blocks [..., kp/4, 16, 2], grouped in octets of 64 bytes (moe_layer.cpp pack_int4:
    byte j of octet o holds element 8o + j low and 8o + 4 + j high, the order of the int8-activation
    decode) -> quads of the same shape whose byte j of quad q holds elements 4q + 2j (low) and
    4q + 2j + 1 (high): sequential pairs, as vLLM packs int4 along K."""
    lead, quads = codes.shape[:-3], codes.shape[-3]
    b0, b1, b2, b3 = codes.reshape(*lead, quads // 2, 16, 4).unbind(-1)
    first = torch.stack(((b0 & 0x0F) | ((b1 & 0x0F) << 4), (b2 & 0x0F) | ((b3 & 0x0F) << 4)), dim=-1)  # 8o..8o+3
    second = torch.stack(((b0 >> 4) | (b1 & 0xF0), (b2 >> 4) | (b3 & 0xF0)), dim=-1)                   # 8o+4..8o+7
    return torch.stack((first, second), dim=-3).reshape(codes.shape)


def relayout(fmt: str, per_slice, padded_dims, parts=()) -> NativeWeights:
    """One chunk's tensors (per NUMA slice, shaped like lk_moe.hybrid.gpu_sources, n experts, on any
    device) -> NativeWeights. Pure torch (the CPU tests check it against the checkpoint tensors bit for
    bit). parts: wna16_int4's hybrid.quant4_parts (which of z13/z2 the slices hold)."""
    kp1, kp2, h_pad = padded_dims
    if fmt in ("fp8_block", "fp8_channel", "int8_channel"):
        code_dtype = torch.int8 if fmt == "int8_channel" else torch.float8_e4m3fn
        w1 = unpack_w13([v[0] for v in per_slice]).contiguous().view(code_dtype)
        w2 = _pad_rows(unpack_w2([v[2] for v in per_slice]), kp1).view(code_dtype)
        s13 = blocks_w13([v[1] for v in per_slice])  # [n, 2*kp2/16, P1]: one row of scales per 16-row block
        s2 = blocks_w2([v[3] for v in per_slice])    # [n, h_pad/16, P2]
        if fmt == "fp8_block":
            # The engine repeats a 128-row block's scales in each of its 8 16-row blocks: keep every 8th.
            w1s = s13[:, ::FP8_BLOCK // 16].contiguous()
            w2s = _pad_rows(s2[:, ::FP8_BLOCK // 16], -(-kp1 // FP8_BLOCK))
        else:
            w1s = s13.reshape(s13.shape[0], -1, 1).contiguous()          # [n, 2*kp2, 1]: rows of 16
            w2s = _pad_rows(s2.reshape(s2.shape[0], -1, 1), kp1)          # [n, kp1, 1]
        return NativeWeights(w1, w2, w1s, w2s)
    if fmt == "wna16_int4":
        sl = [dict(zip(parts, v)) for v in per_slice]
        w1 = unpack_w13([_swap_nibbles(p["w13"]) for p in sl]).contiguous()  # [n, 2*kp2, kp1/2]
        w2 = _pad_rows(unpack_w2([_swap_nibbles(p["w2"]) for p in sl]), kp1)  # [n, kp1, kp2/2]
        s1 = blocks_w13([p["s13"].transpose(-1, -2) for p in sl])          # [n, 2*nbi, 16, G1]
        w1s = s1.reshape(s1.shape[0], -1, s1.shape[-1]).contiguous()
        s2 = blocks_w2([p["s2"].transpose(-1, -2) for p in sl])            # [n, nbh, 16, G2]
        w2s = _pad_rows(s2.reshape(s2.shape[0], -1, s2.shape[-1]), kp1)
        w1z = w2z = None
        if "z13" in sl[0]:
            z1 = blocks_w13([p["z13"].transpose(-1, -2) for p in sl])      # [n, 2*nbi, 8, G1]
            w1z = z1.reshape(z1.shape[0], -1, z1.shape[-1]).contiguous()   # [n, kp2, G1]
            z2 = blocks_w2([p["z2"].transpose(-1, -2) for p in sl])        # [n, nbh, 8, G2]
            w2z = _pad_rows(z2.reshape(z2.shape[0], -1, z2.shape[-1]), kp1 // 2)
        return NativeWeights(w1, w2, w1s, w2s, w1z, w2z)
    raise ValueError(f"{fmt} experts have no native GPU path (native: {', '.join(KERNELS)})")


def dequantize(fmt: str, w: NativeWeights) -> tuple:
    """fp32 (w13 [n, 2*kp2, kp1], w2 [n, kp1, kp2]) from NativeWeights, any device: what the native
    kernel's weights are worth (tests; the start-up self-check)."""
    def codes4(t):  # uint8 [..., K/2] -> int codes [..., K], element k from byte k/2 (low nibble: even k)
        return torch.stack((t & 15, t >> 4), dim=-1).flatten(-2).float()

    def expand(s, k):  # [n, N, groups] -> [n, N, k]
        return s.float().repeat_interleave(k // s.shape[-1], dim=-1)

    if fmt == "fp8_block":  # sizes are multiples of FP8_BLOCK here, so the blocks derived there are it
        return dequantize_fp8_block(w.w1, w.w1s), dequantize_fp8_block(w.w2, w.w2s)
    if fmt in ("fp8_channel", "int8_channel"):
        return dequantize_per_channel(w.w1, w.w1s), dequantize_per_channel(w.w2, w.w2s)
    if fmt == "wna16_int4":
        def one(q, s, z):
            u = codes4(q)
            zero = 8.0 if z is None else expand(codes4(z.transpose(1, 2)).transpose(1, 2), u.shape[-1])
            return (u - zero) * expand(s, u.shape[-1])
        return one(w.w1, w.w1s, w.w1z), one(w.w2, w.w2s, w.w2z)
    raise ValueError(f"{fmt} experts have no native GPU path")


def _vllm():
    """vLLM's fused_experts and quant-config builders; ImportError/any failure propagates."""
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
    return fused_experts, moe_config, MoEActivation


_CHECKED: set = set()  # (format, zero points, device) whose start-up check passed


class NativeExperts:
    """vLLM's fused-MoE kernel on one layer's chunks. Construction imports vLLM and runs the kernel once
    on a tiny synthetic chunk of this layer's format (checked against its dequantized weights), so a
    GPU that should run it but cannot (vLLM missing or built without its CUDA ops, Triton failing)
    fails at start-up, naming LK_FORCE_GPU_FALLBACK=1 as the way out, never silently later."""

    def __init__(self, fmt: str, padded_dims, parts=(), activation: str = "silu", device=None):
        if fmt not in KERNELS:
            raise ValueError(f"{fmt} experts have no native GPU path (native: {', '.join(KERNELS)})")
        if activation != "silu":
            raise ValueError(f"the native {fmt} path computes silu experts; this layer's activation is {activation}")
        if "b13" in parts:
            raise ValueError(f"the native {fmt} path takes no expert biases")
        self.format, self.padded_dims, self.parts = fmt, tuple(padded_dims), tuple(parts)
        kp1, kp2, _ = self.padded_dims
        if fmt == "fp8_block" and (kp1 % FP8_BLOCK or kp2 % FP8_BLOCK):
            raise ValueError(f"fp8_block native path: padded sizes {kp1} x {kp2} must be multiples of {FP8_BLOCK}")
        self.device = torch.device(device or "cuda")
        self.description = KERNELS[fmt][1]
        try:
            self._fused_experts, cfg, act = _vllm()
        except Exception as e:  # noqa: BLE001 - any import failure means the same thing here
            raise RuntimeError(_failure(fmt, f"cannot import vLLM's fused-MoE kernel ({type(e).__name__}: {e})")) from e
        self._cfg, self._silu = cfg, act.SILU
        key = (fmt, "z13" in self.parts, self.device)
        if key not in _CHECKED:  # once per process, format and device
            self._self_check()
            _CHECKED.add(key)

    def quant_config(self, w: NativeWeights):
        """vLLM's FusedMoEQuantConfig for a chunk: the one vLLM's own method for such a checkpoint builds."""
        cfg = self._cfg
        if self.format == "fp8_block":
            return cfg.fp8_w8a8_moe_quant_config(w1_scale=w.w1s, w2_scale=w.w2s, block_shape=[FP8_BLOCK, FP8_BLOCK])
        if self.format == "fp8_channel":
            return cfg.fp8_w8a8_moe_quant_config(w1_scale=w.w1s, w2_scale=w.w2s, per_act_token_quant=True,
                                                 per_out_ch_quant=True)
        if self.format == "int8_channel":
            return cfg.int8_w8a16_moe_quant_config(w1_scale=w.w1s, w2_scale=w.w2s)
        g1, g2 = w.w1.shape[2] * 2 // w.w1s.shape[2], w.w2.shape[2] * 2 // w.w2s.shape[2]
        if g1 != g2:
            raise ValueError(f"wna16_int4 native path: one group size for both projections, got {g1} and {g2}")
        return cfg.int4_w4a16_moe_quant_config(w1_scale=w.w1s, w2_scale=w.w2s, w1_zp=w.w1z, w2_zp=w.w2z,
                                               block_shape=[0, g1])

    def relayout(self, per_slice) -> NativeWeights:
        return relayout(self.format, per_slice, self.padded_dims, self.parts)

    def add(self, x_pad: torch.Tensor, ids: torch.Tensor, topk_weights: torch.Tensor, w: NativeWeights,
            chunk: Optional[List[int]], num_experts: int, acc: torch.Tensor, dtype=None) -> None:
        """acc [M, h_pad] fp32 += the chunk's experts' weighted outputs. ids: `map_ids` of the batch's
        topk_ids (int32 [M, K], -1 mapped to num_experts); chunk: the global ids of w's experts in order
        (None: w holds all num_experts experts)."""
        if w.w1s.dtype != x_pad.dtype and self.format == "wna16_int4":
            # vLLM holds int4 scales in the model dtype (params_dtype); its CUDA wna16 kernel wants that.
            w = w._replace(w1s=w.w1s.to(x_pad.dtype), w2s=w.w2s.to(x_pad.dtype))
        emap = torch.full((num_experts + 1,), -1, dtype=torch.int32, device=x_pad.device)
        if chunk is None:
            emap[:num_experts] = torch.arange(num_experts, dtype=torch.int32, device=x_pad.device)
        else:
            emap[torch.tensor(chunk, dtype=torch.long).to(x_pad.device, non_blocking=True)] = \
                torch.arange(len(chunk), dtype=torch.int32, device=x_pad.device)
        out = self._fused_experts(x_pad, w.w1, w.w2, topk_weights, ids, activation=self._silu,
                                  global_num_experts=num_experts + 1, expert_map=emap,
                                  quant_config=self.quant_config(w))
        acc.add_(out[:, :acc.shape[1]])

    @staticmethod
    def map_ids(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
        """-1 (no expert) -> num_experts, which every chunk's expert map sends to -1 (skipped)."""
        return torch.where(topk_ids < 0, torch.full_like(topk_ids, num_experts), topk_ids).contiguous()

    def _self_check(self) -> None:
        """One tiny chunk (2 experts, 256 x 128 inputs, 16 tokens) through vLLM's kernel against the fp32
        torch reference on the same weights: catches a missing or broken kernel, and a layout mismatch."""
        try:
            w = _synthetic(self.format, self.device, zero_points="z13" in self.parts)
            M, H = 16, w.w1.shape[2] * (2 if self.format == "wna16_int4" else 1)
            g = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(M, H, generator=g).to(self.device, torch.bfloat16)
            ids = torch.tensor([[e % 2, 1 - e % 2] for e in range(M)], dtype=torch.int32, device=self.device)
            tw = torch.full((M, 2), 0.5, dtype=torch.float32, device=self.device)
            acc = torch.zeros(M, H, dtype=torch.float32, device=self.device)
            self.add(x, self.map_ids(ids, 2), tw, w, None, 2, acc)
            torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(_failure(self.format, f"vLLM's kernel failed to run ({type(e).__name__}: {e})")) from e
        d1, d2 = dequantize(self.format, w)
        ref = torch.zeros_like(acc)
        I = d1.shape[1] // 2
        for e in range(2):
            h = x.float() @ d1[e].t()
            ref += 0.5 * ((F.silu(h[:, :I]) * h[:, I:]) @ d2[e].t())
        err = ((acc - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if not err < 0.1:  # fp8 activations: ~0.04 expected; a layout error gives ~1
            raise RuntimeError(_failure(self.format, f"vLLM's kernel gave a wrong result on the start-up check "
                                                     f"(relative error {err:.3g})"))


def _failure(fmt: str, what: str) -> str:
    return (f"lk_moe: {fmt} experts should take the native GPU path on this GPU, but {what}. Install the "
            f"vLLM build lvllm expects (the pinned release with its CUDA ops), or set LK_FORCE_GPU_FALLBACK=1 to use the "
            f"fallback (dequantize to bf16 on the GPU + bf16 GEMM)")


def _synthetic(fmt: str, device, zero_points: bool = False) -> NativeWeights:
    """2 experts of 256 inputs / 128 intermediate in `fmt`'s native layout, random codes and scales."""
    g = torch.Generator(device="cpu").manual_seed(1)
    n, H, I = 2, 256, 128
    if fmt in ("fp8_block", "fp8_channel", "int8_channel"):
        def codes(*shape):
            if fmt == "int8_channel":
                return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
            return (torch.randn(*shape, generator=g) * 64).to(torch.float8_e4m3fn)
        w1, w2 = codes(n, 2 * I, H), codes(n, H, I)
        unit = 1.0 / (64 * H ** 0.5)  # codes reach ~+-127 (int8) or ~+-200 (fp8)
        if fmt == "fp8_block":
            s1 = torch.rand(n, 2 * I // 128, H // 128, generator=g) * unit + unit / 2
            s2 = torch.rand(n, H // 128, I // 128, generator=g) * unit + unit / 2
        else:
            s1 = torch.rand(n, 2 * I, 1, generator=g) * unit + unit / 2
            s2 = torch.rand(n, H, 1, generator=g) * unit + unit / 2
        w = NativeWeights(w1, w2, s1, s2)
    else:
        G = 32
        w1 = torch.randint(0, 256, (n, 2 * I, H // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        w2 = torch.randint(0, 256, (n, H, I // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        s1 = (torch.rand(n, 2 * I, H // G, generator=g) + 0.5) / (4 * H ** 0.5)
        s2 = (torch.rand(n, H, I // G, generator=g) + 0.5) / (4 * I ** 0.5)
        z1 = z2 = None
        if zero_points:
            z1 = torch.randint(0, 256, (n, I, H // G), generator=g, dtype=torch.int32).to(torch.uint8)
            z2 = torch.randint(0, 256, (n, H // 2, I // G), generator=g, dtype=torch.int32).to(torch.uint8)
        w = NativeWeights(w1, w2, s1.bfloat16(), s2.bfloat16(), z1, z2)
    return NativeWeights(*(None if t is None else t.to(device) for t in w))
