"""`lk_moe.MoELayer`: the routed experts of one MoE layer, computed on the CPU."""
from __future__ import annotations

import torch

from . import _C, formats
from .config import int8_act_from_env
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


def _check_g_idx(tensors: dict) -> None:
    """wna16_int4: act order ("group" actorder, a permuted g_idx) is refused; a g_idx equal to the
    identity grouping k // group_size is accepted (and ignored). Pass g_idx only when the checkpoint
    has one: vLLM allocates these parameters with torch.empty and leaves them unset otherwise."""
    for proj, packed, scale in (("w13", "w13_weight_packed", "w13_weight_scale"),
                                ("w2", "w2_weight_packed", "w2_weight_scale")):
        name = f"{proj}_weight_g_idx"
        g = tensors.get(name)
        if g is None:
            continue
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(g).__name__}")
        p, s = tensors[packed], tensors[scale]
        if p.dim() != 3 or s.dim() != 3 or s.shape[1] < 1:
            continue  # the engine names the misshaped tensor
        E, K = p.shape[0], p.shape[1] * 8
        if K % s.shape[1]:
            continue
        if g.shape != (E, K) and g.shape != (K,):
            raise ValueError(f"{name} must be [E, K] = [{E}, {K}], got {list(g.shape)}")
        want = torch.arange(K, dtype=torch.int64) // (K // s.shape[1])
        if not torch.equal(g.to(torch.int64).reshape(-1, K), want.expand(g.numel() // K, K)):
            raise ValueError(f"{name} is not the identity grouping k // group_size: act-order (actorder='group') "
                             "int4 checkpoints are not supported by the CPU engine")


class MoELayer:
    """Routed experts of one MoE layer on the CPU engine.

    w13: [E, 2*I, H] (rows 0..I-1 gate_proj, I..2I-1 up_proj), w2: [E, H, I], bf16 or fp16,
    vLLM's layouts. The weights are repacked once (fp16 becomes bf16) and split across NUMA
    nodes; the caller may drop its copies afterwards.

    forward(x [M, H], topk_ids [M, K] int32, topk_weights [M, K] float32) -> [M, H] in x's dtype:
        out[m] = sum_k topk_weights[m, k] * w2[e] @ (silu(gate_e @ x[m]) * (up_e @ x[m])),
    e = topk_ids[m, k]; an id of -1 marks an unused slot.
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, activation: str = "silu", *, pool=None,
                 swiglu_limit: float = 7.0, situ_beta: float = 0.0, situ_linear_beta: float = 0.0,
                 swiglu_alpha: float = 1.702):
        """activation: "silu", "silu_clamp" (silu(min(gate, swiglu_limit)) * clamp(up, +-swiglu_limit)), "situ"
        (situ_beta * tanh(gate / situ_beta) * sigmoid(gate) * up, up soft-clipped by situ_linear_beta the same
        way when > 0) or "swigluoai" ((clamp(up, +-swiglu_limit) + 1) * g * sigmoid(swiglu_alpha * g),
        g = min(gate, swiglu_limit)); w13's rows are all gates then all ups."""
        if not isinstance(w13, torch.Tensor) or not isinstance(w2, torch.Tensor):
            raise TypeError("w13 and w2 must be torch.Tensor")
        int8_act_from_env()  # the engine reads LK_INT8_ACT at construction: a bad value is a ConfigError here
        self._pool = pool if pool is not None else default_pool()
        self._impl = _C.Layer(self._pool, w13, w2, activation, swiglu_limit=float(swiglu_limit),
                              situ_beta=float(situ_beta), situ_linear_beta=float(situ_linear_beta),
                              swiglu_alpha=float(swiglu_alpha))
        self.activation = activation
        self._source_bytes = w13.numel() * w13.element_size() + w2.numel() * w2.element_size()

    # format id -> vLLM parameter names it needs (lk_moe.formats has the rows: layouts, optional tensors)
    FORMATS = {f.name: f.tensors for f in formats.TABLE}

    @classmethod
    def tensor_names(cls, format: str) -> tuple:
        """(required, optional) vLLM parameter names `from_checkpoint` reads for `format`; the
        optional ones are passed only when the method created them (e.g. zero points)."""
        f = formats.get(format)
        return f.tensors, f.optional

    @staticmethod
    def _optional_tensors(row: formats.Format, tensors: dict) -> list:
        """The format's optional tensors in binding order (None where absent), type-checked."""
        opt = [tensors.get(n) for n in row.optional]
        for n, t in zip(row.optional, opt):
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
        return opt

    @classmethod
    def from_checkpoint(cls, format: str, tensors: dict, *, activation: str = "silu", pool=None,
                        block_size=None, hidden_size: int | None = None, intermediate_size: int | None = None,
                        interleaved: bool | None = None, swiglu_alpha: float = 1.702,
                        swiglu_limit: float = 7.0, situ_beta: float = 0.0,
                        situ_linear_beta: float = 0.0) -> "MoELayer":
        """Build from the tensors vLLM's MoE method holds for `format` (names as vLLM's parameters).
        Block sizes and the like are read from the tensors' shapes; `block_size=(rows, cols)` is
        needed only where the shapes do not tile exactly. Unquantized: "bf16" (fp16 too).

        activation: the model's, for every format: "silu" (default), "silu_clamp" (vLLM's silu with
        swiglu_limit, DeepSeek-V4: silu(min(gate, limit)) * clamp(up, -limit, limit)), "situ" (Kimi's SituGLU,
        Kimi-K3: situ_beta * tanh(gate / situ_beta) * sigmoid(gate) * up', up' = situ_linear_beta * tanh(up /
        situ_linear_beta), or up when situ_linear_beta is 0), or "swigluoai" (gpt-oss, MiniMax-M3):
        g = min(gate, limit), u = clamp(up, -limit, limit), act = (u + 1) * g * sigmoid(alpha * g) with
        swiglu_alpha = 1.702; swiglu_limit (default 7.0, gpt-oss's) is the limit of both clamped ones;
        mxfp4's w13_bias is added to gate/up before the activation, and the expert output
        w2 @ act + w2_bias is what the router weight scales.
        mxfp4 only: hidden_size / intermediate_size are the real H and I when vLLM padded the tensors
        (default: the tensors' sizes; the padding is dropped, x and the output are [M, hidden_size]);
        interleaved (mxfp4 only): w13 rows are gate_0, up_0, gate_1, up_1, ... (gpt-oss; default for mxfp4
        swigluoai) rather than all gate rows then all up rows (every other format's layout, and mxfp4's
        default for the other activations, e.g. DeepSeek-V4-style experts)."""
        row = formats.get(format)
        if activation not in row.activations:
            raise ValueError(f"activation {activation!r} is not computed with {format} experts "
                             f"(supported: {', '.join(row.activations)})")
        names = row.tensors
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"format {format!r} needs tensor(s) {', '.join(missing)}")
        for n in names:
            if not isinstance(tensors[n], torch.Tensor):
                raise TypeError(f"{n} must be a torch.Tensor, got {type(tensors[n]).__name__}")
        if interleaved and format != "mxfp4":
            raise ValueError(f"interleaved gate/up rows are an mxfp4 layout (gpt-oss); {format} experts hold all gate "
                             "rows then all up rows")
        if format == "bf16":
            return cls(tensors["w13_weight"], tensors["w2_weight"], activation=activation, pool=pool,
                       swiglu_limit=swiglu_limit, situ_beta=situ_beta, situ_linear_beta=situ_linear_beta,
                       swiglu_alpha=swiglu_alpha)
        situ_args = dict(situ_beta=float(situ_beta), situ_linear_beta=float(situ_linear_beta))
        if format != "mxfp4":  # mxfp4 takes it as its own argument below
            situ_args["swiglu_alpha"] = float(swiglu_alpha)
        self = cls.__new__(cls)
        int8_act_from_env()  # as in __init__: a ConfigError for every format, before the engine reads it
        self._pool = pool if pool is not None else default_pool()
        if format == "wna16_int4":
            _check_g_idx(tensors)
        opt = cls._optional_tensors(row, tensors)
        if format == "mxfp4":
            if interleaved is None:
                interleaved = activation == "swigluoai"
            self._impl = _C.Layer.mxfp4(self._pool, *(tensors[n] for n in names), *opt, activation=activation,
                                        hidden_size=int(hidden_size or 0),
                                        intermediate_size=int(intermediate_size or 0),
                                        interleaved=bool(interleaved), swiglu_alpha=float(swiglu_alpha),
                                        swiglu_limit=float(swiglu_limit), **situ_args)
        elif format == "nvfp4":
            self._impl = _C.Layer.nvfp4(self._pool, *(tensors[n] for n in names), *opt, activation=activation,
                                        swiglu_limit=float(swiglu_limit), **situ_args)
        elif format == "wna16_int4":
            self._impl = _C.Layer.wna16_int4(self._pool, *(tensors[n] for n in names), *opt, activation=activation,
                                             swiglu_limit=float(swiglu_limit), **situ_args)
        elif format == "mxfp8":
            self._impl = _C.Layer.mxfp8(self._pool, *(tensors[n] for n in names), activation=activation,
                                        swiglu_limit=float(swiglu_limit), **situ_args)
        elif format == "fp8_block":
            bn, bk = block_size if block_size is not None else (0, 0)
            self._impl = _C.Layer.fp8_block(self._pool, *(tensors[n] for n in names), activation=activation,
                                            block_n=int(bn), block_k=int(bk), swiglu_limit=float(swiglu_limit),
                                            **situ_args)
        else:
            self._impl = _C.Layer.per_channel(self._pool, *(tensors[n] for n in names), activation=activation,
                                              format=format, swiglu_limit=float(swiglu_limit), **situ_args)
        self.activation = activation
        present = names + tuple(n for n, t in zip(row.optional, opt) if t is not None)
        self._source_bytes = sum(tensors[n].numel() * tensors[n].element_size() for n in present)
        return self

    @property
    def format(self) -> str:
        return self._impl.format

    def dequantized(self):
        """mxfp4 / nvfp4: (w13 [E, 2I, H], w2 [E, H, I]) fp32, the weights the engine computes with,
        decoded from its own packed copy (w13 rows [gate; up]; mxfp4 biases not included). For tests."""
        return self._impl.dequantized()

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
        """Bytes of the expert tensors the layer was built from (the 1.0x reference for nbytes)."""
        return self._source_bytes

    @property
    def last_compute_us(self) -> float:
        """Time the last forward spent inside the pool (all phases, all workers), microseconds."""
        return self._impl.last_compute_us

    @property
    def last_phase_us(self) -> dict:
        """The last forward's last chunk by phase, microseconds: `gate_up` and `down` (each phase from
        its start to the last worker done with it) and `gate_up_spread` / `down_spread` (first to
        last worker done: the tail each phase's barrier waits out)."""
        return self._impl.last_phase_us

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
