"""HybridMoE on the GPU: CPU path, streamed GPU path, resident layers, and a stack of linked
layers prefetching each other, against a plain torch reference. Needs an NVIDIA GPU."""
import pytest
import torch

import lk_moe
from lk_moe.hybrid import ExpertStreamer, HybridMoE
from lk_moe.reference import random_routing

from ..cpu.conftest import assert_matches_reference, make_experts

pytestmark = pytest.mark.gpu

E, H, I, K = 16, 2048, 768, 8


@pytest.fixture(scope="module")
def experts():
    w13, w2 = make_experts(E, H, I)
    return w13, w2, lk_moe.MoELayer(w13, w2)


def _check(out, x, w13, w2, ids, w):
    """Against the fp32 torch reference, computed on the GPU (same bounds as the CPU tests)."""
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == x.shape
    assert_matches_reference(out, x.cuda(), w13.cuda(), w2.cuda(), ids.cuda(), w.cuda())


def _inputs(M, seed, experts=E):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).bfloat16()
    ids, w = random_routing(M, experts, K, generator=g)
    return x, ids, w


@pytest.mark.parametrize("M", [1, 7, 64, 2048, 8192])
def test_paths(experts, M):
    w13, w2, layer = experts
    x, ids, w = _inputs(M, M)
    xc, ic, wc = x.cuda(), ids.cuda(), w.cuda()
    streamed = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=64)
    _check(streamed(xc, ic, wc), x, w13, w2, ids, w)  # CPU path below 64, GPU path from 64
    resident = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, resident=True)
    _check(resident(xc, ic, wc), x, w13, w2, ids, w)
    if M < 64:
        cpu_only = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=0)
        _check(cpu_only(xc, ic, wc), x, w13, w2, ids, w)


def test_sparse_batch_copies_only_routed_experts(experts):
    w13, w2, layer = experts
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64)
    M = 100
    x = torch.randn(M, H).bfloat16()
    ids = torch.tensor([[1, 9]] * M, dtype=torch.int32)
    w = torch.rand(M, 2)
    before = h.streamer.bytes_copied
    _check(h(x.cuda(), ids.cuda(), w.cuda()), x, w13, w2, ids, w)
    assert h.streamer.bytes_copied - before == 2 * h.expert_bytes


def test_linked_stack_with_prefetch_and_small_ring(experts):
    """8 layers share a 2-slot ring smaller than one layer: chunks of layer n+1 are copied while
    layer n computes; every layer's output stays right, also when layers repeat or skip."""
    w13, w2, _ = experts
    weights = [make_experts(E, H, I, seed=s) for s in range(8)]
    expert_bytes = 3 * H * I * 2
    ring = ExpertStreamer(slot_bytes=3 * expert_bytes, slots=2)
    layers = [HybridMoE(a, b, max_tokens=8, top_k=K, gpu_min_batch=32, streamer=ring) for a, b in weights]
    for a, b in zip(layers, layers[1:]):
        a.link_next(b)
    assert ring.nbytes < 2 * E * expert_bytes  # staging below 2 layers' worth
    x, ids, w = _inputs(300, 3)
    xc = x.cuda()
    for rnd in range(2):
        order = list(range(8)) if rnd == 0 else [0, 1, 3, 2, 5, 7]  # second round breaks the chain
        for i in order:
            out = layers[i](xc, ids.cuda(), w.cuda())
            _check(out, x, weights[i][0], weights[i][1], ids, w)


def test_two_layers_on_two_streams(experts):
    """Two independent layers driven from two CUDA streams at once (each its own ring)."""
    w13, w2, layer = experts
    a = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=K, gpu_min_batch=32)
    w13b, w2b = make_experts(E, H, I, seed=11)
    b = HybridMoE(w13b, w2b, max_tokens=8, top_k=K, gpu_min_batch=32)
    x, ids, w = _inputs(256, 4)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        oa = a(x.cuda(), ids.cuda(), w.cuda())
    with torch.cuda.stream(s2):
        ob = b(x.cuda(), ids.cuda(), w.cuda())
    torch.cuda.synchronize()
    _check(oa, x, w13, w2, ids, w)
    _check(ob, x, w13b, w2b, ids, w)
