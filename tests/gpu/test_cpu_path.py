"""The CPU expert path driven from the GPU: eager, inside a captured CUDA graph, beside other
streams. Needs an NVIDIA GPU (skipped without one); run on the GPU machine."""
import time

import pytest
import torch

import lk_moe
from lk_moe.cpu_path import CpuExpertPath, PinnedIO
from lk_moe.reference import random_routing

from ..engine.conftest import assert_matches_reference, make_experts

pytestmark = pytest.mark.gpu

E, H, I, K = 16, 2048, 768, 8  # Qwen3-30B-A3B expert shape, fewer experts


@pytest.fixture(scope="module")
def experts():
    w13, w2 = make_experts(E, H, I)
    return lk_moe.MoELayer(w13, w2), w13, w2


def _inputs(M, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).bfloat16()
    ids, w = random_routing(M, E, K, generator=g)
    return x, ids, w


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
@pytest.mark.parametrize("M", [1, 7, 64])
def test_eager(experts, M, signal):
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=64, top_k=K, signal=signal)
    x, ids, w = _inputs(M, M)
    out = path(x.cuda(), ids.cuda(), w.cuda())
    assert out.is_cuda and out.dtype == torch.bfloat16
    assert_matches_reference(out.cpu(), x, w13, w2, ids, w)


def test_auto_signal_takes_the_kernel_for_decode_sizes_only(experts):
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=256, top_k=K)  # default: auto
    assert path.signal == "auto" and path.kernel_unusable is None  # the H200 runs the kernel
    assert path._fits_kernel(1) and path._fits_kernel(7) and not path._fits_kernel(256)
    for M in (1, 7, 256):  # 256 x 2048 bf16 = 1 MiB of x: hostfn
        x, ids, w = _inputs(M, 50 + M)
        out = path(x.cuda(), ids.cuda(), w.cuda())
        assert_matches_reference(out.cpu(), x, w13, w2, ids, w)
    assert 256 not in path._kargs and 7 in path._kargs  # only decode sizes went through the kernel
    assert path.engine_totals()[0] == 3
    # The counters' split is the engine's: M = 1 and 7 use < 16 slots per active expert (decode), 256 not.
    decode, prefill, queue_ns = path.engine_paths()
    assert decode[:2] == (2, 8) and prefill[:2] == (1, 256), (decode, prefill)
    assert 0 < queue_ns < decode[2] + prefill[2]  # waiting for the pool is part of each run's time
    path.check_errors()


def test_a_pool_on_every_cpu_is_warned_about(monkeypatch, caplog):
    import os
    from lk_moe import cpu_path
    monkeypatch.setattr(cpu_path, "_warned_full_pool", False)
    cpus = len(os.sched_getaffinity(0))
    w13, w2 = make_experts(2, 64, 32)
    full = lk_moe.MoELayer(w13, w2, pool=lk_moe.make_pool(threads=cpus))
    with caplog.at_level("WARNING", logger="lk_moe.cpu_path"):
        CpuExpertPath(full, max_tokens=4, top_k=2, signal="hostfn")
        CpuExpertPath(full, max_tokens=4, top_k=2, signal="hostfn")  # once per process
    msgs = [r.getMessage() for r in caplog.records if "use every CPU" in r.getMessage()]
    assert len(msgs) == 1 and f"LK_THREADS={max(1, cpus - 2)}" in msgs[0]


@pytest.mark.parametrize("signal", ["mailbox", "kernel"])
def test_new_sizes_past_the_registration_budget_take_hostfn(experts, signal, monkeypatch):
    from lk_moe import cpu_path
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=64, top_k=K, signal=signal)
    x, ids, w = _inputs(3, 3)
    path(x.cuda(), ids.cuda(), w.cuda())  # registers M=3
    monkeypatch.setattr(cpu_path, "SIGNAL_CALL_BUDGET", cpu_path._registered[signal])
    before = dict(cpu_path._registered)
    for M in (3, 5):  # 3: registered already, keeps its channel; 5: new, past the budget -> hostfn
        x, ids, w = _inputs(M, 100 + M)
        out = path(x.cuda(), ids.cuda(), w.cuda())
        assert_matches_reference(out.cpu(), x, w13, w2, ids, w)
    assert cpu_path._registered == before and 5 not in path._kargs and 5 not in path._mailbox_sizes
    path.check_errors()


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
def test_graph_replay_with_changing_inputs(experts, signal):
    layer, w13, w2 = experts
    M = 4
    path = CpuExpertPath(layer, max_tokens=16, top_k=K, signal=signal)
    x_s = torch.zeros(M, H, dtype=torch.bfloat16, device="cuda")
    ids_s = torch.zeros(M, K, dtype=torch.int32, device="cuda")
    w_s = torch.zeros(M, K, dtype=torch.float32, device="cuda")
    path(x_s, ids_s, w_s)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x_s * 2  # GPU work before and after the CPU call, as in a model
        out_s = path(y, ids_s, w_s)
        z = out_s * 2  # exact in bf16
    for it in range(100):
        x, ids, w = _inputs(M, 1000 + it)
        x_s.copy_(x.cuda())
        ids_s.copy_(ids.cuda())
        w_s.copy_(w.cuda())
        g.replay()
        got = z.cpu().float() / 2
        assert_matches_reference(got.bfloat16(), (x.float() * 2).bfloat16(), w13, w2, ids, w)
    path.check_errors()


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
def test_invalid_ids_in_graph_give_nan_and_an_error(experts, signal):
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=4, top_k=K, signal=signal)
    x, ids, w = _inputs(2, 5)
    ids[1, 3] = E  # out of range
    out = path(x.cuda(), ids.cuda(), w.cuda())
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
    with pytest.raises(ValueError, match="outside 0..15"):
        path.check_errors()


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
def test_overlaps_with_work_on_another_stream(experts, signal):
    """Shared-expert-style GPU work on a side stream runs while the CPU computes (with the kernel
    signal: while one block spins on one SM)."""
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=16, top_k=K, signal=signal)
    x, ids, w = _inputs(8, 9)
    xc, idc, wc = x.cuda(), ids.cuda(), w.cuda()
    side = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    out = path(xc, idc, wc)
    with torch.cuda.stream(side):
        shared = a @ a
    main.wait_stream(side)
    total = out.float() + shared[:8, :H].float() * 0
    torch.cuda.synchronize()
    assert_matches_reference(total.cpu().bfloat16(), x, w13, w2, ids, w)


def test_bad_inputs(experts):
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=4, top_k=K)
    x, ids, w = _inputs(2, 1)
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        path(x, ids, w)
    with pytest.raises(ValueError, match="outside 1..max_tokens=4"):
        x5, ids5, w5 = _inputs(5, 1)
        path(x5.cuda(), ids5.cuda(), w5.cuda())
    with pytest.raises(TypeError, match="int32"):
        path(x.cuda(), ids.long().cuda(), w.cuda())


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
def test_engine_totals_count_graph_replays_and_skip_padding(experts, signal):
    """The counters live in the host function: replays count like eager calls; rows whose ids
    are all -1 (vLLM's graph padding after drop_padding) are no tokens."""
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=8, top_k=K, signal=signal)
    x, ids, w = _inputs(4, 3)
    ids[3] = -1  # one padded row
    xc, idc, wc = x.cuda(), ids.cuda(), w.cuda()
    path(xc, idc, wc)  # eager (and warm-up)
    torch.cuda.synchronize()
    assert path.engine_totals()[:2] == (1, 3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        path(xc, idc, wc)
    torch.cuda.synchronize()
    assert path.engine_totals()[:2] == (1, 3)  # capturing runs nothing
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    calls, tokens, ns = path.engine_totals()
    assert (calls, tokens) == (6, 18) and ns > 0


# ---- the single-kernel signal (csrc/cuda/cpu_signal.cu): paths the parametrized tests above miss


@pytest.mark.parametrize("copy_max", [0, 1 << 30])  # 0: DMA copies around the kernel; huge: zero-copy
def test_kernel_signal_both_copy_modes_eager_and_graph(experts, copy_max):
    layer, w13, w2 = experts
    M = 16
    path = CpuExpertPath(layer, max_tokens=M, top_k=K, signal="kernel", kernel_copy_max_bytes=copy_max)
    x, ids, w = _inputs(M, 21)
    xc, idc, wc = x.cuda(), ids.cuda(), w.cuda()
    assert_matches_reference(path(xc, idc, wc).cpu(), x, w13, w2, ids, w)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_s = path(xc, idc, wc)
    for it in range(20):
        x, ids, w = _inputs(M, 300 + it)
        xc.copy_(x.cuda()), idc.copy_(ids.cuda()), wc.copy_(w.cuda())
        g.replay()
        assert_matches_reference(out_s.cpu(), x, w13, w2, ids, w)
    path.check_errors()


def test_kernel_signal_layers_sharing_buffers_in_one_graph(experts):
    """A decode step: several layer calls (distinct call ids) on one stream, one shared PinnedIO;
    every replay is a fresh request for each of them."""
    layer, w13, w2 = experts
    M, L = 2, 4
    io = PinnedIO(8, H, K)
    paths = [CpuExpertPath(layer, max_tokens=8, top_k=K, signal="kernel", io=io) for _ in range(L)]
    xs = [torch.zeros(M, H, dtype=torch.bfloat16, device="cuda") for _ in range(L)]
    ids_s = [torch.zeros(M, K, dtype=torch.int32, device="cuda") for _ in range(L)]
    ws = [torch.zeros(M, K, dtype=torch.float32, device="cuda") for _ in range(L)]
    outs = [torch.empty(M, H, dtype=torch.bfloat16, device="cuda") for _ in range(L)]

    def step():
        for i in range(L):
            paths[i](xs[i], ids_s[i], ws[i], out=outs[i])

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for it in range(10):
        ins = [_inputs(M, 500 + it * L + i) for i in range(L)]
        for i, (x, ids, w) in enumerate(ins):
            xs[i].copy_(x.cuda()), ids_s[i].copy_(ids.cuda()), ws[i].copy_(w.cuda())
        g.replay()
        torch.cuda.synchronize()
        for i, (x, ids, w) in enumerate(ins):
            assert_matches_reference(outs[i].cpu(), x, w13, w2, ids, w)
    for p in paths:
        p.check_errors()
    assert sum(p.engine_totals()[0] for p in paths) == L * 11


def test_kernel_signal_gives_up_when_the_engine_never_answers(experts):
    """Deadlock guard: with the poller paused the kernel waits kernel_timeout_s, writes NaN and
    counts an error; the GPU is free again and the next call (poller back) is correct."""
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=4, top_k=K, signal="kernel", kernel_timeout_s=0.2)
    x, ids, w = _inputs(2, 77)
    xc, idc, wc = x.cuda(), ids.cuda(), w.cuda()
    path(xc, idc, wc)  # registers the call; served
    torch.cuda.synchronize()
    path.check_errors()
    lk_moe._C._kernel_poller_pause(True)
    try:
        out = path(xc, idc, wc)
        torch.cuda.synchronize()  # returns after ~0.2 s instead of hanging
    finally:
        lk_moe._C._kernel_poller_pause(False)
    assert torch.isnan(out.float()).all()
    with pytest.raises(ValueError, match="timed out"):
        path.check_errors()
    time.sleep(0.05)  # the poller may still answer the stale request; the next run ignores that answer
    out = path(xc, idc, wc)
    torch.cuda.synchronize()
    assert_matches_reference(out.cpu(), x, w13, w2, ids, w)
    path.check_errors()


@pytest.mark.parametrize("signal", CpuExpertPath.SIGNALS)
def test_self_check_passes_on_a_working_path_and_counts_nothing(experts, signal):
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=8, top_k=K, signal=signal)
    path.self_check()
    assert path.take_errors() == 0 and path.errors_total == 0
    assert path.engine_totals()[0] == (2 if signal == "auto" else 1)  # auto: the kernel and the hostfn node


def test_self_check_under_vllms_bf16_default_dtype(experts):
    """vLLM 0.33 builds and post-processes layers under a bf16 default dtype (where the plugin runs
    self_check); the check's own tensors must not take it (the H200 start-up failed so, 2026-12-02)."""
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=8, top_k=K, signal="auto")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        path.self_check()
    finally:
        torch.set_default_dtype(old)
    assert path.take_errors() == 0


def test_self_check_catches_an_engine_that_does_not_answer(experts):
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=4, top_k=K, signal="kernel", kernel_timeout_s=0.2)
    lk_moe._C._kernel_poller_pause(True)
    try:
        with pytest.raises(RuntimeError, match=r"self-check failed \(kernel signal.*counted 1 error"):
            path.self_check()
    finally:
        lk_moe._C._kernel_poller_pause(False)
    time.sleep(0.05)


def test_take_errors_counts_runs_with_nan_once(experts):
    """What lvllm's reporting thread reads every interval: each NaN run once, graph replays too."""
    layer, _, _ = experts
    path = CpuExpertPath(layer, max_tokens=4, top_k=K, signal="hostfn")
    x, ids, w = _inputs(2, 6)
    ids[0, 0] = E + 3
    xc, idc, wc = x.cuda(), ids.cuda(), w.cuda()
    for _ in range(3):
        path(xc, idc, wc)
    torch.cuda.synchronize()
    assert path.take_errors() == 3 and path.take_errors() == 0 and path.errors_total == 3


def test_kernel_signal_non_contiguous_out_and_inputs(experts):
    layer, w13, w2 = experts
    path = CpuExpertPath(layer, max_tokens=8, top_k=K, signal="kernel")
    x, ids, w = _inputs(3, 88)
    xt = x.cuda().t().contiguous().t()  # same values, column-major
    out = torch.empty(H, 3, dtype=torch.bfloat16, device="cuda").t()
    got = path(xt, ids.cuda(), w.cuda(), out=out)
    assert got is out
    assert_matches_reference(out.cpu(), x, w13, w2, ids, w)
