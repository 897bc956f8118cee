"""The GPU expert cache (lk_moe.expert_cache) on a real GPU with vLLM 0.33.0's fused-MoE kernel: the
cached experts computed from VRAM slots while the CPU engine computes the rest, eager and inside a
captured CUDA graph whose slots change between replays, refills driven by the policy between steps,
the streamed prefill path skipping cached experts, the quantized formats in their slots (native codes
and scales, or bf16 for nvfp4), and gpt-oss's mxfp4 experts (swigluoai, biases) in bf16 slots.
Qwen3-30B-A3B expert shape (H 2048, I 768, top-8), fewer experts. Needs an NVIDIA GPU and vLLM.

What is checked, per output:
- the CPU side (the engine on the ids the split left it) within the engine's rigorous bound
  (tests/engine/conftest.py::assert_matches_reference);
- the GPU side (vLLM's kernel on the slots) against the fp32 reference on the pairs it took: relative
  RMS <= 3 * 2^-8 (the kernel rounds the pre-activations, the activation and each weighted expert
  output to bf16: ~2^-8 each, as derived in tests/gpu/test_native.py), and per element <= 2^-4 of the
  output's RMS (a wrong slot or expert is off by ~100%);
- the layer's output equals the two sides' sum up to its final bf16 rounding (the streams join right).
"""
import importlib.util

import numpy as np
import pytest
import torch

import lk_moe
from lk_moe.expert_cache import ExpertCache, TraceReplay
from lk_moe.hybrid import HybridMoE
from lk_moe.reference import moe_reference, random_routing

from ..engine.conftest import assert_matches_reference, make_experts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]

E, H, I, K = 32, 2048, 768, 8
U = 2.0 ** -8
SLOT_BYTES = 3 * H * I * 2  # one bf16 expert


@pytest.fixture(scope="module")
def experts():
    w13, w2 = make_experts(E, H, I, seed=3)
    return w13, w2, lk_moe.MoELayer(w13, w2)


def _inputs(M, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).bfloat16()
    ids, w = random_routing(M, E, K, generator=g)
    return x.cuda(), ids.cuda(), w.cuda()


def _cache(hybrid, slots, layers=1):
    cache = ExpertCache(slots * SLOT_BYTES * layers, layers)
    lc = cache.add_layer(hybrid)
    assert lc is not None and cache.slots == slots, cache.describe()
    return cache, lc


def _check_gpu_side(on_gpu, x, w13, w2, ids, w):
    ref = moe_reference(x, w13.cuda(), w2.cuda(), ids, w)
    rms = ref.pow(2).mean().sqrt()
    err = on_gpu.float() - ref
    assert (err.pow(2).mean().sqrt() / rms).item() <= 3 * U
    assert (err.abs().max() / rms).item() <= 2.0 ** -4


def _check_layer(out, lc, hybrid, x, ids, w, w13, w2):
    """out: the cache's layer output for (x, ids, w); the two sides checked on their own and summed."""
    gpu_ids, cpu_ids = lc.split(ids)
    gpu_side = torch.where(lc.map[gpu_ids.long()] >= 0, gpu_ids, -1)
    on_gpu = lc.gpu_part(x, gpu_ids, w)
    on_cpu = hybrid.cpu_path(x, cpu_ids, w)
    torch.cuda.synchronize()
    assert_matches_reference(on_cpu.cpu(), x.cpu(), w13, w2, cpu_ids.cpu(), w.cpu())
    if (gpu_side >= 0).any():
        _check_gpu_side(on_gpu, x, w13, w2, gpu_side, w)
    both = on_cpu.float() + on_gpu.float()
    assert ((out.float() - both).abs() <= U * both.abs() + 1e-6).all()
    assert_close_rms(out, moe_reference(x, w13.cuda(), w2.cuda(), ids, w))


def assert_close_rms(out, ref, limit=3 * U):
    rel = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert rel <= limit, rel


@pytest.mark.parametrize("M", [1, 4, 37])
def test_eager_split_adds_up(experts, M):
    w13, w2, layer = experts
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K)
    cache, lc = _cache(hybrid, 8)
    cache.place(0, [0, 3, 5, 9, 12, 17, 22, 31])
    x, ids, w = _inputs(M, M)
    before = lc.counts.clone()
    out = lc.forward(x, ids, w, hybrid.cpu_path)
    torch.cuda.synchronize()
    counts = (lc.counts - before).cpu()
    hits = sum(int(e) in (0, 3, 5, 9, 12, 17, 22, 31) for e in ids.reshape(-1).tolist())
    assert int(counts[E + 1]) == hits and int(counts[:E].sum()) == M * K
    _check_layer(out, lc, hybrid, x, ids, w, w13, w2)


def test_captured_graph_replays_with_the_slots_of_the_moment(experts):
    """One graph captured with the cache; between replays the slots change (place, refills through
    the policy); each replay is right for its inputs and the slots it finds."""
    w13, w2, layer = experts
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=K)
    cache, lc = _cache(hybrid, 6)
    cache.place(0, [1, 2, 3, 4, 5, 6])
    M = 4
    x, ids, w = _inputs(M, 100)
    xs, ids_s, ws = x.clone(), ids.clone(), w.clone()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (vLLM's kernels compile here)
        lc.forward(xs, ids_s, ws, hybrid.cpu_path)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s = lc.forward(xs, ids_s, ws, hybrid.cpu_path)
    for i, placed in enumerate(([1, 2, 3, 4, 5, 6], [20, 21, 22, 23, 24, 25], [], None)):
        if placed is None:  # the policy fills the slots: these experts are routed over and over
            hot = [7, 9, 11, 13, 15, 17, 19, 30]
            for _ in range(12):
                ids_s.copy_(torch.tensor([hot] * M, dtype=torch.int32))
                graph.replay()
                cache.before_step()
                torch.cuda.synchronize()
            cache.before_step()
            torch.cuda.synchronize()
            cache.before_step()
            held = sorted(int(e) for e in np.nonzero(cache._published[0, :E] >= 0)[0])
            assert set(held) <= set(hot) and len(held) == 6, held
        else:
            cache.place(0, placed)
        x, ids, w = _inputs(M, 200 + i)
        xs.copy_(x)
        ids_s.copy_(ids)
        ws.copy_(w)
        graph.replay()
        torch.cuda.synchronize()
        _check_layer(out_s.clone(), lc, hybrid, x, ids, w, w13, w2)
    hybrid.cpu_path.check_errors()


def test_refills_between_steps_follow_routing_and_count(experts):
    """The policy fills the slots with the experts routed step after step (one refill per layer and
    step here), then leaves them: every lookup hits, nothing churns."""
    w13, w2, layer = experts
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=K)
    cache, lc = _cache(hybrid, 8)
    hot = list(range(8, 16))
    M = 2
    ids = torch.tensor([hot] * M, dtype=torch.int32, device="cuda")
    for step in range(20):
        x, _, w = _inputs(M, 300 + step)
        out = lc.forward(x, ids, w, hybrid.cpu_path)
        cache.before_step()
        torch.cuda.synchronize()
    assert_close_rms(out, moe_reference(x, w13.cuda(), w2.cuda(), ids, w))
    assert sorted(int(e) for e in np.nonzero(cache._published[0, :E] >= 0)[0]) == hot
    t = cache.totals()
    assert t["refills"] == 8 and t["refill_bytes"] == 8 * lc.store.layout.expert_bytes
    assert t["lookups"] >= 16 * M * K and t["hits"] >= 8 * M * K, t
    _, cpu_ids = lc.split(ids)
    assert (cpu_ids == -1).all()  # the CPU engine gets nothing left to do


def test_streamed_prefill_skips_cached_experts(experts):
    w13, w2, layer = experts
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=16, top_k=2, gpu_min_batch=32)
    cache, lc = _cache(hybrid, 4)
    cache.place(0, [1, 9, 20, 21])
    M = 100
    x = torch.randn(M, H, device="cuda").bfloat16()
    ids = torch.tensor([[1, 9]] * 50 + [[1, 5]] * 50, dtype=torch.int32, device="cuda")
    w = torch.rand(M, 2, device="cuda")
    before = hybrid.streamer.bytes_copied
    out = hybrid.forward(x, ids, w, cache=lc)
    assert hybrid.streamer.bytes_copied - before == hybrid.expert_bytes  # only expert 5 travelled
    assert_close_rms(out, moe_reference(x, w13.cuda(), w2.cuda(), ids, w))


def test_layers_share_one_count_buffer_sized_at_load(experts):
    """The counts' ones are allocated when the layers join (vLLM's memory profile sees them), once for every
    layer: a streamed-prefill batch up to max_tokens allocates nothing more."""
    w13, w2, layer = experts
    cache = ExpertCache(4 * SLOT_BYTES * 2, 2)
    hybrids = [HybridMoE(None, None, layer=layer, max_tokens=16, top_k=2, gpu_min_batch=32) for _ in range(2)]
    lcs = [cache.add_layer(h, max_tokens=256) for h in hybrids]
    ones = cache.ones
    assert ones.numel() == 256 * 2
    M = 200
    x = torch.randn(M, H, device="cuda").bfloat16()
    ids = torch.randint(0, E, (M, 2), dtype=torch.int32, device="cuda")
    w = torch.rand(M, 2, device="cuda")
    for h, lc in zip(hybrids, lcs):
        assert_close_rms(h.forward(x, ids, w, cache=lc), moe_reference(x, w13.cuda(), w2.cuda(), ids, w))
    assert cache.ones is ones


# format, zero points, slot kind, relative RMS limit of the GPU side against the dequantized checkpoint:
# fp8 W8A8 quantizes the activations to fp8 (2^-4, tests/gpu/test_native.py); W8A16 / W4A16 and the bf16 slots
# of nvfp4 (each weight rounded to bf16 once) and mxfp8 (exact in bf16) keep bf16 activations (3 * 2^-8).
QUANTIZED = [("fp8_block", False, "native", 2.0 ** -4), ("int8_channel", False, "native", 3 * U),
             ("wna16_int4", True, "native", 3 * U), ("nvfp4", False, "bf16", 3 * U), ("mxfp8", False, "bf16", 3 * U)]


@pytest.mark.parametrize("fmt,zero_points,kind,limit", QUANTIZED, ids=[q[0] for q in QUANTIZED])
def test_quantized_slots(fmt, zero_points, kind, limit):
    from lvllm.testing.experts import quantize_experts
    w13f, w2f = make_experts(E, H, I, dtype=torch.float32, seed=4)
    tensors, d13, d2 = quantize_experts(fmt, w13f, w2f, optional=zero_points)
    layer = lk_moe.MoELayer.from_checkpoint(fmt, tensors)
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=16, top_k=K)
    cache = ExpertCache(8 << 30, 1)
    lc = cache.add_layer(hybrid)
    assert lc is not None and lc.store.kind == kind, cache.describe()
    if kind == "native":
        assert lc.store.slot_bytes < SLOT_BYTES * 0.6  # codes and scales, not bf16
    cache.place(0, list(range(0, E, 2)))
    _check_both_sides(lc, hybrid, *_inputs(8, 7), d13, d2, limit)


def _check_both_sides(lc, hybrid, x, ids, w, d13, d2, limit=3 * U, **act):
    """The cache's layer output, and its GPU side alone, against the fp32 reference on the dequantized
    checkpoint (d13, d2; act: the activation and bias arguments); both sides must have work."""
    out = lc.forward(x, ids, w, hybrid.cpu_path)
    gpu_ids, cpu_ids = lc.split(ids)
    gpu_side = torch.where(lc.map[gpu_ids.long()] >= 0, gpu_ids, -1)
    assert (gpu_side >= 0).any() and (cpu_ids >= 0).any()
    d13, d2 = d13.cuda(), d2.cuda()
    assert_close_rms(lc.gpu_part(x, gpu_ids, w), moe_reference(x, d13, d2, gpu_side, w, **act), limit)
    assert_close_rms(out, moe_reference(x, d13, d2, ids, w, **act), max(limit, 3 * U))


# gpt-oss-120b's expert shape (H = I = 2880, top-4) with vLLM's padding of the MXFP4 tensors (to 3072),
# fewer experts.
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "vllm_padded"])
def test_gpt_oss_slots_swigluoai_with_biases(padded):
    """mxfp4 with swigluoai and expert biases: bf16 slots (rows interleaved for vLLM's swigluoai),
    the biases in the slots, against the fp32 reference on the dequantized checkpoint: the GPU side
    within 3 * 2^-8 (mxfp4 values are exact in bf16, so only the kernel's roundings), the layer's output
    within the same with the engine's half added."""
    from ..gpu_layout.test_gpu_4bit_layout import make_4bit_layer
    Eg, Hg, Ig, Kg = 16, 2880, 2880, 4
    opt = dict(Hp=3072, Ip=3072) if padded else {}
    layer, _, d13, d2, act = make_4bit_layer("mxfp4", Eg, Hg, Ig, seed=5, **opt)
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=16, top_k=Kg)
    cache = ExpertCache(8 << 30, 1)
    lc = cache.add_layer(hybrid)
    assert lc is not None and lc.store.kind == "bf16" and lc.store.biased and lc.store.interleaved, cache.describe()
    cache.place(0, list(range(0, Eg, 2)))
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, Hg, generator=g).bfloat16().cuda()
    ids, w = random_routing(8, Eg, Kg, generator=g)
    ids, w = ids.cuda(), w.cuda()
    act = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in act.items()}
    _check_both_sides(lc, hybrid, x, ids, w, d13, d2, **act)


def test_trace_replay_takes_over_and_hands_back():
    replay = TraceReplay(layers=2, steps=3, rows=2, top_k=2, max_tokens=8, device="cuda")
    router = torch.tensor([[0, 1]] * 3, dtype=torch.int32, device="cuda")
    assert torch.equal(replay.apply(1, router), router)  # off until a trace is loaded
    trace = np.arange(3 * 2 * 2 * 2, dtype=np.int32).reshape(3, 2, 2, 2)
    replay.load(trace)
    assert replay.apply(1, router).tolist() == [trace[0, 1, 0].tolist(), trace[0, 1, 1].tolist(), trace[0, 1, 0].tolist()]
    replay.advance()
    assert replay.apply(0, router)[1].tolist() == trace[1, 0, 1].tolist()
    replay.disable()
    assert torch.equal(replay.apply(0, router), router)


def test_layers_the_cache_cannot_serve_are_said(experts):
    _, _, layer = experts
    hybrid = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=K)
    cache = ExpertCache(SLOT_BYTES // 2, 1)
    assert cache.add_layer(hybrid) is None
    assert "holds no slot" in cache.describe()
    w13, w2 = make_experts(4, 256, 128, seed=1)
    clamped = lk_moe.MoELayer(w13, w2, activation="silu_clamp", swiglu_limit=7.0)  # DeepSeek-V4's experts
    cache = ExpertCache(1 << 30, 1)
    assert cache.add_layer(HybridMoE(None, None, layer=clamped, max_tokens=8, top_k=2)) is None
    assert "activation is silu_clamp" in cache.describe()
