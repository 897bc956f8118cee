"""The native GPU path: vLLM 0.33.0's fused-MoE kernel on the streamed codes (lk_moe.gpu_native), per
native format, on the Qwen3-30B-A3B expert shape (E=128, H=2048, I=768, top-8), against the fp32 torch
reference on the dequantized checkpoint weights and against the forced fallback. Needs an NVIDIA GPU
on which the format is native (H200: all four) and vLLM 0.33.0 with its CUDA ops.

Run: pytest -q tests/gpu/test_native.py   (or: bash tools/run_tests.sh -k native)

Error budget (derived in `native_bound`, checked per element, plus a relative-RMS check):
- the kernel's roundings, all to bf16 (u = 2^-8): the pre-activations (its intermediate cache), the
  activation output, each (token, expert) output times its router weight, the sum over the top-k
  (vLLM's moe_sum, which may add in bf16: (K - 1) u of the summed magnitudes), each chunk's sum, the
  result; int4 also rounds each weight (u - z) x scale to bf16 (fp8/int8 weights are exact: code in
  the MMA, fp32 scale on the fp32 sums);
- fp8 formats only: both GEMMs' inputs quantized to fp8 e4m3 (per token and 128 inputs for fp8_block,
  per token for fp8_channel): <= 2^-4 relative per normal element, plus <= 2^-9/448 of the group's
  largest magnitude for subnormals (2^-10 with exact scales; 2^-9 allows power-of-two scales); and the
  FP8 MMA's reduced-precision accumulation, budgeted as 2^-12 relative per term.
  The roundings before the second GEMM's sums are propagated as variances (first order through
  silu(g) * u) and bounded by 10 standard deviations; the later ones as worst cases (see native_bound).
  Relative RMS thresholds from the same roundings emulated in torch on
  the CPU (M=512, E=16, this shape): fp8_block 0.038, fp8_channel 0.042 -> checked <= 2^-4; int8_channel
  0.0053, wna16_int4 0.0057 -> checked <= 3 * 2^-8 (the fallback's budget is 2 * 2^-8: the kernel
  rounds the pre-activations and per-expert outputs to bf16, the fallback keeps them in fp32).
"""
import importlib.util

import pytest
import torch

from lk_moe import gpu_dequant, gpu_native
from lk_moe.hybrid import HybridMoE
from lk_moe.reference import moe_reference, random_routing, routed_experts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]

E, H, I, K = 128, 2048, 768, 8  # Qwen3-30B-A3B routed experts
U = 2.0 ** -8
FP8_EPS, FP8_SUB, FP8_ACC = 2.0 ** -4, 2.0 ** -9 / 448, 2.0 ** -12
# case -> (format, make_4bit_layer options)
CASES = {"fp8_block": ("fp8_block", {}), "fp8_channel": ("fp8_channel", {}), "int8_channel": ("int8_channel", {}),
         "wna16_int4-g32-asym": ("wna16_int4", dict(gs=32, asym=True)),
         "wna16_int4-g128-sym": ("wna16_int4", dict(gs=128, asym=False))}


def _rms_limit(fmt):
    return FP8_EPS if fmt.startswith("fp8") else 3 * U


def native_bound(x, d13, d2, ids, w, fmt):
    """Per element bound on |native - fp32 reference| for weights d13 [E, 2I, H], d2 [E, H, I] (fp32, the
    dequantized checkpoint), see the module docstring. Returns (bound, ref, magnitude) [M, H] fp32.

    The roundings before the second GEMM's sums (GEMM inputs to fp8, int4 weights to bf16, the
    pre-activations and the activation output to bf16) are many independent errors summed over 2048 or
    768 inputs: a worst-case sum of them over-estimates by ~sqrt(inputs) (measured: 400x for fp8), so
    they are propagated as variances (each relative rounding error has RMS <= its bound / sqrt(3); first
    order through silu(g) * u) and the bound takes 10 standard deviations (a Gaussian exceeds 6 once in
    10^9). The roundings after the sums (outputs to bf16, the top-k and chunk sums, the result) are
    added as worst cases; 1.05 covers second-order terms."""
    fp8 = fmt.startswith("fp8")
    va = (FP8_EPS ** 2 / 3 + FP8_ACC ** 2) if fp8 else 0.0  # variance of a GEMM input's relative error
    sub2 = FP8_SUB ** 2 if fp8 else 0.0                      # subnormals, relative to the row's largest element
    vw = U ** 2 / 3 if fmt == "wna16_int4" else 0.0           # int4 weights rounded to bf16
    vu = U ** 2 / 3
    M = x.shape[0]
    k_top = ids.shape[1]
    xf = x.float()
    x2 = xf * xf
    x2max = x2.amax(dim=1, keepdim=True)
    ref = torch.zeros(M, H, dtype=torch.float32, device=x.device)
    var = torch.zeros_like(ref)
    mag = torch.zeros_like(ref)
    sum_mag = torch.zeros_like(ref)  # sum over slots of w |y|: what the roundings after the GEMM scale
    for e, tok, k in routed_experts(ids):
        W13, W2 = d13[e], d2[e]
        h = xf[tok] @ W13.t()
        W13sq = W13 * W13
        vh = (va + vw) * (x2[tok] @ W13sq.t()) + sub2 * x2max[tok] * W13sq.sum(dim=1)[None] + vu * h * h
        (g, up), (vg, vup) = h.split(I, dim=1), vh.split(I, dim=1)
        sg = torch.sigmoid(g)
        s, ds = g * sg, sg * (1 + g * (1 - sg))  # silu and its derivative
        act = s * up
        a2 = act * act
        vact = (ds * up) ** 2 * vg + s * s * vup + (vu + va) * a2 + sub2 * a2.amax(dim=1, keepdim=True)
        W2sq = W2 * W2
        y = act @ W2.t()
        vy = vact @ W2sq.t() + vw * (a2 @ W2sq.t())
        rw = w[tok, k].unsqueeze(1)
        ref.index_add_(0, tok, y * rw)
        var.index_add_(0, tok, vy * rw * rw)
        sum_mag.index_add_(0, tok, y.abs() * rw)
        mag.index_add_(0, tok, (act.abs() @ W2.abs().t()) * rw)
    # 10 sigma of the GEMM-input roundings; (token, expert) outputs to bf16, their top-k sum (vLLM's
    # moe_sum may add in bf16: (K - 1) u), the chunk sums and the result: (K + 2) u of the magnitudes.
    bound = 10 * var.sqrt() + 1.05 * ((k_top + 2) * U * sum_mag + U * ref.abs()) + 1e-5 * mag
    return bound, ref, mag


def check_native(out, x, d13, d2, ids, w, fmt):
    """out against the fp32 reference on the dequantized checkpoint weights: per element within
    native_bound, relative RMS within _rms_limit(fmt). Returns (relative RMS, worst error / bound)."""
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == x.shape
    bound, ref, _ = native_bound(x, d13, d2, ids, w, fmt)
    err = (out.float() - ref).abs()
    worst = (err / bound.clamp_min(1e-30)).max().item()
    rel_rms = (err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert worst <= 1.0, f"{fmt}: an error exceeds the derived bound by {worst:.3g}x (rel RMS {rel_rms:.4g})"
    assert rel_rms <= _rms_limit(fmt), f"{fmt}: relative RMS error {rel_rms:.4g} > {_rms_limit(fmt):.4g}"
    return rel_rms, worst


def _fallback_bound(x, d13, d2, ids, w):
    """The fallback's budget against the same reference (tests/gpu_layout/test_gpu_quant_layout
    .assert_close_to_dequantized_checkpoint): twice the bf16-layer bound."""
    ref, mag = moe_reference(x, d13, d2, ids, w, return_magnitude=True)
    return 2 * (1.01 * U * (mag + ref.abs()) + 1e-5 * mag)


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    """(case name, format, layer, fp32 dequantized w13 and w2 on the GPU): one E=128 layer at a time."""
    from ..gpu_layout.test_gpu_4bit_layout import make_4bit_layer
    from ..gpu_layout.test_gpu_quant_layout import make_layer
    fmt, opt = CASES[request.param]
    path, why = gpu_dequant.gpu_path(fmt, force_fallback=False)
    if path != "native":
        pytest.skip(f"not native on this GPU: {why}")
    if fmt == "wna16_int4":
        layer, _, d13, d2, _ = make_4bit_layer(fmt, E, H, I, seed=5, **opt)
    else:
        layer, _, d13, d2 = make_layer(fmt, E, H, I, seed=5)
    return request.param, fmt, layer, d13.cuda(), d2.cuda()


def _inputs(M, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).bfloat16()
    ids, w = random_routing(M, E, K, generator=g)
    return x.cuda(), ids.cuda(), w.cuda()


@pytest.fixture
def unforced(monkeypatch):
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "0")


def test_native_streamed_matches_reference_and_fallback(case, unforced):
    """Streamed in chunks (a 4-slot ring of about a third of the layer each), M = 4096 tokens routed
    over all 128 experts: the path is reported as native, the result is within the derived bound of the
    fp32 reference, and within the sum of both budgets of the forced fallback's result."""
    name, fmt, layer, d13, d2 = case
    h = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=1024)
    assert h.gpu_path == "native" and h.native is not None and h.dequant_impl is None, h.gpu_path_reason
    assert h.gpu_path_reason.startswith(f"{fmt}: native on sm_") and "vLLM fused_experts" in h.gpu_path_reason
    assert h.experts_per_chunk < E  # several chunks: vLLM's expert_map picks each chunk's experts
    x, ids, w = _inputs(4096, 11)
    before = h.streamer.bytes_copied
    out = h(x, ids, w)
    assert h.streamer.bytes_copied - before == E * h.expert_bytes  # every expert streamed, as the fallback
    rel_rms, worst = check_native(out, x, d13, d2, ids, w, fmt)
    print(f"\n{name}: native vs fp32 reference: rel RMS {rel_rms:.4g}, worst {worst:.3g} of the bound")

    fb = HybridMoE(None, None, layer=layer, max_tokens=64, top_k=K, gpu_min_batch=1024, force_fallback=True)
    assert fb.gpu_path == "fallback" and fb.native is None and "LK_FORCE_GPU_FALLBACK=1" in fb.gpu_path_reason
    out_fb = fb(x, ids, w)
    bound = native_bound(x, d13, d2, ids, w, fmt)[0] + _fallback_bound(x, d13, d2, ids, w)
    diff = (out.float() - out_fb.float()).abs()
    assert (diff / bound).max().item() <= 1.0
    ref_rms = out_fb.float().pow(2).mean().sqrt()
    assert (diff.pow(2).mean().sqrt() / ref_rms).item() <= _rms_limit(fmt) + 2 * U


def test_native_sparse_batch_and_padding_ids(case, unforced):
    """A batch routed to few experts streams only those (chunks of experts out of order, mapped by vLLM's
    expert_map); -1 ids (padding) contribute nothing."""
    name, fmt, layer, d13, d2 = case
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64)
    assert h.gpu_path == "native"
    M = 1000
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, H, generator=g).bfloat16().cuda()
    pick = torch.tensor([5, 77, 9, 120, 33], dtype=torch.int32)
    a = torch.arange(M) % 5
    b = (a + 1 + (torch.arange(M) // 5) % 4) % 5  # another of the five
    ids = torch.stack([pick[a], pick[b]], dim=1)
    ids[::7, 1] = -1  # padding slots
    w = torch.rand(M, 2, generator=g)
    ids, w = ids.cuda(), w.cuda()
    before = h.streamer.bytes_copied
    out = h(x, ids, w)
    assert h.streamer.bytes_copied - before == 5 * h.expert_bytes
    check_native(out, x, d13, d2, ids, w, fmt)


def test_native_resident_keeps_codes(case, unforced):
    """A GPU-resident layer on the native path holds the codes in vLLM's layout (no bf16 copy)."""
    name, fmt, layer, d13, d2 = case
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=K, resident=True)
    assert h.gpu_path == "native" and h._resident_w is None and h._resident_native is not None
    assert h._resident_native.w1.element_size() == 1 and h._resident_native.w1.shape[0] == E
    x, ids, w = _inputs(512, 12)
    check_native(h(x, ids, w), x, d13, d2, ids, w, fmt)


def test_native_start_up_check_runs_the_kernel(monkeypatch):
    """NativeExperts' start-up self-check passes on this GPU for every native format (vLLM imports, the
    kernel launches and gives the dequantized weights' result)."""
    monkeypatch.setattr(gpu_native, "_CHECKED", set())  # run it here, whatever ran before
    for fmt in gpu_native.KERNELS:
        if gpu_dequant.gpu_path(fmt, force_fallback=False)[0] != "native":
            continue
        kp = (2048, 768, 2048)
        for parts in ((), ("w13", "s13", "z13", "w2", "s2", "z2")) if fmt == "wna16_int4" else ((),):
            n = gpu_native.NativeExperts(fmt, kp, parts)
            assert n.description == gpu_native.KERNELS[fmt][1]


def test_native_failure_at_start_up_is_clear(monkeypatch, unforced):
    """vLLM's kernel unavailable on a GPU that should run it: HybridMoE raises naming
    LK_FORCE_GPU_FALLBACK=1, and forcing the fallback works."""
    from ..gpu_layout.test_gpu_quant_layout import make_layer
    if gpu_dequant.gpu_path("fp8_channel", force_fallback=False)[0] != "native":
        pytest.skip("fp8_channel is not native on this GPU")

    def broken():
        raise ImportError("vllm._C missing (simulated)")
    monkeypatch.setattr(gpu_native, "_vllm", broken)
    layer = make_layer("fp8_channel", 4, 256, 128)[0]
    with pytest.raises(RuntimeError, match="LK_FORCE_GPU_FALLBACK=1"):
        HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64)
    h = HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64, force_fallback=True)
    assert h.gpu_path == "fallback"
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "1")
    assert HybridMoE(None, None, layer=layer, max_tokens=8, top_k=2, gpu_min_batch=64).gpu_path == "fallback"
