"""`lk_moe.HybridMoE`: one MoE layer's routed experts for a model running on a GPU.

Three paths, chosen per call:
1. CPU path (M < gpu_min_batch, always for decode): `CpuExpertPath`, graph-capturable.
2. Streamed GPU path (M >= gpu_min_batch): the layer's packed expert bytes travel from pinned
   host memory through a bounded ring of staging slots (`ExpertStreamer`) on a copy stream,
   overlapped with compute; once a layer has issued its own copies, the ring's free slots start
   on the next linked layer (prefetch window of one layer). Only routed experts travel when a
   batch routes to less than half of them.
3. Resident (resident=True): the experts are unpacked on the GPU once and stay there.

Formats with a GPU path (`lk_moe.gpu_dequant.GPU_FORMATS`): bf16 (the packed bf16 blocks travel and
are permuted into plain matrices); the byte formats fp8_block, fp8_channel, int8_channel: their
one-byte codes and fp32 scales travel as the engine keeps them (about half the bytes of bf16), are
dequantized on the GPU to bf16 (code x scale rounded to bf16 once: the fallback kernel of
lk_moe.gpu_dequant, or its torch twin) and computed by the same bf16 GEMMs; mxfp8 the same with its
e8m0 scales (one byte per row and 32 inputs), dequantized by torch ops (gpu_dequant.dequant_mx_blocks);
and the 4-bit formats wna16_int4, mxfp4, nvfp4: their 4-bit codes, scales (int4 zero points, mxfp4
biases, nvfp4 global scales) travel as the engine keeps them (about a quarter of the bytes of bf16) and
are dequantized to bf16 on the GPU by plain torch ops (lk_moe.gpu_dequant.dequant4_blocks); mxfp4
layers keep their biases and activation (swigluoai) on the GPU too.

Where vLLM has a fused-MoE kernel for the format on this GPU (lk_moe.gpu_native: fp8_block and
fp8_channel from sm_89, int8_channel and wna16_int4 from sm_80), the same streamed bytes are instead
rearranged on the GPU into that kernel's layout and computed by it from their codes ("native";
`gpu_path` / `gpu_path_reason` say which path a layer takes and why; LK_FORCE_GPU_FALLBACK=1 or
force_fallback=True forces the fallback).

The streamed path syncs once per forward (the per-expert token counts) and is meant for eager
prefill; decode and captured graphs use the CPU path.
"""
from __future__ import annotations

import collections
import logging
from typing import List, Optional

import torch
import torch.nn.functional as F

from . import gpu_dequant, gpu_native
from .cpu_path import CpuExpertPath, PinnedIO
from .gpu_experts import RoutedBatch, experts_forward
from .gpu_layout import rows_w13, rows_w2, unpack_w13, unpack_w2
from .layer import MoELayer

logger = logging.getLogger(__name__)


# The parts of a 4-bit layer's slice (Layer.quant4_slices), in transfer order; a layer has zero
# points (int4) or biases (mxfp4) in every slice or in none.
QUANT4_PARTS = ("w13", "s13", "z13", "b13", "w2", "s2", "z2", "b2")


def quant4_parts(layer: MoELayer) -> tuple:
    """The QUANT4_PARTS a 4-bit layer has."""
    first = layer._impl.quant4_slices()[0]
    return tuple(k for k in QUANT4_PARTS if k in first)


def gpu_sources(layer: MoELayer) -> list:
    """Per NUMA slice, the host tensors one expert's GPU copy is made of, in transfer order, each
    with the expert as dim 0: bf16 (w13, w2) packed blocks; byte formats (w13 codes, w13 scales,
    w2 codes, w2 scales; mxfp8's scales e8m0 bytes); 4-bit formats the layer's `quant4_parts`, and
    for nvfp4 one more entry after the slices: the per-expert global scales (w13 [E, 2], w2 [E]).
    ValueError for a format without a GPU path."""
    fmt = layer.format
    if fmt == "bf16":
        return [tuple(s[:2]) for s in layer._impl.packed_slices()]
    if fmt in gpu_dequant.BYTE_FORMATS:
        return [tuple(s[:4]) for s in layer._impl.quant_slices()]
    if fmt in gpu_dequant.FOUR_BIT_FORMATS:
        parts = quant4_parts(layer)
        sources = [tuple(d[k] for k in parts) for d in layer._impl.quant4_slices()]
        if fmt == "nvfp4":
            sources.append(tuple(layer._impl.global_scales()))
        return sources
    raise ValueError(f"GPU streaming and GPU-resident layers take {', '.join(gpu_dequant.GPU_FORMATS)} experts; "
                     f"this layer is {fmt} (use the CPU path: gpu_min_batch=0, resident=False)")


def _bytes_per_expert(t: torch.Tensor) -> int:
    return (t.numel() // t.shape[0]) * t.element_size() if t.shape[0] else 0


def streamed_expert_bytes(layer: MoELayer) -> int:
    """Bytes one expert of `layer` takes over PCIe (and in a staging slot) on the streamed GPU path:
    the engine's packed, block-padded copy (byte formats: codes + fp32 scales, mxfp8 e8m0 ones; 4-bit
    formats: codes, scales, zero points or biases, nvfp4 global scales)."""
    return sum(_bytes_per_expert(t) for srcs in gpu_sources(layer) for t in srcs)


def _runs(chunk: List[int]):
    """Sorted expert ids -> [start, end) runs of consecutive ids."""
    runs = []
    start = prev = chunk[0]
    for e in chunk[1:]:
        if e != prev + 1:
            runs.append((start, prev + 1))
            start = e
        prev = e
    runs.append((start, prev + 1))
    return runs


def check_dequant(fmt: str, dequant: str) -> None:
    """ValueError for a `dequant` choice the format cannot take."""
    if dequant not in gpu_dequant.IMPLS:
        raise ValueError(f"dequant must be one of {', '.join(gpu_dequant.IMPLS)}, got {dequant!r}")
    if fmt in gpu_dequant.TORCH_DEQUANT_FORMATS and dequant == "kernel":
        raise ValueError(f"{fmt} experts have no dequantization kernel: they are dequantized by torch ops on the GPU "
                         "(dequant='auto' or 'torch')")


class GpuCopyLayout:
    """How one layer's experts travel to the GPU and become plain bf16 matrices there. Pure torch on
    any device (the CPU tests run it with CPU buffers and the torch twin of the dequant kernel).

    A chunk of n experts in a staging buffer: per NUMA slice, each source of `gpu_sources` (bf16: w13,
    w2; byte formats: w13 codes, w13 scales, w2 codes, w2 scales; 4-bit formats: `quant4_parts`, then
    the nvfp4 global scales) for the chunk's experts in order, n * expert_bytes in all. Every piece is
    a multiple of 4 bytes, so each lies 4-byte aligned.

    dequant_impl (byte formats): "kernel", "torch" or "auto" (lk_moe.gpu_dequant.dequantize); the 4-bit
    formats and mxfp8 are dequantized by plain torch ops ("torch"; "kernel" is refused)."""

    def __init__(self, layer: MoELayer, dequant_impl: str = "torch"):
        self.format = layer.format
        self.sources = gpu_sources(layer)
        self.kp1, self.kp2, self.h_pad = layer._impl.padded_dims
        self.codes, self.seg = layer._impl.byte_codes or (None, 0)
        check_dequant(self.format, dequant_impl)
        self.four_bit = self.format in gpu_dequant.FOUR_BIT_FORMATS
        self.mx = self.format in gpu_dequant.MX_BYTE_FORMATS
        self.parts = quant4_parts(layer) if self.four_bit else ()
        self.num_slices = layer.num_slices
        torch_only = self.format in gpu_dequant.TORCH_DEQUANT_FORMATS
        self.dequant_impl = "torch" if torch_only else dequant_impl if self.codes is not None else None
        for srcs in self.sources:
            for t in srcs:
                if _bytes_per_expert(t) % 4:
                    raise AssertionError(f"packed piece of {_bytes_per_expert(t)} bytes per expert breaks alignment")
        self.expert_bytes = sum(_bytes_per_expert(t) for srcs in self.sources for t in srcs)

    def chunk_sources(self, chunk: List[int]):
        """The host tensors of a chunk (sorted expert ids), in buffer order."""
        runs = _runs(chunk)
        for srcs in self.sources:
            for t in srcs:
                for a, b in runs:
                    yield t[a:b]

    def chunk_bytes(self, n: int) -> int:
        return n * self.expert_bytes

    def copy_chunk(self, buf: torch.Tensor, chunk: List[int], non_blocking: bool = False) -> int:
        """Copy a chunk's bytes into the uint8 buffer `buf` (on the current stream); returns the bytes."""
        off = 0
        for src in self.chunk_sources(chunk):
            n = src.numel() * src.element_size()
            if n:
                buf[off:off + n].view(src.dtype).view(src.shape).copy_(src, non_blocking=non_blocking)
            off += n
        return off

    def slot_views(self, buf: torch.Tensor, n: int):
        """A chunk of n experts in `buf`, as per-slice tensors shaped like `gpu_sources`."""
        off = 0
        per_slice = []
        for srcs in self.sources:
            views = []
            for t in srcs:
                size = n * _bytes_per_expert(t)
                views.append(buf[off:off + size].view(t.dtype).view((n,) + tuple(t.shape[1:])))
                off += size
            per_slice.append(views)
        return per_slice

    def unpack(self, per_slice):
        """Per NUMA slice, one chunk's tensors (shaped like `gpu_sources`, n experts, on one device) ->
        plain bf16 w13 [n, 2*kp2, kp1], w2 [n, h_pad, kp2]. Byte formats: each weight code x scale
        rounded to bf16 once (lk_moe.gpu_dequant; mxfp8: dequant_mx_blocks); 4-bit formats: see
        gpu_dequant.dequant4_blocks."""
        if self.four_bit:
            slices = [dict(zip(self.parts, v)) for v in per_slice[:self.num_slices]]
            g13, g2 = per_slice[self.num_slices] if self.format == "nvfp4" else (None, None)
            return (gpu_dequant.dequant4_w13(self.format, [(p["w13"], p["s13"], p.get("z13")) for p in slices], g13),
                    gpu_dequant.dequant4_w2(self.format, [(p["w2"], p["s2"], p.get("z2")) for p in slices], g2))
        if self.mx:
            return (gpu_dequant.dequant_mx_w13([(v[0], v[1]) for v in per_slice]),
                    gpu_dequant.dequant_mx_w2([(v[2], v[3]) for v in per_slice]))
        if self.codes is None:
            return unpack_w13([v[0] for v in per_slice]), unpack_w2([v[1] for v in per_slice])
        return (gpu_dequant.dequant_w13([(v[0], v[1]) for v in per_slice], self.kp1, self.seg, self.codes,
                                        self.dequant_impl),
                gpu_dequant.dequant_w2([(v[2], v[3]) for v in per_slice], self.kp2, self.seg, self.codes,
                                       self.dequant_impl))

    def biases(self, per_slice):
        """mxfp4 layers with biases: (b13 [n, 2*kp2] gate then up, b2 [n, h_pad]) bf16 from one chunk's
        tensors (as for `unpack`); None for layers without biases."""
        if "b13" not in self.parts:
            return None
        slices = [dict(zip(self.parts, v)) for v in per_slice[:self.num_slices]]
        return (rows_w13([p["b13"].unsqueeze(-1) for p in slices]).squeeze(-1),
                rows_w2([p["b2"].unsqueeze(-1) for p in slices]).squeeze(-1))

    def unpack_slot(self, buf: torch.Tensor, n: int):
        return self.unpack(self.slot_views(buf, n))


class ExpertStreamer:
    """A bounded ring of GPU staging slots fed by one copy stream, shared by the layers of a model.

    Memory = slots x slot_bytes, independent of the model size. Copies are issued in ring order and
    consumed in the same order, so a slot is always reused by the copy issued `slots` copies later,
    after the consumer recorded that it is done with it."""

    def __init__(self, slot_bytes: int, slots: int, device=None):
        if slots < 2:
            raise ValueError("the staging ring needs at least 2 slots")
        self.device = torch.device(device or "cuda")
        self.slot_bytes = slot_bytes
        self.copy_stream = torch.cuda.Stream(self.device)
        self.slots = [torch.empty(slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(slots)]
        self.copied = [torch.cuda.Event() for _ in range(slots)]
        self.freed = [torch.cuda.Event() for _ in range(slots)]
        self._next = 0
        self.prefetched = collections.deque()  # (layer, chunk, slot) issued ahead of their layer
        self.bytes_copied = 0

    @property
    def nbytes(self) -> int:
        return len(self.slots) * self.slot_bytes

    def issue(self, layer: "HybridMoE", chunk: List[int]) -> int:
        slot = self._next
        self._next = (slot + 1) % len(self.slots)
        buf = self.slots[slot]
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.freed[slot])
            layer.copy_layout.copy_chunk(buf, chunk, non_blocking=True)
            self.copied[slot].record(self.copy_stream)
        self.bytes_copied += layer.copy_layout.chunk_bytes(len(chunk))
        return slot

    def consume(self, slot: int) -> torch.Tensor:
        torch.cuda.current_stream().wait_event(self.copied[slot])
        return self.slots[slot]

    def release(self, slot: int) -> None:
        self.freed[slot].record(torch.cuda.current_stream())


class HybridMoE:
    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, *, max_tokens: int, top_k: int,
                 gpu_min_batch: int = 0, resident: bool = False, streamer: Optional[ExpertStreamer] = None,
                 dtype=torch.bfloat16, pool=None, signal: str = "auto", layer: Optional[MoELayer] = None,
                 io: Optional[PinnedIO] = None, dequant: str = "auto", force_fallback: Optional[bool] = None):
        """w13 [E, 2I, H], w2 [E, H, I] on the CPU (vLLM layouts), or an existing `layer` (any format;
        GPU paths for those in lk_moe.gpu_dequant.GPU_FORMATS).
        gpu_min_batch: smallest M that takes the streamed GPU path (0: never, CPU-only prefill).
        streamer: the shared staging ring (made to fit this layer if omitted).
        io: the CPU path's pinned buffers, shared by the layers of one model (made if omitted).
        dequant (byte formats): "auto" (the CUDA fallback kernel where it runs on this GPU, else its
        torch twin, with a warning), "kernel" or "torch" (forced). Both give the same bf16 bits.
        4-bit formats and mxfp8: "auto" or "torch" (plain torch ops on the GPU; they have no kernel).
        force_fallback: the quantized formats' path choice (default LK_FORCE_GPU_FALLBACK), see
        lk_moe.gpu_dequant.gpu_path: True forces the fallback; otherwise a format with a native kernel
        on this GPU takes it (lk_moe.gpu_native), and a failure of that kernel at construction raises
        (no silent fallback)."""
        if not torch.cuda.is_available():
            raise RuntimeError("HybridMoE needs a CUDA device; use lk_moe.MoELayer for CPU-only work")
        if gpu_min_batch < 0:
            raise ValueError("gpu_min_batch must be >= 0 (0 = never use the GPU path)")
        self.layer = layer if layer is not None else MoELayer(w13, w2, pool=pool)
        self.top_k, self.dtype = top_k, dtype
        self.num_experts = self.layer.num_experts
        self.hidden = self.layer.hidden_size
        self.kp1, self.kp2, self.h_pad = self.layer._impl.padded_dims
        self.gpu_min_batch = gpu_min_batch
        self.cpu_path = CpuExpertPath(self.layer, max_tokens=max_tokens, top_k=top_k, dtype=dtype, signal=signal, io=io)
        self.next_layer: Optional[HybridMoE] = None
        self.format = self.layer.format
        # The packed host copy is needed only by the GPU paths.
        needs_gpu_copy = resident or gpu_min_batch > 0
        self.gpu_path, self.gpu_path_reason = None, None
        self.copy_layout: Optional[GpuCopyLayout] = None
        self.native: Optional[gpu_native.NativeExperts] = None
        if needs_gpu_copy:
            gpu_sources(self.layer)  # a format without a GPU path: ValueError naming it
            check_dequant(self.format, dequant)  # a bad argument before vLLM's kernel is looked for
            self.gpu_path, self.gpu_path_reason = gpu_dequant.gpu_path(self.format, force_fallback=force_fallback,
                                                                       activation=self.layer.activation)
            if self.gpu_path == "native":  # vLLM's kernel, checked once here (raises naming the way out)
                self.native = gpu_native.NativeExperts(
                    self.format, self.layer._impl.padded_dims,
                    quant4_parts(self.layer) if self.format in gpu_dequant.FOUR_BIT_FORMATS else (),
                    activation=self.layer.activation)
            if self.format in gpu_dequant.TORCH_DEQUANT_FORMATS:  # torch ops; GpuCopyLayout refuses "kernel"
                impl = "torch" if dequant == "auto" else dequant
            else:
                impl = self._pick_dequant(dequant) if self.gpu_path == "fallback" else "torch"
            self.copy_layout = GpuCopyLayout(self.layer, impl)
        # The engine's activation (silu_clamp, situ, or mxfp4's swigluoai) and its two constants, applied by the GPU
        # paths too.
        self.activation = self.layer.activation
        self.swiglu = tuple(self.layer._impl.swiglu)
        # What dequantizes the weights (None: nothing does, bf16 or the native path).
        self.dequant_impl = self.copy_layout.dequant_impl if self.copy_layout and self.native is None else None
        self.expert_bytes = self.copy_layout.expert_bytes if self.copy_layout else 0
        self.resident = resident
        self._resident_w = self._resident_b = self._resident_native = None
        self.streamer = streamer
        if resident:
            on_gpu = [[t.cuda() for t in srcs] for srcs in self.copy_layout.sources]
            if self.native is not None:  # the codes stay quantized, in the kernel's layout
                self._resident_native = self.native.relayout(on_gpu)
            else:
                self._resident_w = self.copy_layout.unpack(on_gpu)
                self._resident_b = self.copy_layout.biases(on_gpu)
        elif gpu_min_batch > 0:
            # Page-lock the engine's own copy in place (fast async H2D, no second host copy);
            # unregistered when the layer is freed.
            self.layer._impl.pin_for_gpu()
            if self.streamer is None:
                per_slot = max(1, min(self.num_experts, (256 << 20) // self.expert_bytes))
                self.streamer = ExpertStreamer(per_slot * self.expert_bytes, slots=4)
            if self.streamer.slot_bytes < self.expert_bytes:
                raise ValueError("staging slot smaller than one expert")
        self.experts_per_chunk = (self.streamer.slot_bytes // self.expert_bytes) if self.streamer and self.expert_bytes else 0

    def _pick_dequant(self, want: str) -> str:
        if want not in gpu_dequant.IMPLS:
            raise ValueError(f"dequant must be one of {', '.join(gpu_dequant.IMPLS)}, got {want!r}")
        if want != "auto":
            return want
        if gpu_dequant.kernel_usable():
            return "kernel"
        why = gpu_dequant.library_error() or (f"built for sm_{', sm_'.join(gpu_dequant.compiled_archs())}, not for "
                                              f"this GPU (sm_{''.join(map(str, torch.cuda.get_device_capability()))})")
        logger.warning("lk_moe: %s experts: GPU dequantization kernel unavailable (%s); using its torch twin "
                       "(same result, slower)", self.format, why)
        return "torch"

    def link_next(self, other: "HybridMoE") -> None:
        """The layer that runs after this one: its first chunks are prefetched during this one."""
        self.next_layer = other

    def _full_chunks(self) -> List[List[int]]:
        n = self.experts_per_chunk
        return [list(range(a, min(a + n, self.num_experts))) for a in range(0, self.num_experts, n)]

    # -- forward
    def takes_gpu_path(self, tokens: int) -> bool:
        """Whether `forward` of this many tokens runs on the GPU (resident or streamed)."""
        return self.resident or (self.gpu_min_batch > 0 and tokens >= self.gpu_min_batch)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, cache=None) -> torch.Tensor:
        """cache: the layer's lk_moe.expert_cache.LayerCache: its experts are computed from their
        GPU slots, only the others are streamed (or computed on the CPU)."""
        M = x.shape[0]
        if not self.takes_gpu_path(M):
            if cache is not None:
                return cache.forward(x, topk_ids, topk_weights, self.cpu_path)
            return self.cpu_path(x, topk_ids, topk_weights)
        if not x.is_cuda or x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be a CUDA [M, {self.hidden}] {self.dtype} tensor")
        if topk_ids.dtype != torch.int32 or topk_weights.dtype != torch.float32:
            raise TypeError("topk_ids must be int32 and topk_weights float32")
        if tuple(topk_ids.shape) != (M, self.top_k) or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_ids/topk_weights must be [M, {self.top_k}] = [{M}, {self.top_k}]")
        if topk_ids.device != x.device or topk_weights.device != x.device:
            raise ValueError("x, topk_ids and topk_weights must be on the same CUDA device")
        cached = None
        if cache is not None:
            gpu_ids, topk_ids = cache.split(topk_ids)
            cached = cache.gpu_part(x, gpu_ids, topk_weights)
        batch = RoutedBatch(topk_ids, topk_weights, self.num_experts)
        x_pad = F.pad(x, (0, self.kp1 - self.hidden)) if self.kp1 != self.hidden else x
        acc = torch.zeros(M, self.h_pad, dtype=torch.float32, device=x.device)
        if cached is not None:
            acc[:, :self.hidden] += cached.float()
        ids = None
        if self.native is not None:  # vLLM's kernel reads x by rows; -1 ids mapped for its expert maps
            x_pad, ids = x_pad.contiguous(), gpu_native.NativeExperts.map_ids(topk_ids, self.num_experts)
        if self._resident_native is not None:
            self.native.add(x_pad, ids, topk_weights, self._resident_native, None, self.num_experts, acc)
        elif self._resident_w is not None:
            experts_forward(x_pad, batch, self._resident_w[0], self._resident_w[1], 0, acc,
                            biases=self._resident_b, activation=self.activation, swiglu=self.swiglu)
        else:
            self._streamed(x_pad, batch, acc, ids, topk_weights)
        return acc[:, :self.hidden].to(self.dtype)

    __call__ = forward

    def _streamed(self, x_pad, batch: RoutedBatch, acc, ids=None, topk_weights=None) -> None:
        """ids, topk_weights: the native path's inputs (NativeExperts.map_ids of topk_ids)."""
        st = self.streamer
        routed = batch.routed_experts()
        if not routed:
            return
        todo = []  # chunks of this layer, in issue order: (chunk, slot or None)
        while st.prefetched:
            owner, chunk, slot = st.prefetched.popleft()
            if owner is self:
                todo.append((chunk, slot))
            else:  # prefetched for a layer that did not run next: retire the slot in ring order
                st.consume(slot)
                st.release(slot)
        done_experts = {e for c, _ in todo for e in c}
        remaining = [e for e in range(self.num_experts) if e not in done_experts]
        if len(routed) * 2 < self.num_experts:  # sparse batch: only routed experts travel
            remaining = [e for e in remaining if batch.counts[e]]
        n = self.experts_per_chunk
        todo += [(remaining[i:i + n], None) for i in range(0, len(remaining), n)]
        nxt = self.next_layer
        next_chunks = collections.deque(nxt._full_chunks()) if nxt is not None and nxt.streamer is st else None
        in_flight = sum(1 for _, s in todo if s is not None)
        pos = 0  # next chunk of this layer to issue
        while pos < len(todo) and todo[pos][1] is not None:
            pos += 1
        slots_total = len(st.slots)
        while pos < len(todo) and in_flight < slots_total:
            todo[pos] = (todo[pos][0], st.issue(self, todo[pos][0]))
            pos += 1
            in_flight += 1
        for i in range(len(todo)):
            chunk, slot = todo[i]
            buf = st.consume(slot)
            views = self.copy_layout.slot_views(buf, len(chunk))
            if self.native is not None:
                self.native.add(x_pad, ids, topk_weights, self.native.relayout(views), chunk, self.num_experts, acc)
            else:
                u13, u2 = self.copy_layout.unpack(views)
                act = dict(biases=self.copy_layout.biases(views), activation=self.activation, swiglu=self.swiglu)
                if chunk == list(range(chunk[0], chunk[0] + len(chunk))):
                    experts_forward(x_pad, batch, u13, u2, chunk[0], acc, **act)
                else:
                    experts_forward(x_pad, batch, u13, u2, 0, acc, expert_ids=chunk, **act)
            st.release(slot)
            # The slot just released is the next one the ring hands out: refill it.
            if pos < len(todo):
                todo[pos] = (todo[pos][0], st.issue(self, todo[pos][0]))
                pos += 1
            elif next_chunks:
                c = next_chunks.popleft()
                st.prefetched.append((nxt, c, st.issue(nxt, c)))
