"""The GPU path's unpacking of the engine's packed blocks and its per-expert compute, checked on
the CPU (the same torch code runs on the GPU)."""
import pytest
import torch
import torch.nn.functional as F

import lk_moe
from lk_moe.gpu_experts import RoutedBatch, experts_forward
from lk_moe.gpu_layout import unpack_w13, unpack_w2
from lk_moe.reference import random_routing

from ..engine.conftest import assert_matches_reference, make_experts
from ..engine.fake_sysfs import make_sysfs


def _pools(tmp_path):
    yield lk_moe.default_pool()
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    yield lk_moe.make_pool(threads=3, binding="NONE", sysfs_root=root, allowed=list(range(6)))


@pytest.mark.parametrize("H,I", [(256, 128), (200, 72), (2880, 720)])
def test_unpack_restores_the_checkpoint_matrices(tmp_path, H, I):
    E = 3
    w13, w2 = make_experts(E, H, I)
    for pool in _pools(tmp_path):
        layer = lk_moe.MoELayer(w13, w2, pool=pool)
        kp1, kp2, h_pad = layer._impl.padded_dims
        sl = layer._impl.packed_slices()
        u13 = unpack_w13([s[0] for s in sl])
        u2 = unpack_w2([s[1] for s in sl])
        assert u13.shape == (E, 2 * kp2, kp1) and u2.shape == (E, h_pad, kp2)
        assert torch.equal(u13[:, :I, :H], w13[:, :I])
        assert torch.equal(u13[:, kp2:kp2 + I, :H], w13[:, I:])
        assert torch.equal(u2[:, :H, :I], w2)
        assert u13[:, :, H:].abs().sum() == 0 and u13[:, I:kp2].abs().sum() == 0
        assert u2[:, H:].abs().sum() == 0 and u2[:, :, I:].abs().sum() == 0


def test_experts_forward_matches_reference():
    E, H, I, K, M = 8, 256, 128, 4, 50
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    kp1, kp2, h_pad = layer._impl.padded_dims
    sl = layer._impl.packed_slices()
    u13, u2 = unpack_w13([s[0] for s in sl]), unpack_w2([s[1] for s in sl])
    x = torch.randn(M, H).bfloat16()
    ids, w = random_routing(M, E, K)
    ids[3, 1] = -1
    batch = RoutedBatch(ids, w, E)
    acc = torch.zeros(M, h_pad)
    x_pad = F.pad(x, (0, kp1 - H))
    experts_forward(x_pad, batch, u13[:5], u2[:5], 0, acc)      # two chunks of experts
    experts_forward(x_pad, batch, u13[5:], u2[5:], 5, acc)
    assert_matches_reference(acc[:, :H].bfloat16(), x, w13, w2, ids, w)
    acc2 = torch.zeros(M, h_pad)
    routed = batch.routed_experts()
    experts_forward(x_pad, batch, u13[routed], u2[routed], 0, acc2, expert_ids=routed)
    assert torch.equal(acc, acc2)


def test_routed_batch_rejects_bad_ids():
    ids = torch.tensor([[0, 3], [1, 8]], dtype=torch.int32)
    with pytest.raises(ValueError, match="outside 0..7"):
        RoutedBatch(ids, torch.ones(2, 2), 8)
    ids[1, 1] = -2
    with pytest.raises(ValueError, match="outside 0..7"):
        RoutedBatch(ids, torch.ones(2, 2), 8)
    ids[1, 1] = -1
    b = RoutedBatch(ids, torch.ones(2, 2), 8)
    assert b.counts[0] == 1 and b.counts[3] == 1 and sum(b.counts) == 3
