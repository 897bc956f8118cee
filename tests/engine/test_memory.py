"""Host memory: ~1.0x the expert bytes, and no allocations in steady state."""
import torch

import lk_moe
from lk_moe import _C
from lk_moe.reference import random_routing

from .conftest import make_experts


def test_nbytes_close_to_expert_bytes():
    # Qwen3-30B-A3B expert shape, 16 experts (150 MiB): packed size within 1.02x.
    w13, w2 = make_experts(16, 2048, 768)
    layer = lk_moe.MoELayer(w13, w2)
    ratio = layer.nbytes / layer.expert_bytes
    assert 1.0 <= ratio <= 1.02, ratio


def test_fp16_weights_are_not_upcast():
    w13, w2 = make_experts(16, 2048, 768, dtype=torch.float16)
    layer = lk_moe.MoELayer(w13, w2)
    assert layer.nbytes <= 1.02 * (w13.numel() + w2.numel()) * 2


def test_no_allocations_in_steady_state():
    E, H, I, K = 16, 1024, 512, 8
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    cases = []
    for M in (1, 16, 300):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        cases.append((torch.empty(M, H, dtype=torch.bfloat16), x, ids, w))
    for c in cases:  # warm-up grows the scratch to the largest case
        layer.forward_into(*c)
    before = _C.alloc_count()
    for _ in range(20):
        for c in cases:
            layer.forward_into(*c)
    assert _C.alloc_count() == before


def test_layer_memory_is_released():
    live = _C.live_bytes()
    w13, w2 = make_experts(8, 1024, 512)
    layer = lk_moe.MoELayer(w13, w2)
    assert _C.live_bytes() >= live + layer.nbytes
    del layer
    assert _C.live_bytes() <= live
