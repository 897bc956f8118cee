"""A forward handle dropped without wait() must be safe: the job keeps what it reads and writes
alive until it finished (the handle's destructor waits), so tensors allocated afterwards are never
written by it and the process never touches freed memory. Run in a child process: a use-after-free
shows there as a crash (SIGSEGV, glibc abort) or as probe tensors that changed."""
import os
import subprocess
import sys
import textwrap

import torch

import lk_moe

from .conftest import make_experts

CHILD = textwrap.dedent("""
    import sys
    import torch
    import lk_moe
    from lk_moe.reference import random_routing

    torch.manual_seed(0)
    E, H, I, K, M, ROUNDS = 8, 1024, 512, 4, 48, int(sys.argv[1])
    g = torch.Generator().manual_seed(1)
    layer = lk_moe.MoELayer((torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16(),
                            (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16(),
                            pool=lk_moe.make_pool(threads=2))
    x0 = torch.randn(M, H).bfloat16()
    ids0, w0 = random_routing(M, E, K)
    expect = layer.forward(x0, ids0, w0)
    changed = 0
    for r in range(ROUNDS):
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        layer.submit(x, ids, w)            # the handle is dropped at once
        if r % 2:
            layer.submit(x, ids, w, out=torch.empty(M, H, dtype=torch.bfloat16))
        del x, ids, w
        # fresh tensors of the freed sizes: the allocator hands the same memory back
        probes = [torch.full((M, H), 3.0, dtype=torch.bfloat16), torch.full((M, K), 7, dtype=torch.int32),
                  torch.full((M, K), 0.25), torch.full((M, H), -1.0, dtype=torch.bfloat16)]
        keep = [p.clone() for p in probes]
        got = layer.forward(x0, ids0, w0)  # waits for the dropped jobs first
        changed += sum(not torch.equal(p, k) for p, k in zip(probes, keep))
        assert torch.equal(got, expect), f"round {r}: a later forward's output changed"
    print(f"rounds={ROUNDS} probes_changed={changed}")
    sys.exit(3 if changed else 0)
""")


def test_dropped_submit_handles_are_safe():
    env = dict(os.environ, LK_THREADS="2")
    rounds = 60
    p = subprocess.run([sys.executable, "-c", CHILD, str(rounds)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"child exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    assert f"rounds={rounds} probes_changed=0" in p.stdout


def test_dropped_handle_keeps_its_output_alive():
    """The handle's destructor waits, so a result read afterwards through another reference is whole."""
    w13, w2 = make_experts(4, 256, 128)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(33, 256).bfloat16()
    ids = torch.randint(0, 4, (33, 2), dtype=torch.int32)
    w = torch.rand(33, 2)
    out = torch.full((33, 256), float("nan"), dtype=torch.bfloat16)
    layer.submit(x, ids, w, out=out)  # dropped: returns only when the job is done
    written = not torch.isnan(out.float()).any().item()  # read before anything else waits on the pool
    assert written, "the dropped handle returned before its job finished"
    assert torch.equal(out, layer.forward(x, ids, w))


def test_handle_wait_twice_and_done():
    w13, w2 = make_experts(2, 128, 64)
    layer = lk_moe.MoELayer(w13, w2)
    x = torch.randn(5, 128).bfloat16()
    ids = torch.zeros(5, 1, dtype=torch.int32)
    h = layer.submit(x, ids, torch.ones(5, 1))
    a = h.wait()
    assert h.done() and torch.equal(a, h.wait())
    empty = layer.submit(x[:0], ids[:0], torch.ones(0, 1))
    assert empty.done() and empty.wait().shape == (0, 128)
