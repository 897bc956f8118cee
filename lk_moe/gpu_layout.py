"""Turn the engine's packed expert blocks back into plain matrices, on any device.

The CPU engine keeps each expert once, in 16-row blocks with input pairs interleaved
(element (n, k) of a block at (k/2)*32 + 2n + (k&1)), split across NUMA slices. The streamed
GPU path copies those bytes as they are (no second host copy in another layout) and unpacks
them on the GPU with one permute per tensor: a copy at GPU memory speed, negligible next to
the PCIe transfer.

Shapes are padded: H -> kp1 (multiple of 32), I -> kp2 (multiple of 32), and the down
projection's rows -> h_pad (multiple of 16). Padding holds zeros, so computing with padded
matrices and slicing the output gives the exact result.

Byte-weight layers (fp8_block, fp8_channel, int8_channel) keep one byte per weight in the same
block layout; lk_moe.gpu_dequant turns their blocks into bf16 rows (row order within a block),
and `rows_w13` / `rows_w2` put those rows in the same plain matrices as `unpack_w13` / `unpack_w2`.
"""
from __future__ import annotations

from typing import Sequence

import torch


def unpack_w13(slices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Packed w13 slices [e, nbi_s, 2, kp1/2, 16, 2] -> [e, 2*kp2, kp1] (gate rows, then up rows)."""
    parts = []
    for p in slices:
        e, nbi, _, half, _, _ = p.shape
        # -> [e, 2 (gate/up), nbi, 16 (rows), kp1/2, 2]
        parts.append(p.permute(0, 2, 1, 4, 3, 5).reshape(e, 2, nbi * 16, half * 2))
    full = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    return full.reshape(full.shape[0], -1, full.shape[-1])


def unpack_w2(slices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Packed w2 slices [e, nbh_s, kp2/2, 16, 2] -> [e, h_pad, kp2]."""
    parts = []
    for p in slices:
        e, nbh, half, _, _ = p.shape
        parts.append(p.permute(0, 1, 3, 2, 4).reshape(e, nbh * 16, half * 2))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def blocks_w13(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per NUMA slice [e, nbi_s, 2, *rest] (16-row blocks, gate then up) -> [e, 2*nbi, *rest]: the gate
    blocks of every slice in order, then the up blocks."""
    out = [p.transpose(1, 2) for p in parts]
    full = torch.cat(out, dim=2) if len(out) > 1 else out[0]
    return full.reshape(full.shape[0], -1, *full.shape[3:])


def blocks_w2(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per NUMA slice [e, nbh_s, *rest] -> [e, nbh, *rest]."""
    return torch.cat(list(parts), dim=1) if len(parts) > 1 else parts[0]


def rows_w13(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dequantized w13 slices [e, nbi_s, 2, 16, kp1] (block rows in order) -> [e, 2*kp2, kp1]."""
    return blocks_w13(parts).flatten(1, 2)


def rows_w2(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dequantized w2 slices [e, nbh_s, 16, kp2] -> [e, h_pad, kp2]."""
    return blocks_w2(parts).flatten(1, 2)
