"""Dequantize the engine's packed blocks into plain bf16 rows on the GPU: the fallback for GPUs
without a native kernel for the format.

Byte formats (FP8 E4M3 or INT8 codes): a CUDA kernel (csrc/cuda/dequant_blocks.cu, built for
sm_75..sm_120) with a plain-torch twin that defines the result and runs anywhere. Layout (see
lk_moe.gpu_layout): a block is 16 output rows of `kp` inputs; byte (k/2)*32 + 2n + (k&1) holds row n,
input k. Scales (fp32): [blocks, 16] one per row, or [blocks, kp/seg] one per segment of `seg` inputs
(shared by the block's 16 rows). Result: bf16 [blocks*16, kp], row b*16+n = block b's row n, each value
code * scale rounded once.

4-bit formats (wna16_int4, mxfp4, nvfp4): plain torch ops (`dequant4_blocks`, any device) on the
engine's own 4-bit blocks (Layer.quant4_slices), so half a byte per weight crosses PCIe.

mxfp8: plain torch ops (`dequant_mx_blocks`) on the byte blocks with their e8m0 scales, one per row and
32 inputs (Layer.quant_slices), so one byte and 1/32 per weight cross PCIe.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

import torch

from . import formats, gpu_native
from .gpu_layout import rows_w13, rows_w2

CODES = {"fp8_e4m3": 0, "int8": 1}

# Which GPU path a format takes (`gpu_path`). NATIVE_KERNELS (lk_moe.gpu_native.KERNELS): the formats
# that vLLM 0.33.0's fused-MoE kernels compute natively from their codes, with the first capability
# each runs on: fp8_block and fp8_channel from sm_89 (FP8 tensor-core MMA), int8_channel and
# wna16_int4 from sm_80 (W8A16 / W4A16: bf16 MMA on weights converted in registers). Below that, and
# for the FP4 formats and mxfp8 everywhere, the fallback: dequantize to bf16 on the GPU (fp8 / int8
# codes with fp32 scales: this module's kernel; 4-bit formats and mxfp8: torch ops), then the bf16
# GEMM. mxfp4/nvfp4 have no native path: FP4 MMA needs sm_100+, and vLLM's FP4 MoE kernels want their
# own swizzled scale layouts, which lk_moe does not build; mxfp8 has none wired either (its MMA with
# e8m0 block scales needs sm_100+).
# LK_FORCE_GPU_FALLBACK=1 (or force_fallback=True) forces the fallback.
BYTE_FORMATS = formats.BYTE
FOUR_BIT_FORMATS = formats.FOUR_BIT
MX_BYTE_FORMATS = ("mxfp8",)  # byte codes with e8m0 scales per row and 32 inputs
TORCH_DEQUANT_FORMATS = FOUR_BIT_FORMATS + MX_BYTE_FORMATS  # dequantized by torch ops: no CUDA kernel
HARDWARE_NATIVE = {"fp8_block": (8, 9), "fp8_channel": (8, 9), "int8_channel": (7, 5),
                   "wna16_int4": (8, 0), "mxfp4": (10, 0), "nvfp4": (10, 0), "mxfp8": (10, 0)}  # the MMA the hardware has
NATIVE_KERNELS = gpu_native.KERNELS  # format -> (first capability, vLLM kernel that computes it)
GPU_FORMATS = formats.GPU  # formats with a GPU path (streamed or resident)


def gpu_path(format: str, capability=None, force_fallback: Optional[bool] = None, activation: str = "silu"):
    """(path, reason) for `format`'s routed experts on a GPU of `capability` (major, minor; default:
    the current device's, or None without CUDA): path is "bf16" (plain bf16 GEMM), "native" (vLLM's
    fused-MoE kernel on the format's codes, lk_moe.gpu_native), "fallback" (dequantize to bf16 on the
    GPU, then the bf16 GEMM) or "cpu" (no GPU path for the format: prefill stays on the CPU).
    force_fallback: default LK_FORCE_GPU_FALLBACK. activation: the layer's; the native kernels are wired
    for plain silu only."""
    if format == "bf16":
        return "bf16", "bf16 experts: bf16 GEMM"
    if format not in GPU_FORMATS:
        return "cpu", (f"{format} experts have no GPU path in lk_moe (GPU paths: {', '.join(GPU_FORMATS)}); "
                       "they run on the CPU engine")
    if force_fallback is None:
        from .config import force_gpu_fallback
        force_fallback = force_gpu_fallback()
    if capability is None and torch.cuda.is_available():
        capability = tuple(torch.cuda.get_device_capability())
    if force_fallback:
        return "fallback", f"{format}: LK_FORCE_GPU_FALLBACK=1 (dequantize to bf16 on the GPU + bf16 GEMM)"
    if activation != "silu" and format in NATIVE_KERNELS:
        return "fallback", (f"{format}: the native kernel path computes silu only, this layer's activation is "
                            f"{activation} (dequantize to bf16 on the GPU + bf16 GEMM)")
    if format not in NATIVE_KERNELS:
        why = ("MXFP8 MMA needs sm_100+" if format in MX_BYTE_FORMATS
               else "FP4 MMA needs sm_100+, and vLLM's FP4 MoE kernels want their own scale layouts")
        return "fallback", (f"{format}: no native GPU kernel wired into lk_moe ({why}); dequantize to bf16 on the "
                            "GPU + bf16 GEMM")
    need, kernel = NATIVE_KERNELS[format]
    if capability is None or tuple(capability) < need:
        have = "no GPU" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return "fallback", (f"{format}: the native kernel needs sm_{need[0]}{need[1]}+, this GPU is {have} "
                            "(dequantize to bf16 on the GPU + bf16 GEMM)")
    return "native", f"{format}: native on sm_{capability[0]}{capability[1]}: {kernel}"


_lib = None
_lib_error: Optional[str] = None


def library():
    """The compiled kernels (ctypes), or None with the reason in `library_error()`."""
    global _lib, _lib_error
    if _lib is None and _lib_error is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lk_cuda.so")
        if not os.path.exists(path):
            _lib_error = "lk_moe was built without nvcc (no lk_moe/_lk_cuda.so)"
        else:
            try:
                lib = ctypes.CDLL(path)
                lib.lk_dequant_blocks.restype = ctypes.c_int
                lib.lk_dequant_blocks.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
                lib.lk_cuda_archs.restype = ctypes.c_char_p
                _lib = lib
            except OSError as e:
                _lib_error = f"cannot load {path}: {e}"
    return _lib


def library_error() -> Optional[str]:
    library()
    return _lib_error


def compiled_archs() -> list:
    lib = library()
    return lib.lk_cuda_archs().decode().split(",") if lib is not None else []


def _check(packed: torch.Tensor, scales: torch.Tensor, kp: int, seg: int, codes: str) -> int:
    if codes not in CODES:
        raise ValueError(f"codes must be one of {', '.join(CODES)}, got {codes!r}")
    if packed.dtype != torch.uint8 or scales.dtype != torch.float32:
        raise TypeError("packed must be uint8 and scales float32")
    if kp <= 0 or kp % 2 or (seg and (seg % 2 or kp % seg)):
        raise ValueError(f"kp={kp} must be even and a multiple of seg={seg} (seg even; 0 = one scale per row)")
    if packed.numel() % (16 * kp):
        raise ValueError(f"packed holds {packed.numel()} bytes, not whole blocks of 16 x {kp}")
    blocks = packed.numel() // (16 * kp)
    want = blocks * (kp // seg if seg else 16)
    if scales.numel() != want:
        raise ValueError(f"scales must hold {want} values for {blocks} blocks, got {scales.numel()}")
    return blocks


def dequant_blocks_reference(packed: torch.Tensor, scales: torch.Tensor, kp: int, seg: int, codes: str) -> torch.Tensor:
    """Plain torch, any device: the definition of the result."""
    blocks = _check(packed, scales, kp, seg, codes)
    p = packed.reshape(blocks, kp // 2, 16, 2).permute(0, 2, 1, 3).reshape(blocks, 16, kp)
    vals = p.view(torch.float8_e4m3fn).float() if codes == "fp8_e4m3" else p.view(torch.int8).float()
    if seg:
        s = scales.reshape(blocks, 1, kp // seg).repeat_interleave(seg, dim=2)
    else:
        s = scales.reshape(blocks, 16, 1)
    return (vals * s).to(torch.bfloat16).reshape(blocks * 16, kp)


IMPLS = ("auto", "kernel", "torch")


def kernel_usable(device=None) -> bool:
    """Whether the CUDA kernel can run here: the library loads and was compiled for this GPU's
    architecture (or a lower one of the same major version, whose code the driver can run)."""
    if library() is None or not torch.cuda.is_available():
        return False
    return arch_runs(compiled_archs(), torch.cuda.get_device_capability(device))


def arch_runs(archs, capability) -> bool:
    """Whether code built for `archs` (CMake style: "80-real" = SASS only, "120" = SASS + PTX) runs on
    a GPU of `capability` (major, minor): SASS of the same major and a minor <= the GPU's, or PTX of
    an architecture <= the GPU's (JIT-compiled by the driver)."""
    major, minor = capability
    for a in archs:
        num, _, kind = a.strip().partition("-")
        if not num.isdigit() or len(num) < 2:
            continue
        amaj, amin = int(num[:-1]), int(num[-1])
        if amaj == major and amin <= minor:
            return True
        if kind != "real" and (amaj, amin) <= (major, minor):
            return True
    return False


def dequantize(packed: torch.Tensor, scales: torch.Tensor, kp: int, seg: int, codes: str, impl: str = "auto",
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bf16 [blocks*16, kp] from packed blocks, by `impl`: "kernel" (the CUDA kernel; inputs on a CUDA
    device), "torch" (the plain-torch twin, any device: the definition, forced e.g. by tests), or "auto"
    (the kernel for CUDA inputs when `kernel_usable()`, else the twin). Both give the same bits."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "auto":
        impl = "kernel" if packed.is_cuda and kernel_usable(packed.device) else "torch"
    if impl == "kernel":
        return dequant_blocks(packed.reshape(-1), scales.reshape(-1), kp, seg, codes, out=out)
    res = dequant_blocks_reference(packed, scales, kp, seg, codes)
    if out is not None:
        out.view(res.shape).copy_(res)
        return out
    return res


def dequant_blocks(packed: torch.Tensor, scales: torch.Tensor, kp: int, seg: int, codes: str,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The CUDA kernel on the current stream (inputs on one CUDA device, contiguous)."""
    blocks = _check(packed, scales, kp, seg, codes)
    lib = library()
    if lib is None:
        raise RuntimeError(f"GPU fallback kernels unavailable: {_lib_error}")
    if not (packed.is_cuda and scales.is_cuda) or packed.device != scales.device:
        raise ValueError("packed and scales must be on the same CUDA device")
    if not (packed.is_contiguous() and scales.is_contiguous()):
        raise ValueError("packed and scales must be contiguous")
    if out is None:
        out = torch.empty(blocks * 16, kp, dtype=torch.bfloat16, device=packed.device)
    elif out.dtype != torch.bfloat16 or out.device != packed.device or not out.is_contiguous() \
            or out.numel() != blocks * 16 * kp:
        raise ValueError(f"out must be a contiguous bf16 [{blocks * 16}, {kp}] tensor on {packed.device}")
    stream = torch.cuda.current_stream(packed.device).cuda_stream
    err = lib.lk_dequant_blocks(packed.data_ptr(), scales.data_ptr(), out.data_ptr(), blocks, kp, seg,
                                CODES[codes], stream)
    if err:
        raise RuntimeError(f"lk_dequant_blocks failed with CUDA error {err}")
    return out



def dequant_w13(slices, kp1: int, seg: int, codes: str, impl: str = "auto") -> torch.Tensor:
    """Per NUMA slice (codes uint8 [e, nbi, 2, kp1/2, 16, 2], scales fp32 [e, nbi, 2, P]), as
    `Layer.quant_slices()` gives them (or their copies on a GPU) -> bf16 [e, 2*kp2, kp1]."""
    parts = []
    for c, s in slices:
        e, nbi = c.shape[0], c.shape[1]
        parts.append(dequantize(c, s, kp1, seg, codes, impl).view(e, nbi, 2, 16, kp1))
    return rows_w13(parts)


def dequant_w2(slices, kp2: int, seg: int, codes: str, impl: str = "auto") -> torch.Tensor:
    """Per NUMA slice (codes uint8 [e, nbh, kp2/2, 16, 2], scales fp32 [e, nbh, P]) -> bf16 [e, h_pad, kp2]."""
    parts = []
    for c, s in slices:
        e, nbh = c.shape[0], c.shape[1]
        parts.append(dequantize(c, s, kp2, seg, codes, impl).view(e, nbh, 16, kp2))
    return rows_w2(parts)


# -- 4-bit formats: plain torch on the engine's packed blocks (Layer.quant4_slices), any device.
# Block layout (moe_layer.cpp pack_fp4): 16 output rows x kp inputs in kp/4 quads of 32 bytes; byte
# (q, n, j) holds element (n, 4q + j) in its low nibble and (n, 4q + 2 + j) in its high one.
# wna16_int4 (pack_int4) groups the same bytes in kp/8 octets of 64: byte (o, n, j) holds element
# (n, 8o + j) low and (n, 8o + 4 + j) high (the order of its int8-activation decode kernel).
# Values are what the CPU engine computes with, rounded to bf16 once:
#   wna16_int4: (u - z) x scale (z = 8 without zero points): the exact product (4 x 11 bits at most)
#     rounded to bf16 once (the engine keeps u - z in bf16 and applies the scale to fp32 sums);
#   mxfp4: e2m1 x 2^(s - 127): exact in bf16, as the engine's prefill dequantizes it;
#   nvfp4: e2m1 x fp8 scale (exact in bf16, as in the engine) x the fp32 global scale of the expert
#     projection: the fp32 product rounded to bf16 (the engine applies the global scale to fp32 sums).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_BF16 = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), dtype=torch.bfloat16)  # by code, bit 3 = sign
# e8m0 byte s -> 2^(s - 127) (s = 0: 2^-127, a bf16 subnormal; 255: NaN), exact in bf16.
_E8M0_BF16 = torch.tensor([2.0 ** (s - 127) for s in range(255)] + [float("nan")], dtype=torch.bfloat16)
_SCALE_DTYPES = {"wna16_int4": (torch.bfloat16, torch.float16), "mxfp4": (torch.uint8,),
                 "nvfp4": (torch.float8_e4m3fn,)}


def _nibble_rows(codes: torch.Tensor, octets: bool = False) -> torch.Tensor:
    """uint8 blocks [..., kp/4, 16, 2] (octets: the int4 order) -> uint8 codes [..., 16, kp] in row order."""
    lead, kp = codes.shape[:-3], codes.shape[-3] * 4
    if octets:
        codes = codes.reshape(*lead, kp // 8, 16, 4)
    v = torch.stack((codes & 15, codes >> 4), dim=-2)  # [..., o, n, h, j]: element w*o + w/2*h + j of row n
    return v.transpose(-4, -3).reshape(*lead, 16, kp)


_tables: dict = {}  # (table id, device) -> the table on that device


def _lookup(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    key = (id(table), idx.device)
    if key not in _tables:
        _tables[key] = table.to(idx.device)
    return _tables[key].index_select(0, idx.reshape(-1).int()).view(idx.shape)


def dequant4_blocks(format: str, codes: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor] = None,
                    global_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """4-bit blocks (as Layer.quant4_slices gives them, or their copies on a GPU) -> bf16 [..., 16, kp].

    codes uint8 [..., kp/4, 16, 2]; scales [..., kp/G, 16], one per row and G inputs: wna16_int4 bf16 or
    fp16, mxfp4 uint8 e8m0, nvfp4 float8_e4m3fn; zeros (wna16_int4 with zero points) uint8
    [..., kp/G, 8], row n's in nibble n % 2 of byte n / 2 (None: the symmetric 8); global_scale (nvfp4,
    required) fp32 broadcastable to the result, e.g. [e, 1, 2, 1, 1] for w13 blocks [e, nbi, 2, ...]."""
    if format not in FOUR_BIT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(FOUR_BIT_FORMATS)}, got {format!r}")
    if codes.dtype != torch.uint8 or codes.dim() < 3 or tuple(codes.shape[-2:]) != (16, 2):
        raise ValueError(f"codes must be uint8 [..., kp/4, 16, 2], got {codes.dtype} {list(codes.shape)}")
    lead, kp = tuple(codes.shape[:-3]), codes.shape[-3] * 4
    if scales.dtype not in _SCALE_DTYPES[format]:
        raise ValueError(f"{format} scales must be {' or '.join(map(str, _SCALE_DTYPES[format]))}, got {scales.dtype}")
    if scales.dim() != codes.dim() - 1 or tuple(scales.shape[:-2]) != lead or scales.shape[-1] != 16 \
            or scales.shape[-2] < 1 or kp % scales.shape[-2]:
        raise ValueError(f"scales must be [..., kp/G, 16] with the codes' leading dims {list(lead)} and G dividing "
                         f"kp={kp}, got {list(scales.shape)}")
    groups = scales.shape[-2]
    if zeros is not None:
        if format != "wna16_int4":
            raise ValueError(f"{format} has no zero points")
        if zeros.dtype != torch.uint8 or tuple(zeros.shape) != lead + (groups, 8):
            raise ValueError(f"zeros must be uint8 {list(lead + (groups, 8))}, got {zeros.dtype} {list(zeros.shape)}")
    if (global_scale is not None) != (format == "nvfp4"):
        raise ValueError("nvfp4 needs its fp32 global scale" if format == "nvfp4"
                         else f"{format} takes no global scale")
    if global_scale is not None and global_scale.dtype != torch.float32:
        raise ValueError(f"global_scale must be float32, got {global_scale.dtype}")
    c = _nibble_rows(codes, octets=format == "wna16_int4").unflatten(-1, (groups, kp // groups))  # [..., 16, G, kp/G]
    s = scales.transpose(-1, -2).unsqueeze(-1)                      # [..., 16, G, 1]
    out = torch.empty(c.shape, dtype=torch.bfloat16, device=codes.device)
    if format == "wna16_int4":
        if zeros is None:
            d = c.to(torch.bfloat16) - 8
        else:
            z = torch.stack((zeros & 15, zeros >> 4), dim=-1).flatten(-2)  # [..., G, 16]: row n's zero point
            d = c.to(torch.bfloat16) - z.transpose(-1, -2).unsqueeze(-1).to(torch.bfloat16)
        torch.mul(d, s, out=out)  # u - z is exact in bf16; the product is rounded once (fp16 scales: in fp32)
    else:
        v = _lookup(_E2M1_BF16, c)
        sv = _lookup(_E8M0_BF16, s) if format == "mxfp4" else s.to(torch.bfloat16)
        torch.mul(v, sv, out=out)  # exact: <= 6 significant bits
        if global_scale is not None:
            torch.mul(out, global_scale.unsqueeze(-1), out=out)  # fp32 product, rounded to bf16
    return out.flatten(-2)


# Experts dequantized per pass: dequant4_blocks' temporaries (both nibbles, int32 lookup indices,
# values) take ~9 bytes per weight, so a 256 MiB staging slot of 4-bit experts at once would need
# ~4.5 GiB of GPU memory beside its 1 GiB bf16 result; groups of <= 2^26 weights (~0.6 GiB of
# temporaries) keep that small on small GPUs for a few more launches per slot.
DEQUANT4_GROUP_WEIGHTS = 1 << 26


def _expert_groups(slices, max_weights: int, weights_per_byte: int = 2):
    """[e0, e1) ranges over the experts (dim 0 of every tensor) of <= max_weights weights each (>= 1 expert);
    the first tensor of each slice holds the codes, `weights_per_byte` weights a byte."""
    experts = slices[0][0].shape[0]
    if experts == 0:
        return [(0, 0)]
    per_expert = sum(sl[0][0].numel() * weights_per_byte for sl in slices)
    step = max(1, max_weights // max(per_expert, 1))
    return [(e0, min(e0 + step, experts)) for e0 in range(0, experts, step)]


def _grouped(slices, blocks, to_rows, max_weights, weights_per_byte):
    """to_rows([blocks(slice's tensors cut to experts [e0, e1)) per slice]) over groups of experts of
    <= max_weights weights (default DEQUANT4_GROUP_WEIGHTS), filling one result (no second full-size copy)."""
    max_weights = DEQUANT4_GROUP_WEIGHTS if max_weights is None else max_weights
    groups = _expert_groups(slices, max_weights, weights_per_byte)
    out = None
    for e0, e1 in groups:
        rows = to_rows([blocks(*(None if t is None else t[e0:e1] for t in sl)) for sl in slices])
        if len(groups) == 1:
            return rows
        if out is None:
            out = torch.empty((groups[-1][1],) + tuple(rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        out[e0:e1].copy_(rows)
    return out


def _dequant4_grouped(format, slices, g, to_rows, max_weights):
    return _grouped([(c, s, z, g) for c, s, z in slices], lambda c, s, z, gs: dequant4_blocks(format, c, s, z, gs),
                    to_rows, max_weights, weights_per_byte=2)


def dequant4_w13(format: str, slices, global_scales: Optional[torch.Tensor] = None,
                 max_weights: Optional[int] = None) -> torch.Tensor:
    """Per NUMA slice (codes [e, nbi, 2, kp1/4, 16, 2], scales [e, nbi, 2, kp1/G, 16], zeros or None), as
    Layer.quant4_slices gives them (or their GPU copies); nvfp4: global_scales fp32 [e, 2] (gate, up)
    -> bf16 [e, 2*kp2, kp1]. Experts go in groups of <= max_weights weights (default DEQUANT4_GROUP_WEIGHTS)."""
    g = None if global_scales is None else global_scales.reshape(-1, 1, 2, 1, 1)
    return _dequant4_grouped(format, slices, g, rows_w13, max_weights)


def dequant4_w2(format: str, slices, global_scales: Optional[torch.Tensor] = None,
                max_weights: Optional[int] = None) -> torch.Tensor:
    """Per NUMA slice (codes [e, nbh, kp2/4, 16, 2], scales [e, nbh, kp2/G, 16], zeros or None); nvfp4:
    global_scales fp32 [e] -> bf16 [e, h_pad, kp2]. Experts go in groups of <= max_weights weights."""
    g = None if global_scales is None else global_scales.reshape(-1, 1, 1, 1)
    return _dequant4_grouped(format, slices, g, rows_w2, max_weights)


# -- mxfp8: e4m3 codes in the byte formats' block layout (see the top), e8m0 scales [..., kp/32, 16] (one per
# row and 32 inputs, as Layer.quant_slices gives them). Each value is code x 2^(s - 127) rounded to bf16 once:
# exact (4 significant bits, in bf16's range) except where it falls among bf16's subnormals (below 2^-126);
# the CPU engine computes with the same codes in bf16 and applies the power of two to fp32 sums.
def dequant_mx_blocks(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """mxfp8 blocks -> bf16 [..., 16, kp]: codes uint8 [..., kp/2, 16, 2] (byte (k/2, n, k&1): row n,
    input k), scales uint8 [..., kp/32, 16] with the codes' leading dims. Plain torch, any device."""
    if codes.dtype != torch.uint8 or codes.dim() < 3 or tuple(codes.shape[-2:]) != (16, 2):
        raise ValueError(f"codes must be uint8 [..., kp/2, 16, 2], got {codes.dtype} {list(codes.shape)}")
    lead, kp = tuple(codes.shape[:-3]), codes.shape[-3] * 2
    if kp % 32 or scales.dtype != torch.uint8 or tuple(scales.shape) != lead + (kp // 32, 16):
        raise ValueError(f"mxfp8 scales must be uint8 {list(lead + (kp // 32, 16))} for codes {list(codes.shape)} "
                         f"(kp a multiple of 32), got {scales.dtype} {list(scales.shape)}")
    rows = codes.transpose(-3, -2).contiguous().view(torch.float8_e4m3fn).reshape(*lead, 16, kp // 32, 32)
    s = _lookup(_E8M0_BF16, scales).transpose(-1, -2).unsqueeze(-1)  # [..., 16, kp/32, 1]
    out = torch.empty(rows.shape, dtype=torch.bfloat16, device=codes.device)
    torch.mul(rows.to(torch.bfloat16), s, out=out)  # e4m3 -> bf16 is exact; the product rounds once
    return out.flatten(-2)


def dequant_mx_w13(slices, max_weights: Optional[int] = None) -> torch.Tensor:
    """Per NUMA slice (codes uint8 [e, nbi, 2, kp1/2, 16, 2], scales uint8 [e, nbi, 2, kp1/32, 16]) -> bf16
    [e, 2*kp2, kp1]. Experts go in groups of <= max_weights weights (default DEQUANT4_GROUP_WEIGHTS)."""
    return _grouped(slices, dequant_mx_blocks, rows_w13, max_weights, weights_per_byte=1)


def dequant_mx_w2(slices, max_weights: Optional[int] = None) -> torch.Tensor:
    """Per NUMA slice (codes uint8 [e, nbh, kp2/2, 16, 2], scales uint8 [e, nbh, kp2/32, 16]) -> bf16 [e, h_pad, kp2]."""
    return _grouped(slices, dequant_mx_blocks, rows_w2, max_weights, weights_per_byte=1)
