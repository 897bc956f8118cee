"""`lk_moe.HybridMoE`: one MoE layer's routed experts for a model running on a GPU.

Three paths, chosen per call:
1. CPU path (M < gpu_min_batch, always for decode): `CpuExpertPath`, graph-capturable.
2. Streamed GPU path (M >= gpu_min_batch): the layer's packed expert bytes travel from pinned
   host memory through a bounded ring of staging slots (`ExpertStreamer`) on a copy stream,
   overlapped with compute; once a layer has issued its own copies, the ring's free slots start
   on the next linked layer (prefetch window of one layer). Only routed experts travel when a
   batch routes to less than half of them.
3. Resident (resident=True): the experts are unpacked on the GPU once and stay there.

The streamed path syncs once per forward (the per-expert token counts) and is meant for eager
prefill; decode and captured graphs use the CPU path.
"""
from __future__ import annotations

import collections
from typing import List, Optional

import torch
import torch.nn.functional as F

from .cpu_path import CpuExpertPath, PinnedIO
from .gpu_experts import RoutedBatch, experts_forward
from .gpu_layout import unpack_w13, unpack_w2
from .layer import MoELayer

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
            off = 0
            for src in layer._chunk_sources(chunk):
                n = src.numel() * 2
                buf[off:off + n].view(torch.bfloat16).view(src.shape).copy_(src, non_blocking=True)
                off += n
            self.copied[slot].record(self.copy_stream)
        self.bytes_copied += layer._chunk_bytes(len(chunk))
        return slot

    def consume(self, slot: int) -> torch.Tensor:
        torch.cuda.current_stream().wait_event(self.copied[slot])
        return self.slots[slot]

    def release(self, slot: int) -> None:
        self.freed[slot].record(torch.cuda.current_stream())


class HybridMoE:
    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, *, max_tokens: int, top_k: int,
                 gpu_min_batch: int = 0, resident: bool = False, streamer: Optional[ExpertStreamer] = None,
                 dtype=torch.bfloat16, pool=None, signal: str = "hostfn", layer: Optional[MoELayer] = None,
                 io: Optional[PinnedIO] = None):
        """w13 [E, 2I, H], w2 [E, H, I] on the CPU (vLLM layouts), or an existing `layer`.
        gpu_min_batch: smallest M that takes the streamed GPU path (0: never, CPU-only prefill).
        streamer: the shared staging ring (made to fit this layer if omitted).
        io: the CPU path's pinned buffers, shared by the layers of one model (made if omitted)."""
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
        # The packed slices are needed only by the GPU paths (quantized layers: CPU path only, so far).
        needs_gpu_copy = resident or gpu_min_batch > 0
        self._slices = self.layer._impl.packed_slices() if needs_gpu_copy else []
        self.expert_bytes = sum(s[0][0].numel() + s[1][0].numel() for s in self._slices) * 2
        self.resident = resident
        self._resident_w = None
        self.streamer = streamer
        if resident:
            self._resident_w = (unpack_w13([s[0].cuda() for s in self._slices]),
                                unpack_w2([s[1].cuda() for s in self._slices]))
        elif gpu_min_batch > 0:
            # Page-lock the engine's own copy in place (fast async H2D, no second host copy);
            # unregistered when the layer is freed.
            self.layer._impl.pin_for_gpu()
            if self.streamer is None:
                per_slot = max(1, min(self.num_experts, (256 << 20) // self.expert_bytes))
                self.streamer = ExpertStreamer(per_slot * self.expert_bytes, slots=4)
            if self.streamer.slot_bytes < self.expert_bytes:
                raise ValueError("staging slot smaller than one expert")
        self.experts_per_chunk = (self.streamer.slot_bytes // self.expert_bytes) if self.streamer else 0

    # -- layout of a chunk in a staging slot: per NUMA slice, w13 rows then w2 rows of its experts
    def _chunk_sources(self, chunk: List[int]):
        runs = []
        start = prev = chunk[0]
        for e in chunk[1:]:
            if e != prev + 1:
                runs.append((start, prev + 1))
                start = e
            prev = e
        runs.append((start, prev + 1))
        for w13, w2, *_ in self._slices:
            for a, b in runs:
                yield w13[a:b]
            for a, b in runs:
                yield w2[a:b]

    def _chunk_bytes(self, n: int) -> int:
        return n * self.expert_bytes

    def _unpack_slot(self, buf: torch.Tensor, n: int):
        off = 0
        p13, p2 = [], []
        for w13, w2, *_ in self._slices:
            shape13 = (n,) + tuple(w13.shape[1:])
            size = n * w13[0].numel() * 2
            p13.append(buf[off:off + size].view(torch.bfloat16).view(shape13))
            off += size
            shape2 = (n,) + tuple(w2.shape[1:])
            size = n * w2[0].numel() * 2
            p2.append(buf[off:off + size].view(torch.bfloat16).view(shape2))
            off += size
        return unpack_w13(p13), unpack_w2(p2)

    def link_next(self, other: "HybridMoE") -> None:
        """The layer that runs after this one: its first chunks are prefetched during this one."""
        self.next_layer = other

    def _full_chunks(self) -> List[List[int]]:
        n = self.experts_per_chunk
        return [list(range(a, min(a + n, self.num_experts))) for a in range(0, self.num_experts, n)]

    # -- forward
    def takes_gpu_path(self, tokens: int) -> bool:
        """Whether `forward` of this many tokens runs on the GPU (resident or streamed)."""
        return self._resident_w is not None or (self.gpu_min_batch > 0 and tokens >= self.gpu_min_batch)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        M = x.shape[0]
        if not self.takes_gpu_path(M):
            return self.cpu_path(x, topk_ids, topk_weights)
        if not x.is_cuda or x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be a CUDA [M, {self.hidden}] {self.dtype} tensor")
        if topk_ids.dtype != torch.int32 or topk_weights.dtype != torch.float32:
            raise TypeError("topk_ids must be int32 and topk_weights float32")
        if tuple(topk_ids.shape) != (M, self.top_k) or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_ids/topk_weights must be [M, {self.top_k}] = [{M}, {self.top_k}]")
        if topk_ids.device != x.device or topk_weights.device != x.device:
            raise ValueError("x, topk_ids and topk_weights must be on the same CUDA device")
        batch = RoutedBatch(topk_ids, topk_weights, self.num_experts)
        x_pad = F.pad(x, (0, self.kp1 - self.hidden)) if self.kp1 != self.hidden else x
        acc = torch.zeros(M, self.h_pad, dtype=torch.float32, device=x.device)
        if self._resident_w is not None:
            experts_forward(x_pad, batch, self._resident_w[0], self._resident_w[1], 0, acc)
        else:
            self._streamed(x_pad, batch, acc)
        return acc[:, :self.hidden].to(self.dtype)

    __call__ = forward

    def _streamed(self, x_pad, batch: RoutedBatch, acc) -> None:
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
            u13, u2 = self._unpack_slot(buf, len(chunk))
            if chunk == list(range(chunk[0], chunk[0] + len(chunk))):
                experts_forward(x_pad, batch, u13, u2, chunk[0], acc)
            else:
                experts_forward(x_pad, batch, u13, u2, 0, acc, expert_ids=chunk)
            st.release(slot)
            # The slot just released is the next one the ring hands out: refill it.
            if pos < len(todo):
                todo[pos] = (todo[pos][0], st.issue(self, todo[pos][0]))
                pos += 1
            elif next_chunks:
                c = next_chunks.popleft()
                st.prefetched.append((nxt, c, st.issue(nxt, c)))
