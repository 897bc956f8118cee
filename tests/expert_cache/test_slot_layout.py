"""The GPU expert cache's bf16 slot layout (lk_moe.expert_cache.SlotStore), built on the CPU from the
engine's own copy of a layer: what vLLM's fused-MoE kernel will read from a slot (w1, w2, and for
gpt-oss its biases, gate/up rows interleaved for swigluoai) computes, in plain fp32 torch math, the
checkpoint's expert. CI has no GPU: tests/gpu/test_expert_cache.py runs the kernel itself on the H200.

The store page-locks the engine's copy for its refills (CUDA); here that one call is stubbed, the
rest (the engine's tensors, the layout conversion) is the real code."""
import pytest
import torch

import lk_moe
import lk_moe.expert_cache as ec
from lk_moe.hybrid import GpuCopyLayout
from lk_moe.reference import gate_activation, moe_reference

from ..gpu_layout.test_gpu_4bit_layout import make_4bit_layer


class _NoPinImpl:
    """The engine layer's impl with pin_for_gpu (CUDA host registration) made a no-op."""

    def __init__(self, impl):
        self._impl = impl

    def pin_for_gpu(self):
        pass

    def __getattr__(self, name):
        return getattr(self._impl, name)


class _Layer:
    def __init__(self, layer):
        self._layer, self._impl = layer, _NoPinImpl(layer._impl)

    def __getattr__(self, name):
        return getattr(self._layer, name)


def _store(layer):
    hybrid = type("Hybrid", (), dict(layer=_Layer(layer), native=None, dtype=torch.bfloat16,
                                     copy_layout=GpuCopyLayout(layer, "torch")))()
    return ec.SlotStore(hybrid, "cpu")


def _slot_expert(store, x, expert, weight=1.0):
    """One expert of x through the slot's tensors as vLLM's kernel reads them (fp32 math)."""
    buf = torch.empty(store.layout.expert_bytes, dtype=torch.uint8)
    t = store._convert(store._stage(expert, buf))
    w1, w2 = t[0][0].float(), t[1][0].float()
    xp = torch.nn.functional.pad(x.float(), (0, w1.shape[1] - x.shape[1]))
    h = xp @ w1.t() + (t[2][0].float() if store.biased else 0)
    gate, up = (h[:, 0::2], h[:, 1::2]) if store.interleaved else h.chunk(2, dim=-1)
    act = gate_activation(store._activation.value, gate, up, 1.702, 7.0)
    y = act @ w2.t() + (t[3][0].float() if store.biased else 0)
    return weight * y[:, :x.shape[1]]


# (H, I), vLLM's padded (Hp, Ip) of the MXFP4 tensors or None; the last: gpt-oss's 2880 / 8, padded as vLLM pads
@pytest.mark.parametrize("shape,padded", [((96, 64), None), ((176, 72), (256, 128)), ((360, 360), (384, 384))],
                         ids=["unpadded", "padded", "gpt_oss_eighth"])
def test_gpt_oss_slots_interleave_gate_up_and_hold_the_biases(shape, padded):
    pytest.importorskip("vllm")  # the store names vLLM's activation enum
    H, I = shape
    opt = dict(Hp=padded[0], Ip=padded[1]) if padded else {}
    layer, _, d13, d2, act = make_4bit_layer("mxfp4", 4, H, I, seed=5, **opt)
    store = _store(layer)
    assert store.kind == "bf16" and store.biased and store.interleaved and store._activation.value == "swigluoai"
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(1)).bfloat16()
    for e in range(4):
        ids = torch.full((5, 1), e, dtype=torch.int32)
        want = moe_reference(x, d13, d2, ids, torch.ones(5, 1), **act)
        got = _slot_expert(store, x, e)
        # mxfp4 values and the bf16 biases are exact in the bf16 slots: only summation order differs
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_silu_slots_keep_gate_then_up():
    pytest.importorskip("vllm")
    w13, w2 = (torch.randn(4, 2 * 64, 128) / 12).bfloat16(), (torch.randn(4, 128, 64) / 8).bfloat16()
    store = _store(lk_moe.MoELayer(w13, w2))
    assert store.kind == "bf16" and not store.biased and not store.interleaved
    x = torch.randn(3, 128).bfloat16()
    want = moe_reference(x, w13, w2, torch.full((3, 1), 2, dtype=torch.int32), torch.ones(3, 1))
    assert torch.allclose(_slot_expert(store, x, 2), want, rtol=1e-4, atol=1e-5)


def test_activations_vllms_kernel_cannot_compute_are_refused():
    w13, w2 = torch.randn(2, 64, 64).bfloat16(), torch.randn(2, 64, 32).bfloat16()
    layer = lk_moe.MoELayer(w13, w2, activation="silu_clamp", swiglu_limit=7.0)
    with pytest.raises(ec.CacheUnsupported, match="activation is silu_clamp"):
        _store(layer)
