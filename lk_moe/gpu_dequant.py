"""Dequantize the engine's packed byte blocks (FP8 E4M3 or INT8 codes) into plain bf16 rows on the
GPU: the fallback for GPUs without a native kernel for the format (csrc/cuda/dequant_blocks.cu,
built for sm_75..sm_120), with a plain-torch twin that defines the result and runs anywhere.

Layout (see lk_moe.gpu_layout): a block is 16 output rows of `kp` inputs; byte
(k/2)*32 + 2n + (k&1) holds row n, input k. Scales (fp32): [blocks, 16] one per row, or
[blocks, kp/seg] one per segment of `seg` inputs (shared by the block's 16 rows).
Result: bf16 [blocks*16, kp], row b*16+n = block b's row n, each value code * scale rounded once.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

import torch

CODES = {"fp8_e4m3": 0, "int8": 1}
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

