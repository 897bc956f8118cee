"""The CPU expert path seen from the GPU: inputs on a CUDA device, result back on it.

All work is ordered on the caller's current CUDA stream: D2H copies of the hidden states and
routing into pinned buffers, a host-function node that runs the engine, an H2D copy of the
result. Nothing blocks the Python thread, so other GPU work (shared experts on another stream)
overlaps, and the sequence can be captured in a CUDA graph and replayed with new inputs written
into the captured input tensors. Pinned buffers are allocated once, sized by `max_tokens`.
"""
from __future__ import annotations

import torch

from . import _C
from .layer import MoELayer


class PinnedIO:
    """The pinned staging buffers of the CPU path: x, routing and output for up to `max_tokens`.

    Layers of one model run one after another on one stream, so they can share a single set
    (a model with 48 MoE layers and 8K-token batches would otherwise pin gigabytes)."""

    def __init__(self, max_tokens: int, hidden: int, top_k: int, dtype=torch.bfloat16):
        if max_tokens < 1 or top_k < 1 or hidden < 1:
            raise ValueError("max_tokens, hidden and top_k must be >= 1")
        self.max_tokens, self.hidden, self.top_k, self.dtype = max_tokens, hidden, top_k, dtype
        self.x = torch.empty(max_tokens, hidden, dtype=dtype, pin_memory=True)
        self.ids = torch.zeros(max_tokens, top_k, dtype=torch.int32, pin_memory=True)
        self.w = torch.zeros(max_tokens, top_k, dtype=torch.float32, pin_memory=True)
        self.out = torch.empty(max_tokens, hidden, dtype=dtype, pin_memory=True)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.ids, self.w, self.out))


class CpuExpertPath:
    SIGNALS = ("hostfn", "mailbox")

    def __init__(self, layer: MoELayer, max_tokens: int, top_k: int, dtype=torch.bfloat16,
                 signal: str = "hostfn", io: PinnedIO | None = None):
        """signal: how the stream hands the call to the CPU. "hostfn": a host-function node
        (cudaLaunchHostFunc); "mailbox": stream memory operations on mapped pinned memory served
        by a polling thread (experimental, being measured against hostfn).
        io: pinned buffers shared with other layers that run on the same stream (made if omitted)."""
        if signal not in self.SIGNALS:
            raise ValueError(f"signal must be one of {self.SIGNALS}, got {signal!r}")
        self.signal = signal
        ok, why = _C.cuda_runtime_available()
        if not ok or not torch.cuda.is_available():
            raise RuntimeError(f"the CPU expert path needs a CUDA device ({why or 'torch sees no GPU'})")
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"dtype must be bfloat16 or float16, got {dtype}")
        if max_tokens < 1 or top_k < 1:
            raise ValueError("max_tokens and top_k must be >= 1")
        self.layer = layer
        self.max_tokens, self.top_k, self.dtype = max_tokens, top_k, dtype
        H = layer.hidden_size
        if io is None:
            io = PinnedIO(max_tokens, H, top_k, dtype)
        elif (io.hidden, io.top_k, io.dtype) != (H, top_k, dtype) or io.max_tokens < max_tokens:
            raise ValueError(f"shared pinned buffers are [{io.max_tokens}, {io.hidden}] top_k={io.top_k} {io.dtype}; "
                             f"this layer needs [{max_tokens}, {H}] top_k={top_k} {dtype}")
        self.io = io
        self._x, self._ids, self._w, self._out = io.x, io.ids, io.w, io.out
        self._calls = {}  # tokens -> immutable HostCall (a captured graph keeps pointing at it)
        self.counters = _C.HostCallCounters()  # shared by this path's calls, graph replays included

    def _call(self, tokens: int):
        call = self._calls.get(tokens)
        if call is None:
            call = _C.HostCall(self.layer._impl, self._x, self._ids, self._w, self._out, tokens, self.counters)
            self._calls[tokens] = call
        return call

    def engine_totals(self):
        """(calls, tokens, nanoseconds) of the engine runs so far, counted by the host function:
        eager calls and CUDA-graph replays alike; tokens leave out rows of graph padding."""
        return self.counters.read()

    def check_errors(self) -> None:
        """Raise if a host-node run since the last check saw an invalid expert id (outputs were NaN)."""
        bad = sum(c.take_errors() for c in self._calls.values())
        if bad:
            raise ValueError(f"{bad} CPU expert call(s) received expert ids outside 0..{self.layer.num_experts - 1}"
                             " (or -1); their outputs were set to NaN")

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        M = x.shape[0]
        if not (x.is_cuda and topk_ids.is_cuda and topk_weights.is_cuda):
            raise ValueError("x, topk_ids and topk_weights must be CUDA tensors")
        if x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != self.layer.hidden_size:
            raise ValueError(f"x must be [M, {self.layer.hidden_size}] {self.dtype}, got {list(x.shape)} {x.dtype}")
        if topk_ids.dtype != torch.int32 or topk_weights.dtype != torch.float32:
            raise TypeError("topk_ids must be int32 and topk_weights float32")
        if tuple(topk_ids.shape) != (M, self.top_k) or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_ids/topk_weights must be [M, {self.top_k}]")
        if not 1 <= M <= self.max_tokens:
            raise ValueError(f"M={M} is outside 1..max_tokens={self.max_tokens}")
        stream = torch.cuda.current_stream()
        self._x[:M].copy_(x, non_blocking=True)
        self._ids[:M].copy_(topk_ids, non_blocking=True)
        self._w[:M].copy_(topk_weights, non_blocking=True)
        call = self._call(M)
        if self.signal == "hostfn":
            call.enqueue(stream.cuda_stream)
        else:
            call.enqueue_mailbox(stream.cuda_stream)
        if out is None:
            out = torch.empty_like(x)
        out.copy_(self._out[:M], non_blocking=True)
        return out
