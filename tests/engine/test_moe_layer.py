"""MoELayer against the fp32 torch reference, on every ISA tier this CPU has."""
import pytest
import torch

import lk_moe
from lk_moe.reference import moe_reference, random_routing

from .conftest import assert_matches_reference, make_experts

# Qwen3-30B-A3B expert shape (H 2048, I 768, K 8) with fewer experts to keep CI fast.
QWEN = dict(E=16, H=2048, I=768, K=8)


@pytest.fixture(scope="module")
def qwen_layer():
    w13, w2 = make_experts(QWEN["E"], QWEN["H"], QWEN["I"])
    return lk_moe.MoELayer(w13, w2), w13, w2


@pytest.mark.parametrize("M", [1, 3, 16, 257, 1024])
def test_qwen_shape_every_tier(qwen_layer, tier, M):
    layer, w13, w2 = qwen_layer
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, QWEN["H"], generator=g).bfloat16()
    ids, w = random_routing(M, QWEN["E"], QWEN["K"], generator=g)
    assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


# (H, I) of real checkpoints and of their tensor-parallel shards; E and K reduced.
REAL_SHAPES = [
    (2048, 768),    # Qwen3-30B-A3B
    (2048, 1408),   # DeepSeek-V2-Lite, Qwen1.5-MoE
    (2048, 512),    # Qwen3.5-MoE-sized experts
    (2880, 2880),   # gpt-oss
    (2880, 720),    # gpt-oss at TP=4 (I not a multiple of 32)
    (4096, 1536),   # Qwen3-235B-A22B
    (4096, 1408),   # GLM-4.5-Air
    (5120, 1536),   # GLM-4.5
    (6144, 1024),   # 6144-hidden MoE (e.g. MiniMax-class)
    (7168, 2048),   # DeepSeek-V3 / Kimi-K2
    (200, 72),      # odd sizes: padding paths
]


@pytest.mark.parametrize("H,I", REAL_SHAPES)
def test_real_shapes(H, I):
    E, K = 6, 4
    w13, w2 = make_experts(E, H, I, seed=H + I)
    layer = lk_moe.MoELayer(w13, w2)
    for M in (1, 16, 130):
        g = torch.Generator().manual_seed(M)
        x = torch.randn(M, H, generator=g).bfloat16()
        ids, w = random_routing(M, E, K, generator=g)
        assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


@pytest.mark.parametrize("H,I", [(2880, 720), (7168, 2048)])
def test_real_shapes_every_tier(tier, H, I):
    E, K = 4, 4
    w13, w2 = make_experts(E, H, I, seed=1)
    layer = lk_moe.MoELayer(w13, w2)
    for M in (1, 40):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


def test_tiers_agree_closely():
    """Tiers compute the same fp32 sums in different orders. That can flip a bf16 rounding of an
    activation (bounded by u * mag, u = 2^-8) or of an output (1 ulp), so nearly all outputs are
    within 1 bf16 ulp of the generic tier's and none is further than those roundings allow."""
    g = torch.Generator().manual_seed(7)
    w13, w2 = make_experts(8, 512, 256)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(64, 512, generator=g).bfloat16()
    ids, w = random_routing(64, 8, 4, generator=g)
    _, mag = moe_reference(x, w13, w2, ids, w, return_magnitude=True)
    before = lk_moe.isa()
    outs = {}
    try:
        for t in lk_moe.supported_isas():
            lk_moe.set_isa(t)
            outs[t] = layer.forward(x, ids, w).float()
    finally:
        lk_moe.set_isa(before)
    base = outs["generic"]
    ulp = 2.0 ** (torch.floor(torch.log2(base.abs().clamp_min(1e-30))) - 7)
    for t, o in outs.items():
        diff = (o - base).abs()
        assert (diff <= 2 ** -8 * mag + 2 * ulp).all(), t
        assert (diff <= ulp).float().mean() > 0.99, t


def test_repeated_experts_across_tokens(tier):
    """Every token routes to the same two experts (hot experts, long token runs per expert)."""
    E, H, I = 8, 512, 256
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    M = 300
    ids = torch.tensor([[3, 5]] * M, dtype=torch.int32)
    w = torch.rand(M, 2)
    x = torch.randn(M, H).bfloat16()
    assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


def test_all_slots_on_one_expert(tier):
    """All K slots of a token name the same expert: its contribution is counted K times."""
    E, H, I, K = 8, 512, 256, 6
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    for M in (1, 5, 70):
        ids = torch.full((M, K), 2, dtype=torch.int32)
        w = torch.rand(M, K)
        x = torch.randn(M, H).bfloat16()
        out = layer.forward(x, ids, w)
        assert_matches_reference(out, x, w13, w2, ids, w)


def test_unused_slots(tier):
    """-1 marks an unused slot (expert-parallel masks); a token with only -1 slots gets zeros."""
    E, H, I, K = 8, 512, 256, 4
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    M = 40
    ids, w = random_routing(M, E, K)
    ids[torch.rand(M, K) < 0.4] = -1
    ids[7] = -1
    x = torch.randn(M, H).bfloat16()
    out = layer.forward(x, ids, w)
    assert torch.count_nonzero(out[7]) == 0
    assert_matches_reference(out, x, w13, w2, ids, w)
    ids_all = torch.full((3, K), -1, dtype=torch.int32)
    assert torch.count_nonzero(layer.forward(x[:3], ids_all, w[:3])) == 0


def test_fp16_inputs_and_weights(tier):
    E, H, I, K = 8, 1024, 512, 4
    w13, w2 = make_experts(E, H, I, dtype=torch.float16)
    layer = lk_moe.MoELayer(w13, w2)
    for M in (2, 33):
        x = torch.randn(M, H).half()
        ids, w = random_routing(M, E, K)
        out = layer.forward(x, ids, w)
        assert out.dtype == torch.float16
        assert_matches_reference(out, x, w13, w2, ids, w)


def test_many_experts_large_k():
    """E = 512, K = 16 (the upper end of real routers)."""
    E, H, I, K = 512, 256, 128, 16
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    for M in (1, 16, 200):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


def test_zero_tokens():
    w13, w2 = make_experts(4, 256, 64)
    layer = lk_moe.MoELayer(w13, w2)
    out = layer.forward(torch.empty(0, 256, dtype=torch.bfloat16), torch.empty(0, 2, dtype=torch.int32),
                        torch.empty(0, 2))
    assert out.shape == (0, 256)


def test_nan_is_not_hidden():
    """A NaN in the input must reach the output of the tokens that carry it (never masked)."""
    w13, w2 = make_experts(4, 256, 64)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(4, 256).bfloat16()
    x[1, 5] = float("nan")
    ids = torch.tensor([[0, 1]] * 4, dtype=torch.int32)
    out = layer.forward(x, ids, torch.ones(4, 2))
    assert torch.isnan(out[1]).any()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2:]).all()


def test_async_submit_and_forward_into():
    E, H, I, K = 8, 512, 256, 4
    w13, w2 = make_experts(E, H, I)
    a = lk_moe.MoELayer(w13, w2)
    b = lk_moe.MoELayer(w13.flip(0).contiguous(), w2.flip(0).contiguous())
    x = torch.randn(20, H).bfloat16()
    ids, w = random_routing(20, E, K)
    ha = a.submit(x, ids, w)
    hb = b.submit(x, ids, w)
    out_a, out_b = ha.wait(), hb.wait()
    assert ha.done() and hb.done()
    assert_matches_reference(out_a, x, w13, w2, ids, w)
    assert_matches_reference(out_b, x, w13.flip(0), w2.flip(0), ids, w)
    pinned_like = torch.empty(20, H, dtype=torch.bfloat16)
    res = a.forward_into(pinned_like, x, ids, w)
    assert res.data_ptr() == pinned_like.data_ptr()
    assert torch.equal(pinned_like, out_a)
    # a second submit on the same layer waits for the first: both results stay right
    h1 = a.submit(x, ids, w)
    h2 = a.submit(x[:5], ids[:5], w[:5])
    assert torch.equal(h1.wait(), out_a) and torch.equal(h2.wait(), out_a[:5])


@pytest.mark.parametrize("M", [1, 64])
def test_phase_times_add_up_within_the_pool_time(M):
    """last_phase_us: both phases inside the pool's time, each worker's tail inside its phase."""
    pool = lk_moe.make_pool(threads=3)
    layer = lk_moe.MoELayer(*make_experts(16, 512, 256, seed=3), pool=pool)
    x = torch.randn(M, 512).bfloat16()
    ids, w = random_routing(M, 16, 4)
    layer.forward(x, ids, w)
    p = layer.last_phase_us
    assert set(p) == {"gate_up", "down", "gate_up_spread", "down_spread"}
    assert p["gate_up"] > 0 and p["down"] > 0
    assert 0 <= p["gate_up_spread"] <= p["gate_up"] and 0 <= p["down_spread"] <= p["down"]
    assert p["gate_up"] + p["down"] <= layer.last_compute_us + 1e-3
