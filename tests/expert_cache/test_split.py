"""The GPU expert cache's id split (lk_moe.expert_cache.split_ids), run on the CPU: every routed
(token, expert) goes to exactly one side, the counts are what a plain loop counts, and the two sides'
partial outputs add up to the whole layer (plain torch math, fp32)."""
import torch

from lk_moe.expert_cache import split_ids
from lk_moe.reference import moe_reference


def _case(M=13, E=16, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(torch.int32)
    ids[torch.rand(M, K, generator=g) < 0.15] = -1  # unused slots
    ids[3] = -1  # a padded row
    emap = torch.full((E + 1,), -1, dtype=torch.int32)
    cached = [e for e in (1, 4, 5, 11, 15) if e < E]
    emap[torch.tensor(cached)] = torch.arange(len(cached), dtype=torch.int32)
    return ids, emap, cached


def test_every_pair_goes_to_one_side_and_is_counted():
    ids, emap, cached = _case()
    E = emap.shape[0] - 1
    counts = torch.zeros(E + 2, dtype=torch.int32)
    ones = torch.ones(ids.numel() + 5, dtype=torch.int32)
    gpu_ids, cpu_ids = split_ids(ids, emap, counts, ones)
    want = [0] * (E + 2)
    for m in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[m, k])
            on_gpu = e >= 0 and e in cached
            assert int(gpu_ids[m, k]) == (E if e < 0 else e)
            assert int(cpu_ids[m, k]) == (-1 if e < 0 or on_gpu else e)
            want[E if e < 0 else e] += 1
            want[E + 1] += on_gpu
    assert counts.tolist() == want
    split_ids(ids, emap, counts, ones)  # counts accumulate over calls
    assert counts.tolist() == [2 * c for c in want]


def test_the_two_parts_add_up_to_the_layer():
    ids, emap, cached = _case(M=9, E=8, K=3, seed=1)
    E, H, I = 8, 64, 32
    g = torch.Generator().manual_seed(2)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    x = torch.randn(ids.shape[0], H, generator=g)
    wts = torch.rand(ids.shape, generator=g)
    counts = torch.zeros(E + 2, dtype=torch.int32)
    gpu_ids, cpu_ids = split_ids(ids, emap, counts, torch.ones(ids.numel(), dtype=torch.int32))
    # The GPU part computes the pairs its expert map sends to a slot; -1 elsewhere.
    gpu_side = torch.where(emap[gpu_ids.long()] >= 0, gpu_ids, -1)
    whole = moe_reference(x, w13, w2, ids, wts)
    parts = moe_reference(x, w13, w2, cpu_ids, wts) + moe_reference(x, w13, w2, gpu_side, wts)
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5)
