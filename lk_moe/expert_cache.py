"""The GPU expert cache: copies of a hybrid layer's hot routed experts in VRAM slots, computed on the
GPU while the CPU engine computes the rest of the same layer.

Per token, the routed experts found in the cache run on the GPU (vLLM's fused-MoE kernel over the
slots, an expert map sending every other id to -1), the others on the CPU (their ids set to -1 in
what the engine gets), concurrently: the GPU part on a side stream forked from the layer's stream,
the CPU call on the layer's stream, joined before the two partial sums add. The split is made on the
GPU from a persistent expert -> slot map, so it is captured in CUDA graphs and replays with whatever
the map holds at replay time.

Between steps (`ExpertCache.before_step`, called by lvllm before each model step; never inside a
step), the cache reads the per-expert routing counts that the layers accumulated on the GPU (an
asynchronous copy, read two steps later, so no step waits for it), lets `lk_moe.cache_policy` choose
refills, and carries them out on a copy stream: the expert's bytes travel from the engine's pinned
host copy (the same bytes streamed prefill reads) into a staging buffer, are turned into the slot's
layout on the GPU, and the slot is published in the map once its copy has landed. An evicted expert
leaves the map before its slot is overwritten, and the copy waits for the step that still used it.
A refill therefore never stalls a decode step, and a slot only changes between steps.

Slot layouts (`SlotStore`): the formats vLLM's fused-MoE kernel computes from their codes on this GPU
(lk_moe.gpu_native: fp8_block, fp8_channel from sm_89, int8_channel, wna16_int4 from sm_80) keep
their codes and scales in the slots; every other format with a GPU path is held as bf16 (bf16
experts as they are; the FP4 formats dequantized, 4x their bytes). The kernel computes silu experts,
and gpt-oss's swigluoai (its constants alpha 1.702, limit 7.0; gate and up rows interleaved in the
slots) with expert biases in bf16 slots; layers with another activation (silu_clamp) or other constants
run without a cache (said at startup).

`TraceReplay` (benchmark-only, LVLLM_BENCH_ROUTING_REPLAY=1): synthetic routing traces replace the
router's expert ids inside the MoE op, since random weights route uniformly and cannot show a hit rate.
"""
from __future__ import annotations

import math
import time
from typing import List, Optional

import numpy as np
import torch

from .cache_policy import CachePolicy, Refill

# Refills a layer may start per step (the policy's max_refills_per_layer), and all layers together
# per step, as a multiple of the layers: a refill reads host memory that the CPU decode reads too.
REFILLS_PER_LAYER = 2
REFILLS_PER_STEP_PER_LAYER = 1
# The activations vLLM's Triton fused-MoE kernel computes, with the (alpha, limit) it hard-codes (None: none).
KERNEL_ACTIVATIONS = {"silu": None, "swigluoai": (1.702, 7.0)}
# Staging buffers (one expert each) used in turn by the copy stream: its copies and layout conversions
# run in stream order, so a buffer is free again once the conversion after it was enqueued.
STAGING_BUFFERS = 2


class CacheUnsupported(ValueError):
    """A layer the cache cannot serve (format, activation or biases); it runs without one."""


def _interleave(w13: torch.Tensor) -> torch.Tensor:
    """[n, 2I, ...] rows gate then up -> gate_0, up_0, gate_1, up_1, ..."""
    n, two_i = w13.shape[:2]
    gate, up = w13[:, :two_i // 2], w13[:, two_i // 2:]
    return torch.stack((gate, up), dim=2).reshape((n, two_i) + tuple(w13.shape[2:]))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[1] >= rows:
        return t
    pad = torch.zeros((t.shape[0], rows - t.shape[1]) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=1)


class SlotStore:
    """One layer's experts on the GPU, in the layout vLLM's fused-MoE kernel reads: made (its layout and
    one expert's bytes, `slot_bytes`, known) before the budget is split, then `allocate(slots)`.

    kind "native": the format's codes and scales (lk_moe.gpu_native.NativeWeights, one tensor of
    [slots, ...] per field); kind "bf16": w1 [slots, 2*kp2, kp1], w2 [slots, kp1, kp2] bf16 (swigluoai: w1's
    gate and up rows interleaved), and with expert biases b13 [slots, 2*kp2] (w1's row order), b2 [slots, kp1]."""

    def __init__(self, hybrid, device):
        from . import gpu_dequant, gpu_native
        from .hybrid import GpuCopyLayout, gpu_sources, quant4_parts
        layer = hybrid.layer
        if layer.activation not in KERNEL_ACTIVATIONS:
            raise CacheUnsupported(f"the GPU expert cache computes {' and '.join(KERNEL_ACTIVATIONS)} experts; this "
                                   f"layer's activation is {layer.activation}")
        constants = KERNEL_ACTIVATIONS[layer.activation]
        if constants and not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(layer._impl.swiglu, constants)):
            raise CacheUnsupported(f"vLLM's fused-MoE kernel computes {layer.activation} with (alpha, limit) = "
                                   f"{constants}; this layer's are {tuple(layer._impl.swiglu)}")
        try:
            gpu_sources(layer)
        except ValueError as e:
            raise CacheUnsupported(str(e)) from None
        parts = quant4_parts(layer) if layer.format in gpu_dequant.FOUR_BIT_FORMATS else ()
        self.biased = "b13" in parts
        self.interleaved = layer.activation == "swigluoai"  # vLLM's swigluoai reads gate_0, up_0, gate_1, ...
        self.format = layer.format
        self.kp1, self.kp2, self.h_pad = layer._impl.padded_dims
        path, _ = gpu_dequant.gpu_path(layer.format, activation=layer.activation)
        self.native = None
        if path == "native":
            self.native = hybrid.native or gpu_native.NativeExperts(layer.format, layer._impl.padded_dims, parts,
                                                                   activation=layer.activation)
        impl = "torch" if layer.format in gpu_dequant.TORCH_DEQUANT_FORMATS else ("auto" if path == "fallback" else "torch")
        if impl == "auto":
            impl = "kernel" if gpu_dequant.kernel_usable() else "torch"
        self.layout = hybrid.copy_layout or GpuCopyLayout(layer, impl)
        self.kind = "native" if self.native is not None else "bf16"
        if self.biased and self.native is not None:
            raise CacheUnsupported(f"vLLM's native {self.format} kernel takes no expert biases")
        self.dtype = hybrid.dtype
        self.device = torch.device(device)
        self.slots = 0
        self.tensors = []
        self._quant_config = None
        layer._impl.pin_for_gpu()  # the refills' source: the engine's own copy, page-locked once
        # One expert through the layout conversion tells the slots' shapes.
        probe = self._convert(self._stage(0, torch.empty(self.layout.expert_bytes, dtype=torch.uint8,
                                                         device=self.device)))
        self._fields = [None if t is None else (tuple(t.shape[1:]), t.dtype) for t in probe]
        self.slot_bytes = sum(t[0].numel() * t.element_size() for t in probe if t is not None)
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
        self._fused_experts, self._activation = fused_experts, MoEActivation(layer.activation)

    def allocate(self, slots: int) -> None:
        self.slots = slots
        self.tensors = [None if f is None else torch.zeros((slots,) + f[0], dtype=f[1], device=self.device)
                        for f in self._fields]
        if self.native is not None:
            self._quant_config = self.native.quant_config(self._weights())
        elif self.biased:
            from vllm.model_executor.layers.fused_moe.config import biased_moe_quant_config
            self._quant_config = biased_moe_quant_config(self.tensors[2], self.tensors[3])

    def _stage(self, expert: int, buf: torch.Tensor):
        self.layout.copy_chunk(buf, [expert], non_blocking=True)
        return self.layout.slot_views(buf, 1)

    def _convert(self, views) -> tuple:
        if self.native is not None:
            w = self.native.relayout(views)
            if self.format == "wna16_int4":  # vLLM's int4 kernels take the scales in the model dtype
                w = w._replace(w1s=w.w1s.to(self.dtype), w2s=w.w2s.to(self.dtype))
            return tuple(w)
        w13, w2 = self.layout.unpack(views)
        w2 = _pad_rows(w2, self.kp1)
        b13 = b2 = None
        if self.biased:
            b13, b2 = self.layout.biases(views)
            b2 = torch.nn.functional.pad(b2, (0, w2.shape[1] - b2.shape[1]))
        if self.interleaved:
            w13, b13 = _interleave(w13), None if b13 is None else _interleave(b13.unsqueeze(-1)).squeeze(-1)
        return (w13, w2) + ((b13, b2) if self.biased else ())

    def _weights(self):
        from .gpu_native import NativeWeights
        return NativeWeights(*self.tensors) if self.native is not None else tuple(self.tensors)

    def write(self, slot: int, expert: int, buf: torch.Tensor) -> None:
        """Expert `expert` into slot `slot`, through the staging buffer `buf`, on the current stream."""
        for dst, src in zip(self.tensors, self._convert(self._stage(expert, buf))):
            if dst is not None:
                dst[slot].copy_(src[0])

    def compute(self, x_pad: torch.Tensor, ids: torch.Tensor, topk_weights: torch.Tensor,
                expert_map: torch.Tensor) -> torch.Tensor:
        """[M, kp1] in x's dtype: sum over k of w * expert(x) for the (token, k) whose expert the map
        sends to a slot. ids: int32 [M, K], -1 replaced by num_experts (expert_map[num_experts] = -1)."""
        w = self._weights()
        w1, w2 = (w.w1, w.w2) if self.native is not None else w[:2]
        return self._fused_experts(x_pad, w1, w2, topk_weights, ids, activation=self._activation,
                                   global_num_experts=expert_map.shape[0], expert_map=expert_map,
                                   quant_config=self._quant_config)


def split_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor, counts: torch.Tensor, ones: torch.Tensor):
    """The id split, on any device, with no host sync (capturable). topk_ids int32 [M, K], -1 = none;
    expert_map int32 [E + 1] (expert -> slot, -1 = not cached; [E] = -1); counts int32 [E + 2]
    (+= tokens per expert, [E] collects the -1s, [E + 1] the hits); ones int32 [>= M * K].
    Returns (ids for the GPU part: -1 -> E, which the map sends to no slot; ids for the CPU engine:
    the cached experts -> -1)."""
    E = expert_map.shape[0] - 1
    gpu_ids = torch.where(topk_ids < 0, E, topk_ids)
    flat = gpu_ids.reshape(-1).long()
    hit = expert_map.index_select(0, flat).reshape(topk_ids.shape) >= 0
    counts.index_add_(0, flat, ones[:flat.shape[0]])
    counts[E + 1:E + 2].add_(hit.sum(dtype=torch.int32).reshape(1))
    return gpu_ids, topk_ids.masked_fill(hit, -1)


class LayerCache:
    """One hybrid layer's slots and its row of the cache's GPU tables."""

    def __init__(self, owner: "ExpertCache", index: int, hybrid, store: SlotStore):
        self.owner, self.index, self.store = owner, index, store
        self.hybrid = hybrid
        self.num_experts = E = hybrid.num_experts
        self.map = owner.slot_map[index, :E + 1]   # expert -> slot, -1 = not cached; [E] = -1 (no expert)
        self.counts = owner.counts[index, :E + 2]  # tokens per expert; [E] padding / unused; [E + 1] hits

    def split(self, topk_ids: torch.Tensor):
        """split_ids on this layer's row of the map and the counts."""
        return split_ids(topk_ids, self.map, self.counts, self.owner.ones_for(topk_ids.numel()))

    def gpu_part(self, x: torch.Tensor, gpu_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        kp1 = self.store.kp1
        x_pad = torch.nn.functional.pad(x, (0, kp1 - x.shape[1])) if kp1 != x.shape[1] else x
        return self.store.compute(x_pad.contiguous(), gpu_ids, topk_weights, self.map)[:, :x.shape[1]]

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, cpu_call) -> torch.Tensor:
        """The layer's output: the cached experts on the GPU (side stream) while `cpu_call(x, ids,
        weights)` computes the rest on the CPU (this stream). Capturable."""
        gpu_ids, cpu_ids = self.split(topk_ids)
        main, side = torch.cuda.current_stream(), self.owner.side_stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            on_gpu = self.gpu_part(x, gpu_ids, topk_weights)
        on_cpu = cpu_call(x, cpu_ids, topk_weights)
        main.wait_stream(side)
        return (on_cpu.float() + on_gpu.float()).to(x.dtype)


class ExpertCache:
    """The GPU expert cache of one worker: `budget_bytes` of VRAM split evenly over `layers` hybrid
    layers (known when vLLM has built the model, before loading). Layers join as they load
    (`add_layer`); `before_step` runs the policy and the refills between steps."""

    def __init__(self, budget_bytes: int, layers: int, policy: str = "lfu", device=None, **policy_args):
        if budget_bytes < 0 or layers < 1:
            raise ValueError("budget_bytes must be >= 0 and layers >= 1")
        self.budget_bytes, self.planned_layers = int(budget_bytes), layers
        self.policy_name, self.policy_args = policy, policy_args
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.layers: List[LayerCache] = []
        self.slots = 0  # per layer (every layer of a model has the same expert size)
        self.active_slots = 0  # the policy's slots (<= slots; benchmarks lower it to sweep budgets)
        self.num_experts = 0
        self.slot_map = self.counts = None
        # int32 ones for the expert counts (split_ids), shared by every layer and sized at load time for the
        # largest batch vLLM schedules: a per-layer copy grown by the first long prefill was VRAM taken after
        # vLLM's memory profile (48 layers x 256 KiB at 8K tokens, top-8).
        self.ones = torch.ones(0, dtype=torch.int32, device=self.device)
        self.side_stream = torch.cuda.Stream(self.device)
        self.copy_stream = torch.cuda.Stream(self.device)
        self.policy: Optional[CachePolicy] = None
        self._staging: List[torch.Tensor] = []
        self._next_buf = 0
        self._inflight = []  # (Refill, event recorded after its copy)
        self._published = None  # np [layers, E + 1] int32: the map as last uploaded
        self._map_host = None   # np: the map as it should be now
        self._snap = None       # pinned copy of `counts`, its event, and the steps it covers
        self._snap_event = None
        self._snap_steps = self._steps = 0
        # Totals (read by lvllm's statistics and /metrics).
        self.lookups = self.hits = self.refills = self.refill_bytes = 0
        self.skipped: List[str] = []

    # -- building
    def ones_for(self, n: int) -> torch.Tensor:
        """At least n int32 ones (grown, eagerly, only by a batch larger than add_layer's max_tokens)."""
        if n > self.ones.numel():
            self.ones = torch.ones(n, dtype=torch.int32, device=self.device)
        return self.ones

    def add_layer(self, hybrid, max_tokens: int = 0) -> Optional[LayerCache]:
        """The layer's slots (None, with the reason in `skipped`, when the cache cannot serve it or the
        budget gives it no slot). Allocated now, at load time, so vLLM's memory profile counts them;
        max_tokens: the largest batch the layer will see (vLLM's max_num_batched_tokens; at least the
        CPU path's rows)."""
        if len(self.layers) >= self.planned_layers:
            raise RuntimeError(f"the expert cache was planned for {self.planned_layers} layers; one more joined")
        E = hybrid.num_experts
        if self.num_experts and E != self.num_experts:
            self.skipped.append(f"{E} experts where the cache's other layers have {self.num_experts}")
            return None
        try:
            store = SlotStore(hybrid, self.device)
        except CacheUnsupported as e:
            self.skipped.append(str(e))
            return None
        if self.policy is None:  # the first layer the cache can serve sizes it for every planned layer
            self.num_experts = E
            self.slots = min(E, self.budget_bytes // (self.planned_layers * store.slot_bytes))
            self.active_slots = self.slots
            self.slot_map = torch.full((self.planned_layers, E + 1), -1, dtype=torch.int32, device=self.device)
            self.counts = torch.zeros((self.planned_layers, E + 2), dtype=torch.int32, device=self.device)
            self._map_host = np.full((self.planned_layers, E + 1), -1, dtype=np.int32)
            self._published = self._map_host.copy()
            self._snap = torch.zeros((self.planned_layers, E + 2), dtype=torch.int32, pin_memory=True)
            self.policy = CachePolicy(self.planned_layers, E, self.slots, self.policy_name,
                                      max_refills_per_layer=REFILLS_PER_LAYER, **self.policy_args)
            self._staging = [torch.empty(store.layout.expert_bytes, dtype=torch.uint8, device=self.device)
                             for _ in range(STAGING_BUFFERS if self.slots else 0)]
        if self.slots == 0:
            self.skipped.append(f"a budget of {self.budget_bytes / 2**30:.2f} GiB over {self.planned_layers} layers "
                                f"holds no slot of {store.slot_bytes / 2**20:.1f} MiB")
            return None
        if store.layout.expert_bytes > self._staging[0].numel():
            self.skipped.append("an expert larger than the refill buffers")
            return None
        store.allocate(self.slots)
        # One refill now, on the copy stream: its temporaries are allocated (and counted by vLLM's
        # memory profile) before serving, not in the middle of it.
        with torch.cuda.stream(self.copy_stream):
            store.write(0, 0, self._staging[0])
        self.copy_stream.synchronize()
        self.ones_for(max(max_tokens, hybrid.cpu_path.max_tokens) * hybrid.top_k)
        cache = LayerCache(self, len(self.layers), hybrid, store)
        self.layers.append(cache)
        return cache

    @property
    def nbytes(self) -> int:
        return sum(l.store.slots * l.store.slot_bytes for l in self.layers)

    def describe(self) -> str:
        if not self.layers:
            return "GPU expert cache: off (" + ("; ".join(sorted(set(self.skipped))) or "no layer") + ")"
        st = self.layers[0].store
        text = (f"GPU expert cache: {self.slots} of {self.num_experts} experts per layer on {len(self.layers)} layers "
                f"({self.nbytes / 2**30:.2f} GiB, {st.kind} slots of {st.slot_bytes / 2**20:.1f} MiB), "
                f"{self.policy_name} policy")
        if self.skipped:
            text += "; without cache: " + "; ".join(sorted(set(self.skipped)))
        return text

    # -- between steps
    def before_step(self) -> None:
        """Publish landed refills, read the last counts if their copy has landed, plan and start new
        refills, take the next counts. Runs on the host before a step's work is enqueued; enqueues
        small copies on the current stream and the refills on the copy stream; never waits for the GPU.
        Step t's counts are taken before step t + 1, read before t + 2, and the refills they start are
        published before t + 3 at the earliest (cache_policy.GPU_LAG)."""
        if not self.layers or self.policy is None:
            return
        self._steps += 1
        self._land()
        if self._snap_event is not None:
            if not self._snap_event.query():
                return  # the last counts are still on their way: no new snapshot either
            self._read_counts()
        self._snap.copy_(self.counts, non_blocking=True)
        self.counts.zero_()
        self._snap_event = torch.cuda.Event()
        self._snap_event.record()
        self._snap_steps, self._steps = self._steps, 0

    def _land(self) -> None:
        landed = [ev.query() for _, ev in self._inflight]
        if not any(landed):
            return
        for (refill, _), done in zip(self._inflight, landed):
            if done:
                self._map_host[refill.layer, refill.expert] = refill.slot
        self._inflight = [f for f, done in zip(self._inflight, landed) if not done]
        self._upload()

    def _upload(self) -> None:
        if np.array_equal(self._map_host, self._published):
            return
        self.slot_map.copy_(torch.from_numpy(self._map_host).pin_memory(), non_blocking=True)
        self._published = self._map_host.copy()

    def _read_counts(self) -> None:
        counts = self._snap.numpy().copy()
        self._snap_event = None
        E = self.num_experts
        routed = counts[:, :E]
        self.lookups += int(routed[:len(self.layers)].sum())
        self.hits += int(counts[:len(self.layers), E + 1].sum())
        self.policy.observe(routed, steps=max(1, self._snap_steps))
        busy = np.zeros((self.planned_layers, self.slots), dtype=bool)
        for refill, _ in self._inflight:
            busy[refill.layer, refill.slot] = True
        busy[:, self.active_slots:] = True
        busy[len(self.layers):] = True
        plan = self.policy.plan(busy, limit=REFILLS_PER_STEP_PER_LAYER * len(self.layers))
        if plan:
            self._start(plan)

    def _start(self, plan: List[Refill]) -> None:
        # Evicted experts leave the map first; the copies wait until the steps that used them are done.
        for f in plan:
            if f.evicted >= 0:
                self._map_host[f.layer, f.evicted] = -1
        self._upload()
        gate = torch.cuda.Event()
        gate.record()
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(gate)
            for f in plan:
                cache = self.layers[f.layer]
                cache.store.write(f.slot, f.expert, self._staging[self._next_buf])
                self._next_buf = (self._next_buf + 1) % len(self._staging)
                ev = torch.cuda.Event()
                ev.record(self.copy_stream)
                self._inflight.append((f, ev))
                self.refills += 1
                self.refill_bytes += cache.store.layout.expert_bytes

    # -- tests and benchmarks
    def place(self, layer: int, experts: List[int]) -> None:
        """Put `experts` into the first slots of `layer` now (synchronously; the policy is told), the
        layer's other slots emptied. Not between-steps safe: for tests and warm starts only."""
        if len(experts) > self.active_slots or len(set(experts)) != len(experts):
            raise ValueError(f"place takes at most {self.active_slots} distinct experts")
        torch.cuda.synchronize(self.device)
        store = self.layers[layer].store
        self._map_host[layer, :] = -1
        self.policy.slot_expert[layer, :] = -1
        for slot, e in enumerate(experts):
            store.write(slot, e, self._staging[0])
            self._map_host[layer, e] = slot
            self.policy.slot_expert[layer, slot] = e
        self._upload()
        torch.cuda.synchronize(self.device)

    def set_active_slots(self, n: int) -> None:
        """Use only the first n slots of each layer (a smaller budget, for benchmark sweeps): the cache
        is emptied and the policy starts over."""
        if not 0 <= n <= self.slots:
            raise ValueError(f"active slots must be in 0..{self.slots}")
        torch.cuda.synchronize(self.device)
        self._land()
        self._inflight.clear()
        self._map_host[:] = -1
        self._upload()
        self.active_slots = n
        self.policy = CachePolicy(self.planned_layers, self.num_experts, self.slots, self.policy_name,
                                  max_refills_per_layer=REFILLS_PER_LAYER, **self.policy_args)
        torch.cuda.synchronize(self.device)

    def totals(self) -> dict:
        return {"lookups": self.lookups, "hits": self.hits, "refills": self.refills, "refill_bytes": self.refill_bytes}


class TraceReplay:
    """Benchmark-only: synthetic routing (lk_moe.routing_trace) in place of the router's expert ids.
    Allocated before CUDA graphs are captured (the gather is part of every graph); `load` swaps traces
    and `enabled` switches between the trace and the router's own ids at any time."""

    def __init__(self, layers: int, steps: int, rows: int, top_k: int, max_tokens: int, device):
        self.device = torch.device(device)
        self.ids = torch.zeros((steps, layers, rows, top_k), dtype=torch.int32, device=self.device)
        self.step = torch.zeros(1, dtype=torch.long, device=self.device)
        self.enabled = torch.zeros(1, dtype=torch.bool, device=self.device)
        self._rows = torch.arange(max_tokens, device=self.device) % rows  # batch row -> trace row

    def load(self, trace: np.ndarray) -> None:
        if trace.shape != tuple(self.ids.shape):
            raise ValueError(f"trace must be {list(self.ids.shape)}, got {list(trace.shape)}")
        torch.cuda.synchronize(self.device)
        self.ids.copy_(torch.from_numpy(np.ascontiguousarray(trace, dtype=np.int32)))
        self.step.zero_()
        self.enabled.fill_(True)
        torch.cuda.synchronize(self.device)

    def disable(self) -> None:
        self.enabled.fill_(False)

    def advance(self) -> None:
        self.step.add_(1)

    def apply(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        t = self.step % self.ids.shape[0]
        trace = self.ids.index_select(0, t)[0, layer].index_select(0, self._rows[:topk_ids.shape[0]])
        return torch.where(self.enabled, trace, topk_ids)


def measure_refill(cache: ExpertCache, experts: int = 8) -> float:
    """GB/s of refills on layer 0 (copy + layout conversion), for the startup line."""
    if not cache.layers:
        return 0.0
    store = cache.layers[0].store
    torch.cuda.synchronize(cache.device)
    t = time.perf_counter()
    with torch.cuda.stream(cache.copy_stream):
        for i in range(experts):
            store.write(0, i % cache.num_experts, cache._staging[0])
    cache.copy_stream.synchronize()
    return experts * store.layout.expert_bytes / (time.perf_counter() - t) / 1e9
