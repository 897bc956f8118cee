"""HybridMoE on the GPU: CPU path, streamed GPU path, resident layers, and a stack of linked
layers prefetching each other, against a plain torch reference. Needs an NVIDIA GPU."""
import pytest
import torch

import lk_moe
from lk_moe.hybrid import ExpertStreamer, HybridMoE
from lk_moe.reference import random_routing

from ..engine.conftest import assert_matches_reference, make_experts

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


def _sparse_batch(layer):
    """100 tokens all routed to experts 1 and 9 on the streamed path: (hybrid, output, x, ids, w,
    bytes the forward streamed)."""
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64)
    M = 100
    x = torch.randn(M, H).bfloat16()
    ids = torch.tensor([[1, 9]] * M, dtype=torch.int32)
    w = torch.rand(M, 2)
    before = h.streamer.bytes_copied
    out = h(x.cuda(), ids.cuda(), w.cuda())
    return h, out, x, ids, w, h.streamer.bytes_copied - before


def test_sparse_batch_copies_only_routed_experts(experts):
    w13, w2, layer = experts
    h, out, x, ids, w, streamed = _sparse_batch(layer)
    _check(out, x, w13, w2, ids, w)
    assert streamed == 2 * h.expert_bytes


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


# -- quantized formats: byte formats (fp8_block, fp8_channel, int8_channel: codes + fp32 scales; mxfp8:
# codes + e8m0 scales) and 4-bit formats (wna16_int4, mxfp4, nvfp4: the engine's 4-bit blocks + scales,
# zero points, biases, global scales) travel as the engine keeps them, are dequantized on the GPU to bf16
# (fp32-scaled byte formats: the fallback kernel, or its torch twin; mxfp8 and the 4-bit formats: plain
# torch ops) and computed by the bf16 GEMMs (mxfp4: with its biases and swigluoai).

from lk_moe import gpu_dequant  # noqa: E402
from lk_moe.hybrid import GpuCopyLayout, streamed_expert_bytes  # noqa: E402

from ..gpu_layout.test_gpu_4bit_layout import make_4bit_layer  # noqa: E402
from ..gpu_layout.test_gpu_mxfp8_layout import make_layer as make_mxfp8_layer  # noqa: E402
from ..gpu_layout.test_gpu_quant_layout import assert_close_to_dequantized_checkpoint  # noqa: E402
from ..gpu_layout.test_gpu_quant_layout import make_layer as make_byte_layer  # noqa: E402

BYTE_QFORMATS = ["fp8_block", "fp8_channel", "int8_channel"]
FOUR_BIT = ["wna16_int4", "mxfp4", "nvfp4"]
QFORMATS = BYTE_QFORMATS + ["mxfp8"] + FOUR_BIT


def make_quant_layer(fmt, E, H, I, pool=None, seed=0):
    """(layer, fp32 dequantized w13 [E, 2I, H] rows [gate; up], w2 [E, H, I], moe_reference activation
    and bias arguments); 4-bit: int4 asymmetric with group 32, mxfp4 gpt-oss style (swigluoai, biases)."""
    if fmt in FOUR_BIT:
        layer, _, d13, d2, act = make_4bit_layer(fmt, E, H, I, pool=pool, seed=seed)
        return layer, d13, d2, act
    if fmt == "mxfp8":
        layer, _, d13, d2 = make_mxfp8_layer(E, H, I, pool=pool, seed=seed)
        return layer, d13, d2, {}
    layer, _, d13, d2 = make_byte_layer(fmt, E, H, I, pool=pool, seed=seed)
    return layer, d13, d2, {}


@pytest.fixture(scope="module")
def quant_layers():
    return {fmt: make_quant_layer(fmt, E, H, I, seed=7) for fmt in QFORMATS}


@pytest.fixture
def forced_fallback(monkeypatch):
    """The H200 takes the native path for fp8_block, fp8_channel, int8_channel and wna16_int4
    (tests/gpu/test_native.py): these tests force the fallback."""
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "1")


def _check_quant(out, x, d13, d2, ids, w, act=None):
    """Error budget. The path computes with w = bf16(value) (one rounding: byte formats code x scale,
    int4 (u - z) x scale, nvfp4 e2m1 x fp8 scale x global scale; mxfp4 values are exact in bf16), then
    exactly a bf16 layer's roundings (fp32 GEMM sums, bf16 activation output, bf16 result):
    (a) against the fp32 reference on those bf16 weights: the bf16-layer bound of
        assert_matches_reference (|err| <= 1.01 u (mag + |ref|) + 1e-5 mag, u = 2^-8, rel RMS <= 2^-8;
        with mxfp4's biases and swigluoai as tests/engine/test_mxfp4 states it);
    (b) against the fp32 reference on the fp32 dequantized checkpoint weights: twice that bound and
        rel RMS <= 2 * 2^-8 (the weight rounding adds a term of the same size; measured on the CPU:
        rel RMS 0.0037), see tests/gpu_layout/test_gpu_quant_layout.assert_close_to_dequantized_checkpoint."""
    act = act or {}
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == x.shape
    xc, ic, wc = x.cuda(), ids.cuda(), w.cuda()
    act = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in act.items()}
    assert_matches_reference(out, xc, d13.bfloat16().cuda(), d2.bfloat16().cuda(), ic, wc, **act)
    assert_close_to_dequantized_checkpoint(out, xc, d13.cuda(), d2.cuda(), ic, wc, **act)


def _bf16_expert_bytes(layer):
    kp1, kp2, h_pad = layer._impl.padded_dims
    return 2 * (2 * kp2 * kp1 + h_pad * kp2)


def _max_ratio(fmt):
    """Streamed bytes per expert / bf16's: one byte per weight + scales (mxfp8: 1/32 byte a weight); 4-bit: half a
    byte + scales."""
    return 0.3 if fmt in FOUR_BIT else 0.52 if fmt == "mxfp8" else 0.51


@pytest.mark.parametrize("dequant", ["auto", "torch"])
@pytest.mark.parametrize("M", [2048, 8192])
@pytest.mark.parametrize("fmt", QFORMATS)
def test_quant_streamed(quant_layers, forced_fallback, fmt, M, dequant):
    layer, d13, d2, act = quant_layers[fmt]
    h = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=64, dequant=dequant)
    assert h.gpu_path == "fallback" and "LK_FORCE_GPU_FALLBACK=1" in h.gpu_path_reason
    want_impl = "kernel" if dequant == "auto" and gpu_dequant.kernel_usable() and fmt in BYTE_QFORMATS else "torch"
    assert h.dequant_impl == want_impl
    assert h.expert_bytes == streamed_expert_bytes(layer) < _max_ratio(fmt) * _bf16_expert_bytes(layer)
    x, ids, w = _inputs(M, M + len(fmt))
    before = h.streamer.bytes_copied
    out = h(x.cuda(), ids.cuda(), w.cuda())
    _check_quant(out, x, d13, d2, ids, w, act)
    routed = len(set(ids.reshape(-1).tolist()))
    assert h.streamer.bytes_copied - before == (E if routed * 2 >= E else routed) * h.expert_bytes


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_fp4_and_mxfp8_fallback_without_forcing(quant_layers, monkeypatch, fmt):
    """Without LK_FORCE_GPU_FALLBACK the FP4 formats and mxfp8 take the fallback too (no native kernel wired;
    FP4 / MXFP8 MMA would need sm_100+). wna16_int4 is native from sm_80: tests/gpu/test_native.py."""
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "0")
    layer, d13, d2, act = quant_layers[fmt]
    h = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=64)
    assert h.gpu_path == "fallback" and "no native GPU kernel" in h.gpu_path_reason and h.dequant_impl == "torch"
    x, ids, w = _inputs(2048, 21)
    _check_quant(h(x.cuda(), ids.cuda(), w.cuda()), x, d13, d2, ids, w, act)


@pytest.mark.parametrize("fmt", QFORMATS)
def test_quant_resident_kernel_equals_twin(quant_layers, forced_fallback, fmt):
    """Resident layers hold the dequantized matrices: kernel == torch twin on the GPU == twin on the CPU
    (4-bit formats: plain torch ops on the GPU == the same ops on the CPU; biases too)."""
    layer, d13, d2, act = quant_layers[fmt]
    on_cpu = GpuCopyLayout(layer, "torch")
    want13, want2 = on_cpu.unpack(on_cpu.sources)
    want_b = on_cpu.biases(on_cpu.sources)
    impls = ["torch"] + (["kernel"] if gpu_dequant.kernel_usable() and fmt in BYTE_QFORMATS else [])
    for impl in impls:
        h = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, resident=True, dequant=impl)
        assert h.dequant_impl == impl and h.gpu_path == "fallback"
        u13, u2 = h._resident_w
        assert torch.equal(u13.cpu().view(torch.int16), want13.view(torch.int16))
        assert torch.equal(u2.cpu().view(torch.int16), want2.view(torch.int16))
        assert (h._resident_b is None) == (want_b is None)
        if want_b is not None:
            assert torch.equal(h._resident_b[0].cpu(), want_b[0]) and torch.equal(h._resident_b[1].cpu(), want_b[1])
        x, ids, w = _inputs(300, 5)
        _check_quant(h(x.cuda(), ids.cuda(), w.cuda()), x, d13, d2, ids, w, act)


@pytest.mark.parametrize("fmt", QFORMATS)
def test_quant_sparse_batch_copies_only_routed_experts(quant_layers, forced_fallback, fmt):
    layer, d13, d2, act = quant_layers[fmt]
    h, out, x, ids, w, streamed = _sparse_batch(layer)
    _check_quant(out, x, d13, d2, ids, w, act)
    assert streamed == 2 * h.expert_bytes == 2 * streamed_expert_bytes(layer)


def test_quant_linked_stack_mixed_formats(quant_layers, experts, forced_fallback):
    """Quantized and bf16 layers share a 2-slot ring smaller than one layer, linked for prefetch:
    each layer's chunks keep their own layout; outputs stay right when the chain is broken."""
    w13, w2, bf16_layer = experts
    stack = [quant_layers["fp8_block"], (bf16_layer, w13, w2, None), quant_layers["mxfp4"],
             quant_layers["int8_channel"], quant_layers["nvfp4"], quant_layers["wna16_int4"],
             quant_layers["fp8_channel"], quant_layers["mxfp8"]]
    biggest = max(streamed_expert_bytes(lay) for lay, *_ in stack)
    ring = ExpertStreamer(slot_bytes=3 * biggest, slots=2)
    layers = [HybridMoE(None, None, layer=lay, max_tokens=8, top_k=K, gpu_min_batch=32, streamer=ring)
              for lay, *_ in stack]
    for a, b in zip(layers, layers[1:]):
        a.link_next(b)
    x, ids, w = _inputs(300, 6)
    n = len(stack)
    for order in (range(n), [0, 2, 1, 4, 3, 7, 6, 5, 5]):
        for i in order:
            out = layers[i](x.cuda(), ids.cuda(), w.cuda())
            lay, ref13, ref2, act = stack[i]
            if lay.format == "bf16":
                _check(out, x, ref13, ref2, ids, w)
            else:
                _check_quant(out, x, ref13, ref2, ids, w, act)


@pytest.mark.parametrize("fmt", QFORMATS)
def test_quant_three_numa_slices(tmp_path, forced_fallback, fmt):
    from ..engine.fake_sysfs import make_sysfs
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    pool = lk_moe.make_pool(threads=3, binding="NONE", sysfs_root=root, allowed=list(range(6)))
    layer, d13, d2, act = make_quant_layer(fmt, 8, 512, 384, pool=pool, seed=3)
    assert layer.num_slices == 3
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=4, gpu_min_batch=32)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2048, 512, generator=g).bfloat16()
    ids, w = random_routing(2048, 8, 4, generator=g)
    _check_quant(h(x.cuda(), ids.cuda(), w.cuda()), x, d13, d2, ids, w, act)


def test_4bit_layers_cpu_only_and_no_kernel():
    """gpu_min_batch=0 keeps a 4-bit layer on the CPU path (no GPU copy); dequant="kernel" is refused."""
    layer = make_4bit_layer("wna16_int4", 4, 256, 128)[0]
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=0)
    assert h.gpu_path is None and not h.takes_gpu_path(4096)
    with pytest.raises(ValueError, match="wna16_int4 experts have no dequantization kernel"):
        HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64, dequant="kernel")


def test_pinned_expert_bytes_are_counted_until_the_layer_goes():
    """The engine counts what it page-locks for streamed prefill (lvllm_pinned_host_bytes{kind="engine"} on
    /metrics: the kernel's VmPin does not see CUDA's registrations), and takes it back when the layer is freed."""
    import gc
    from lvllm.metrics import pinned_host_bytes
    w13, w2 = make_experts(4, 256, 128)
    gc.collect()  # layers the earlier tests left to the collector would otherwise be freed inside this test
    before = lk_moe._C.registered_host_bytes()
    layer = lk_moe.MoELayer(w13, w2)
    layer._impl.pin_for_gpu()
    weights = layer.nbytes  # bf16: the packed copy of the codes is all the engine registers
    assert weights == (w13.numel() + w2.numel()) * 2
    assert lk_moe._C.registered_host_bytes() - before == weights
    assert pinned_host_bytes()["engine"] == before + weights
    layer._impl.pin_for_gpu()  # once per layer
    assert lk_moe._C.registered_host_bytes() - before == weights
    del layer
    gc.collect()
    assert lk_moe._C.registered_host_bytes() == before
