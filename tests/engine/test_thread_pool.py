"""Thread pool: repeated and concurrent forwards, oversubscription, parking, NUMA slicing."""
import os
import resource
import threading
import time

import pytest
import torch

import lk_moe
from lk_moe.reference import random_routing

from .conftest import assert_matches_reference, make_experts
from .fake_sysfs import make_sysfs


def test_repeated_forwards_are_stable():
    w13, w2 = make_experts(16, 512, 256)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(4, 512).bfloat16()
    ids, w = random_routing(4, 16, 4)
    first = layer.forward(x, ids, w)
    assert_matches_reference(first, x, w13, w2, ids, w)
    out = torch.empty_like(first)
    for _ in range(2000):
        layer.forward_into(out, x, ids, w)
    assert torch.equal(out, first)


def test_concurrent_layers_from_threads():
    """Layers driven from several Python threads at once (jobs queue on the shared pool)."""
    E, H, I, K = 8, 512, 256, 4
    layers = []
    for s in range(3):
        w13, w2 = make_experts(E, H, I, seed=s)
        layers.append((lk_moe.MoELayer(w13, w2), w13, w2))
    errors = []

    def drive(idx):
        layer, w13, w2 = layers[idx]
        g = torch.Generator().manual_seed(idx)
        try:
            for it in range(60):
                M = [1, 7, 70][it % 3]
                x = torch.randn(M, H, generator=g).bfloat16()
                ids, w = random_routing(M, E, K, generator=g)
                assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_more_threads_than_cores():
    cores = len(os.sched_getaffinity(0))
    pool = lk_moe.make_pool(threads=2 * cores + 1, spin_us=20)
    assert pool.num_threads == 2 * cores + 1
    w13, w2 = make_experts(8, 512, 256)
    layer = lk_moe.MoELayer(w13, w2, pool=pool)
    for M in (1, 9, 100):
        x = torch.randn(M, 512).bfloat16()
        ids, w = random_routing(M, 8, 4)
        for _ in range(20):
            out = layer.forward(x, ids, w)
        assert_matches_reference(out, x, w13, w2, ids, w)


def test_single_thread_pool():
    pool = lk_moe.make_pool(threads=1)
    w13, w2 = make_experts(8, 512, 256)
    layer = lk_moe.MoELayer(w13, w2, pool=pool)
    x = torch.randn(33, 512).bfloat16()
    ids, w = random_routing(33, 8, 4)
    assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


def test_idle_pool_parks():
    """After its spin window an idle pool sleeps in the kernel: no CPU time burnt without MoE work."""
    pool = lk_moe.make_pool(threads=2, spin_us=100)
    w13, w2 = make_experts(4, 256, 64)
    layer = lk_moe.MoELayer(w13, w2, pool=pool)
    x = torch.randn(1, 256).bfloat16()
    ids, w = random_routing(1, 4, 2)
    layer.forward(x, ids, w)
    time.sleep(0.05)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    time.sleep(0.5)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    wall = time.monotonic() - t0
    assert cpu < 0.05 * wall, f"idle pool used {cpu:.3f}s CPU in {wall:.3f}s"
    # and it wakes up for the next job
    wakes = pool.futex_wakes
    assert torch.isfinite(layer.forward(x, ids, w).float()).all()
    assert pool.futex_wakes > wakes


def test_default_pool_is_one_node_here():
    """This machine exposes a single NUMA node (or none): one slice holds every expert."""
    w13, w2 = make_experts(4, 256, 64)
    layer = lk_moe.MoELayer(w13, w2)
    topo = lk_moe._C.read_topology("/sys", [])
    if len(topo["nodes"]) == 1:
        assert layer.num_slices == 1
        assert layer.slice_bounds(0) == (0, 64, 0, 256)


@pytest.mark.parametrize("nodes,threads", [(2, 2), (3, 3), (4, 7), (3, 2)])
def test_numa_slices_on_synthetic_topology(tmp_path, nodes, threads):
    """A synthetic multi-node sysfs: weights split across node slices (gate/up by I, down by H),
    each slice computed by its node's threads, results equal to the reference."""
    cpus_per_node = 4
    root = make_sysfs(tmp_path, {n: list(range(n * cpus_per_node, (n + 1) * cpus_per_node)) for n in range(nodes)})
    allowed = list(range(nodes * cpus_per_node))
    pool = lk_moe.make_pool(threads=threads, binding="NONE", sysfs_root=root, allowed=allowed)
    used_nodes = min(nodes, threads)
    assert pool.num_nodes == used_nodes
    assert not pool.numa_placement  # synthetic: no mbind
    E, H, I, K = 8, 512, 320, 4
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2, pool=pool)
    assert layer.num_slices == used_nodes
    bounds = [layer.slice_bounds(s) for s in range(used_nodes)]
    assert bounds[0][0] == 0 and bounds[-1][1] == I and bounds[0][2] == 0 and bounds[-1][3] == H
    for a, b in zip(bounds, bounds[1:]):
        assert a[1] == b[0] and a[3] == b[2]  # contiguous, disjoint
    assert layer.nbytes < 1.02 * layer.expert_bytes + used_nodes * 2 * 2 * 1024 * 1024
    for M in (1, 5, 64, 300):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)


def test_cpu_core_binding_uses_physical_cores_first():
    pool = lk_moe.make_pool(threads=2, binding="CPU_CORE")
    topo = lk_moe._C.read_topology("/sys", [])
    cores = [c for n in topo["nodes"] for c in n["cores"]]
    first_of_core = {c[0] for c in cores}
    picked = [pool.cpus_of_thread(t) for t in range(pool.num_threads)]
    assert all(len(p) == 1 for p in picked)
    if len(cores) >= 2:
        assert {p[0] for p in picked} <= first_of_core
        assert len({p[0] for p in picked}) == 2
    none_pool = lk_moe.make_pool(threads=2, binding="NONE")
    assert none_pool.cpus_of_thread(0) == []


def test_one_layer_driven_from_two_threads():
    """The same layer called from two threads at once: calls serialise, results stay right."""
    E, H, I, K = 8, 512, 256, 4
    w13, w2 = make_experts(E, H, I)
    layer = lk_moe.MoELayer(w13, w2)
    errors = []

    def drive(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(40):
                M = int(torch.randint(1, 50, (1,), generator=g))
                x = torch.randn(M, H, generator=g).bfloat16()
                ids, w = random_routing(M, E, K, generator=g)
                assert_matches_reference(layer.forward(x, ids, w), x, w13, w2, ids, w)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
