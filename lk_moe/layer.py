"""`lk_moe.MoELayer`: the routed experts of one MoE layer, computed on the CPU."""
from __future__ import annotations

import torch

from . import _C
from .engine import default_pool

_HALF = (torch.bfloat16, torch.float16)


class ForwardHandle:
    """A forward in flight (from `MoELayer.submit`). `wait()` returns the output tensor."""

    __slots__ = ("_h",)

    def __init__(self, handle):
        self._h = handle

    def done(self) -> bool:
        return self._h.done()

    def wait(self) -> torch.Tensor:
        return self._h.wait()


class MoELayer:
    """Routed experts of one MoE layer on the CPU engine.

    w13: [E, 2*I, H] (rows 0..I-1 gate_proj, I..2I-1 up_proj), w2: [E, H, I], bf16 or fp16,
    vLLM's layouts. The weights are repacked once (fp16 becomes bf16) and split across NUMA
    nodes; the caller may drop its copies afterwards.

    forward(x [M, H], topk_ids [M, K] int32, topk_weights [M, K] float32) -> [M, H] in x's dtype:
        out[m] = sum_k topk_weights[m, k] * w2[e] @ (silu(gate_e @ x[m]) * (up_e @ x[m])),
    e = topk_ids[m, k]; an id of -1 marks an unused slot.
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, activation: str = "silu", *, pool=None):
        if not isinstance(w13, torch.Tensor) or not isinstance(w2, torch.Tensor):
            raise TypeError("w13 and w2 must be torch.Tensor")
        self._pool = pool if pool is not None else default_pool()
        self._impl = _C.Layer(self._pool, w13, w2, activation)
        self.activation = activation

    # -- shape and memory
    @property
    def num_experts(self) -> int:
        return self._impl.num_experts

    @property
    def hidden_size(self) -> int:
        return self._impl.hidden_size

    @property
    def intermediate_size(self) -> int:
        return self._impl.intermediate_size

    @property
    def nbytes(self) -> int:
        """Host bytes held for the packed experts (all NUMA slices)."""
        return self._impl.nbytes

    @property
    def expert_bytes(self) -> int:
        """Bytes of the experts in bf16 checkpoint layout (the 1.0x reference for nbytes)."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        return E * 3 * H * I * 2

    @property
    def last_compute_us(self) -> float:
        """Time the last forward spent inside the pool (all phases, all workers), microseconds."""
        return self._impl.last_compute_us

    @property
    def num_slices(self) -> int:
        return self._impl.num_slices

    def slice_bounds(self, s: int):
        """(i0, i1, h0, h1): the intermediate and hidden columns NUMA slice `s` owns (block aligned)."""
        return self._impl.slice_bounds(s)

    # -- compute
    def _new_out(self, x) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        rows = x.shape[0] if x.dim() >= 1 else 0
        dtype = x.dtype if x.dtype in _HALF else torch.bfloat16
        return torch.empty((rows, self.hidden_size), dtype=dtype)

    def submit(self, x, topk_ids, topk_weights, out=None) -> ForwardHandle:
        """Start a forward and return at once; `handle.wait()` gives the output.
        One forward per layer is in flight: a second submit first waits for the first."""
        if out is None:
            out = self._new_out(x)
        return ForwardHandle(self._impl.submit(x, topk_ids, topk_weights, out))

    def forward(self, x, topk_ids, topk_weights) -> torch.Tensor:
        return self._impl.submit(x, topk_ids, topk_weights, self._new_out(x)).wait()

    def forward_into(self, out, x, topk_ids, topk_weights) -> torch.Tensor:
        """Write the result into `out` (e.g. a pinned buffer); allocates nothing."""
        return self._impl.submit(x, topk_ids, topk_weights, out).wait()

    __call__ = forward

    def __repr__(self) -> str:
        return (f"MoELayer(E={self.num_experts}, H={self.hidden_size}, I={self.intermediate_size}, "
                f"activation={self.activation!r}, nbytes={self.nbytes}, slices={self.num_slices})")
