"""The GPU fallback path of the byte formats (fp8_block, fp8_channel, int8_channel), everything that
runs on the host: the engine's views of its packed codes and fp32 scales (Layer.quant_slices), the
bytes one expert takes over PCIe, the chunk layout of a staging slot, and the dequantize-then-unpack
step with the torch twin of the CUDA kernel (lk_moe.gpu_dequant), which defines the kernel's result.

Numerics: the GPU path computes with w = bf16(code x scale), the fp32 product rounded to bf16 once.
The checkpoint's fp32 dequantized weights d (code.float() x scale, the same fp32 product) rounded to
bf16 must therefore equal the unpacked matrices bit for bit; padding rows/columns must be zero."""
import pytest
import torch
import torch.nn.functional as F

import lk_moe
from lk_moe import gpu_dequant
from lk_moe.config import ConfigError, force_gpu_fallback, from_env
from lk_moe.gpu_experts import RoutedBatch, experts_forward
from lk_moe.gpu_layout import unpack_w13, unpack_w2
from lk_moe.hybrid import GpuCopyLayout, streamed_expert_bytes
from lk_moe.reference import random_routing

from ..engine.conftest import assert_matches_reference, make_experts
from ..engine.fake_sysfs import make_sysfs
from ..engine.test_channel_formats import make_channel_experts
from ..engine.test_fp8_block import make_fp8_experts

BYTE_FORMATS = ("fp8_block", "fp8_channel", "int8_channel")


def assert_close_to_dequantized_checkpoint(out, x, d13, d2, ids, w, **act):
    """Budget of the fallback path (weights bf16(code x scale), then a bf16 layer's roundings) against
    the fp32 reference on the fp32 dequantized checkpoint weights d13, d2. Two terms of the same size:
    a bf16 layer's roundings (bounded per element by assert_matches_reference with u = 2^-8, relative
    RMS <= 2^-8; measured 0.0023) and the one bf16 rounding of each weight (<= 2^-8 relative per weight,
    random signs; adds ~0.003 relative RMS in quadrature). Budget: twice the bf16-layer bound per
    element and relative RMS <= 2 * 2^-8. Measured on the CPU (E=16, H=2048, I=768, K=8, M=1024):
    relative RMS 0.0037, worst element 0.08 of this bound, for all three byte formats.
    The exact check is against the bf16-rounded weights (assert_matches_reference on d.bfloat16()).
    act: moe_reference's activation / bias arguments (mxfp4)."""
    from lk_moe.reference import moe_reference
    ref, mag = moe_reference(x, d13, d2, ids, w, return_magnitude=True, **act)
    assert out.shape == ref.shape
    err = (out.float() - ref).abs()
    u = 2.0 ** -8
    bound = 2 * (1.01 * u * (mag + ref.abs()) + 1e-5 * mag)
    worst = (err / bound.clamp_min(1e-30)).max().item()
    assert worst <= 1.0, f"error exceeds twice the bf16 rounding bound by {worst:.3g}x"
    rel_rms = (err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()
    assert rel_rms <= 2 * u, f"relative RMS error {rel_rms:.4g} > 2 * 2^-8"
    return rel_rms, worst


def make_layer(fmt, E, H, I, pool=None, seed=0):
    """(layer, checkpoint tensors, fp32 dequantized w13 [E, 2I, H], w2 [E, H, I])."""
    if fmt == "fp8_block":
        tensors, d13, d2 = make_fp8_experts(E, H, I, seed=seed)
    else:
        tensors, d13, d2 = make_channel_experts(fmt, E, H, I, seed=seed)
    return lk_moe.MoELayer.from_checkpoint(fmt, tensors, pool=pool), tensors, d13, d2


def _pools(tmp_path):
    yield lk_moe.default_pool()
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    yield lk_moe.make_pool(threads=3, binding="NONE", sysfs_root=root, allowed=list(range(6)))


# Block-quantized FP8 needs H and I multiples of the 128-wide scale blocks; the channel formats take any.
SHAPES = {"fp8_block": [(512, 384), (2048, 768)], "fp8_channel": [(256, 128), (200, 72), (2880, 720)],
          "int8_channel": [(256, 128), (200, 72), (2880, 720)]}
CASES = [(f, h, i) for f in BYTE_FORMATS for h, i in SHAPES[f]]


@pytest.mark.parametrize("fmt,H,I", CASES)
def test_quant_slices_views(tmp_path, fmt, H, I):
    """Shapes, dtypes, slice bounds and contents of the views, against the checkpoint tensors."""
    E = 3
    for pool in _pools(tmp_path):
        layer, t, _, _ = make_layer(fmt, E, H, I, pool=pool)
        kp1, kp2, h_pad = layer._impl.padded_dims
        codes, seg = layer._impl.byte_codes
        assert codes == ("int8" if fmt == "int8_channel" else "fp8_e4m3")
        assert seg == (128 if fmt == "fp8_block" else 0)
        sl = layer._impl.quant_slices()
        assert len(sl) == layer.num_slices
        p1 = kp1 // seg if seg else 16
        p2 = kp2 // seg if seg else 16
        c13_ck = t["w13_weight"].view(torch.uint8)
        c2_ck = t["w2_weight"].view(torch.uint8)
        for s, (w13, s13, w2, s2, i0, i1, h0, h1) in enumerate(sl):
            assert (i0, i1, h0, h1) == layer.slice_bounds(s)
            nbi, nbh = (i1 - i0) // 16, (h1 - h0) // 16
            assert w13.dtype == torch.uint8 and w13.shape == (E, nbi, 2, kp1 // 2, 16, 2)
            assert s13.dtype == torch.float32 and s13.shape == (E, nbi, 2, p1)
            assert w2.dtype == torch.uint8 and w2.shape == (E, nbh, kp2 // 2, 16, 2)
            assert s2.dtype == torch.float32 and s2.shape == (E, nbh, p2)
            assert all(v.is_contiguous() for v in (w13, s13, w2, s2))
            # Codes: the bf16 block layout, one byte per weight (the uint8 permute of gpu_layout).
            u13 = unpack_w13([w13])  # [E, 2*(i1-i0), kp1]: gate rows i0..i1, then up rows i0..i1
            u2 = unpack_w2([w2])
            for h in range(2):
                rows = u13[:, h * (i1 - i0):(h + 1) * (i1 - i0)]
                real = max(0, min(I, i1) - i0)
                assert torch.equal(rows[:, :real, :H], c13_ck[:, h * I + i0:h * I + i0 + real])
                assert rows[:, real:].sum() == 0 and rows[:, :, H:].sum() == 0
            real = max(0, min(H, h1) - h0)
            assert torch.equal(u2[:, :real, :I], c2_ck[:, h0:h0 + real])
            assert u2[:, real:].sum() == 0 and u2[:, :, I:].sum() == 0
            # Scales: per row (0 past the real rows), or per (16-row block, segment) from the scale grid.
            for e in range(E):
                for lb in range(nbi):
                    r0 = i0 + lb * 16
                    for h in range(2):
                        if seg:
                            ck = t["w13_weight_scale_inv"][e, (h * I + r0) // 128]
                        else:
                            sc = t["w13_weight_scale"].reshape(E, 2 * I)[e]
                            ck = torch.tensor([sc[h * I + r0 + n] if r0 + n < I else 0.0 for n in range(16)])
                        assert torch.equal(s13[e, lb, h], ck)
                for lb in range(nbh):
                    r0 = h0 + lb * 16
                    if seg:
                        ck = t["w2_weight_scale_inv"][e, r0 // 128]
                    else:
                        sc = t["w2_weight_scale"].reshape(E, H)[e]
                        ck = torch.tensor([sc[r0 + n] if r0 + n < H else 0.0 for n in range(16)])
                    assert torch.equal(s2[e, lb], ck)


def assert_unpacked_equal_bf16(u13, u2, d13, d2, ehi, padded_dims):
    """Plain matrices from the GPU layout ([E, 2*kp2, kp1] gate rows then up rows, [E, h_pad, kp2]) ==
    bf16 of the fp32 dequantized checkpoint (d13 [E, 2I, H], d2 [E, H, I]) bit for bit; padding zero."""
    (E, H, I), (kp1, kp2, h_pad) = ehi, padded_dims
    assert u13.dtype == torch.bfloat16 and u13.shape == (E, 2 * kp2, kp1)
    assert u2.dtype == torch.bfloat16 and u2.shape == (E, h_pad, kp2)
    want13, want2 = d13.bfloat16(), d2.bfloat16()
    assert torch.equal(u13[:, :I, :H].view(torch.int16), want13[:, :I].view(torch.int16))
    assert torch.equal(u13[:, kp2:kp2 + I, :H].view(torch.int16), want13[:, I:].view(torch.int16))
    assert torch.equal(u2[:, :H, :I].view(torch.int16), want2.view(torch.int16))
    assert u13[:, :, H:].abs().sum() == 0 and u13[:, I:kp2].abs().sum() == 0
    assert u13[:, kp2 + I:].abs().sum() == 0
    assert u2[:, H:].abs().sum() == 0 and u2[:, :, I:].abs().sum() == 0


@pytest.mark.parametrize("fmt,H,I", CASES)
def test_dequantized_views_equal_the_checkpoint_in_bf16(tmp_path, fmt, H, I):
    """views -> torch twin of the kernel -> plain matrices == bf16(fp32 dequantized checkpoint), bit for bit."""
    E = 3
    for pool in _pools(tmp_path):
        layer, _, d13, d2 = make_layer(fmt, E, H, I, pool=pool, seed=H)
        lay = GpuCopyLayout(layer, "torch")
        u13, u2 = lay.unpack(lay.sources)
        assert_unpacked_equal_bf16(u13, u2, d13, d2, (E, H, I), layer._impl.padded_dims)


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_staging_chunk_layout_round_trip(tmp_path, fmt):
    """A chunk (consecutive or not) copied into a flat uint8 buffer as the streamer does, read back as
    slot views and unpacked: the chunk's experts of the whole-layer unpack; bytes = n x expert_bytes."""
    E, H, I = 6, 512, 384
    for pool in _pools(tmp_path):
        layer, _, _, _ = make_layer(fmt, E, H, I, pool=pool)
        lay = GpuCopyLayout(layer, "torch")
        full13, full2 = lay.unpack(lay.sources)
        for chunk in ([0, 1, 2], [1, 3, 4], [5], [0, 2, 3, 5]):
            buf = torch.full((lay.chunk_bytes(len(chunk)) + 64,), 0xAB, dtype=torch.uint8)
            assert lay.copy_chunk(buf, chunk) == len(chunk) * lay.expert_bytes == lay.chunk_bytes(len(chunk))
            u13, u2 = lay.unpack_slot(buf, len(chunk))
            assert torch.equal(u13, full13[chunk]) and torch.equal(u2, full2[chunk])
            assert (buf[lay.chunk_bytes(len(chunk)):] == 0xAB).all()  # nothing written past the chunk


@pytest.mark.parametrize("fmt", ("bf16",) + BYTE_FORMATS)
def test_expert_bytes(fmt):
    """Per expert on the wire: block-padded codes (1 byte, bf16: 2) + fp32 scales (per row, or per
    16-row block and segment). The byte formats move ~half the bytes of bf16."""
    E, H, I = 4, 2048, 768
    if fmt == "bf16":
        layer = lk_moe.MoELayer(*make_experts(E, H, I))
    else:
        layer, _, _, _ = make_layer(fmt, E, H, I)
    kp1, kp2, h_pad = layer._impl.padded_dims
    weights = 2 * kp2 * kp1 + h_pad * kp2
    if fmt == "bf16":
        want = 2 * weights
    elif fmt == "fp8_block":
        want = weights + 4 * (2 * (kp2 // 16) * (kp1 // 128) + (h_pad // 16) * (kp2 // 128))
    else:
        want = weights + 4 * (2 * kp2 + h_pad)
    assert streamed_expert_bytes(layer) == want
    assert GpuCopyLayout(layer).expert_bytes == want
    if fmt != "bf16":
        assert want < 0.51 * 2 * weights
        # The same bytes as the engine's host copy of one expert (page rounding aside).
        assert abs(layer.nbytes / E - want) < 4 * 4096 / E


def test_views_of_other_formats_are_refused_clearly():
    """quant_slices() serves the byte formats only, and names the view the layer's format has (the 4-bit
    formats' own views are tested in test_gpu_4bit_layout)."""
    from ..engine.test_wna16 import make_int4_experts
    tensors = make_int4_experts(2, 256, 128, 32, False)[0]
    layer = lk_moe.MoELayer.from_checkpoint("wna16_int4", tensors)
    with pytest.raises(ValueError, match="quant_slices\\(\\) is for byte-weight layers.*wna16_int4"):
        layer._impl.quant_slices()
    assert layer._impl.byte_codes is None
    bf16 = lk_moe.MoELayer(*make_experts(2, 256, 128))
    with pytest.raises(ValueError, match="bf16 \\(use packed_slices\\)"):
        bf16._impl.quant_slices()
    assert gpu_dequant.gpu_path("fp6_someday", capability=(9, 0))[0] == "cpu"  # a format lk_moe does not know


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_fallback_math_on_the_cpu(fmt):
    """The streamed path's compute (experts_forward on the unpacked bf16 matrices, chunk by chunk) run on
    the CPU. Error budget: against the fp32 reference on the bf16-rounded dequantized weights, exactly a
    bf16 layer's (assert_matches_reference); against the fp32 dequantized checkpoint weights, twice that
    (assert_close_to_dequantized_checkpoint: the one bf16 rounding of each weight adds a term of the
    same size)."""
    E, H, I, K, M = 8, 512, 384, 4, 60
    layer, _, d13, d2 = make_layer(fmt, E, H, I, seed=5)
    kp1, kp2, h_pad = layer._impl.padded_dims
    lay = GpuCopyLayout(layer, "torch")
    x = torch.randn(M, H).bfloat16()
    ids, w = random_routing(M, E, K)
    batch = RoutedBatch(ids, w, E)
    acc = torch.zeros(M, h_pad)
    x_pad = F.pad(x, (0, kp1 - H))
    for chunk in ([0, 1, 2], [3, 5], [4, 6, 7]):
        buf = torch.empty(lay.chunk_bytes(len(chunk)), dtype=torch.uint8)
        lay.copy_chunk(buf, chunk)
        u13, u2 = lay.unpack_slot(buf, len(chunk))
        experts_forward(x_pad, batch, u13, u2, 0, acc, expert_ids=chunk)
    out = acc[:, :H].bfloat16()
    assert_matches_reference(out, x, d13.bfloat16(), d2.bfloat16(), ids, w)
    assert_close_to_dequantized_checkpoint(out, x, d13, d2, ids, w)


def test_dequantize_impls():
    g = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (2 * 16 * 64,), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.rand(2 * 16, generator=g) + 0.5
    ref = gpu_dequant.dequant_blocks_reference(packed, scales, 64, 0, "int8")
    assert torch.equal(gpu_dequant.dequantize(packed, scales, 64, 0, "int8", impl="torch"), ref)
    assert torch.equal(gpu_dequant.dequantize(packed, scales, 64, 0, "int8"), ref)  # auto on CPU: the twin
    out = torch.empty(32, 64, dtype=torch.bfloat16)
    assert gpu_dequant.dequantize(packed, scales, 64, 0, "int8", impl="torch", out=out) is out
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="impl must be one of auto, kernel, torch"):
        gpu_dequant.dequantize(packed, scales, 64, 0, "int8", impl="cuda")
    with pytest.raises((RuntimeError, ValueError)):  # no kernel library here, or CPU inputs
        gpu_dequant.dequantize(packed, scales, 64, 0, "int8", impl="kernel")
    with pytest.raises(ValueError, match="dequant must be one of"):
        GpuCopyLayout(make_layer("int8_channel", 2, 256, 128)[0], "fast")


def test_arch_runs():
    archs = ["75-real", "80-real", "86-real", "89-real", "90-real", "100-real", "120"]
    assert gpu_dequant.arch_runs(archs, (9, 0))      # H100/H200: SASS sm_90
    assert gpu_dequant.arch_runs(archs, (8, 7))      # sm_87 runs sm_86 SASS
    assert gpu_dequant.arch_runs(archs, (12, 1))     # SASS sm_120 (and its PTX)
    assert gpu_dequant.arch_runs(archs, (13, 0))     # PTX of sm_120, JIT-compiled
    assert not gpu_dequant.arch_runs(archs, (7, 0))  # older than every build
    assert not gpu_dequant.arch_runs(["80-real"], (9, 0))  # SASS of another major, no PTX
    assert gpu_dequant.arch_runs(["80"], (9, 0))
    assert not gpu_dequant.arch_runs([], (9, 0))


# -- which path a format takes, and LK_FORCE_GPU_FALLBACK

def test_gpu_path_of_the_byte_formats(monkeypatch):
    """Native (vLLM's kernel) from the first capability it runs on, the fallback below it or when forced;
    per-capability cases for every format: tests/gpu_layout/test_gpu_native_layout.py."""
    assert gpu_dequant.gpu_path("bf16")[0] == "bf16"
    for fmt in BYTE_FORMATS:
        need = (8, 0) if fmt == "int8_channel" else (8, 9)
        for cap in ((7, 5), (8, 0), (8, 9), (9, 0), (12, 0)):
            path, why = gpu_dequant.gpu_path(fmt, capability=cap, force_fallback=False)
            if cap >= need:
                assert path == "native" and "vLLM fused_experts" in why, why
            else:
                assert path == "fallback" and f"needs sm_{need[0]}{need[1]}+" in why, why
        path, why = gpu_dequant.gpu_path(fmt, capability=(9, 0), force_fallback=True)
        assert path == "fallback" and "LK_FORCE_GPU_FALLBACK=1" in why
    # the 4-bit formats: test_gpu_4bit_layout.test_gpu_path_of_the_4bit_formats
    assert gpu_dequant.GPU_FORMATS == ("bf16",) + BYTE_FORMATS + ("mxfp8", "wna16_int4", "mxfp4", "nvfp4")
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "1")
    assert gpu_dequant.gpu_path("fp8_block", capability=(9, 0))[0] == "fallback"
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "0")
    assert gpu_dequant.gpu_path("fp8_block", capability=(9, 0))[0] == "native"


@pytest.mark.parametrize("raw,want", [("", False), ("0", False), ("1", True), ("true", True), (" ON ", True),
                                      ("no", False)])
def test_force_gpu_fallback_values(raw, want):
    assert force_gpu_fallback({"LK_FORCE_GPU_FALLBACK": raw}) is want
    assert from_env({"LK_FORCE_GPU_FALLBACK": raw}, logical_cpus=8).force_gpu_fallback is want
    assert from_env({}, logical_cpus=8).force_gpu_fallback is False


def test_force_gpu_fallback_bad_value_names_the_variable(monkeypatch):
    with pytest.raises(ConfigError, match="LK_FORCE_GPU_FALLBACK='maybe' is not a boolean"):
        from_env({"LK_FORCE_GPU_FALLBACK": "maybe"}, logical_cpus=8)
    monkeypatch.setenv("LK_FORCE_GPU_FALLBACK", "2")
    with pytest.raises(ConfigError, match="LK_FORCE_GPU_FALLBACK='2'"):
        gpu_dequant.gpu_path("int8_channel", capability=(9, 0))


def test_bf16_staging_round_trip_gives_the_layer_weights(tmp_path):
    """The bf16 streamed path after the refactor into GpuCopyLayout: a chunk copied as the streamer
    does and unpacked is exactly the layer's vLLM-layout weights (zero-padded), expert by expert."""
    E, H, I = 6, 512, 384
    w13, w2 = make_experts(E, H, I)
    for pool in _pools(tmp_path):
        layer = lk_moe.MoELayer(w13, w2, pool=pool)
        lay = GpuCopyLayout(layer, "torch")
        kp1, kp2, h_pad = layer._impl.padded_dims
        for chunk in ([0, 1, 2], [1, 3, 4], [5], [0, 2, 3, 5]):
            buf = torch.zeros(lay.chunk_bytes(len(chunk)), dtype=torch.uint8)
            lay.copy_chunk(buf, chunk)
            u13, u2 = lay.unpack_slot(buf, len(chunk))
            assert u13.shape == (len(chunk), 2 * kp2, kp1) and u2.shape == (len(chunk), h_pad, kp2)
            want = w13[chunk]
            assert torch.equal(u13[:, :I, :H], want[:, :I]) and torch.equal(u13[:, kp2:kp2 + I, :H], want[:, I:])
            assert torch.equal(u2[:, :H, :I], w2[chunk])
