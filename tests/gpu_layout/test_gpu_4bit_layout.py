"""The GPU fallback path of the 4-bit formats (wna16_int4, mxfp4, nvfp4), everything that runs on the
host: the engine's views of its packed 4-bit blocks (Layer.quant4_slices, Layer.global_scales), the
bytes one expert takes over PCIe, the chunk layout of a staging slot, the plain-torch dequantization
(lk_moe.gpu_dequant.dequant4_blocks: the same ops run on the GPU), and the streamed path's compute.

Numerics: the GPU path computes with w = bf16(value), the value the engine computes with rounded to
bf16 once: int4 (u - z) x scale (exact in fp32), mxfp4 e2m1 x 2^(s - 127) (exact in bf16), nvfp4
e2m1 x fp8 scale x global scale (the fp32 product). The independent fp32 dequantizations of the
ORIGINAL checkpoint tensors (lk_moe.reference) rounded to bf16 must therefore equal the unpacked
matrices bit for bit; padding rows/columns must be zero."""
import pytest
import torch
import torch.nn.functional as F

import lk_moe
from lk_moe import gpu_dequant
from lk_moe.gpu_experts import RoutedBatch, experts_forward
from lk_moe.hybrid import GpuCopyLayout, gpu_sources, quant4_parts, streamed_expert_bytes
from lk_moe.reference import (dequantize_mxfp4, dequantize_nvfp4_experts, dequantize_wna16_int4,
                              random_routing)

from ..engine.conftest import assert_matches_reference
from ..engine.test_mxfp4 import make_mxfp4
from ..engine.test_nvfp4 import make_nvfp4
from ..engine.test_wna16 import make_int4_experts
from .test_gpu_quant_layout import _pools, assert_close_to_dequantized_checkpoint, assert_unpacked_equal_bf16

FOUR_BIT = ("wna16_int4", "mxfp4", "nvfp4")


def make_4bit_layer(fmt, E, H, I, pool=None, seed=0, **opt):
    """(layer, checkpoint tensors, w13 [E, 2I, H] rows [gate; up], w2 [E, H, I], act): the weights
    dequantized in fp32 from the ORIGINAL tensors by lk_moe.reference, and the moe_reference keyword
    arguments of the layer's activation (mxfp4: swigluoai with biases, in [gate; up] order).
    opt: wna16_int4 gs (default 32), asym (True), scale_dtype (bf16); mxfp4 Hp, Ip (vLLM-padded
    tensors), bias (True); wna16_int4 and nvfp4: clamp, a swiglu_limit (the layer computes silu_clamp), or situ,
    (beta, linear_beta) (the layer computes Kimi's SituGLU)."""
    act = {}
    clamp, situ = opt.get("clamp"), opt.get("situ")
    silu_args = (dict(activation="silu_clamp", swiglu_limit=clamp) if clamp else
                 dict(activation="situ", situ_beta=situ[0], situ_linear_beta=situ[1]) if situ else {})
    if fmt == "wna16_int4":
        t, _, _ = make_int4_experts(E, H, I, opt.get("gs", 32), opt.get("asym", True),
                                    opt.get("scale_dtype", torch.bfloat16), seed)
        d13 = dequantize_wna16_int4(t["w13_weight_packed"], t["w13_weight_scale"], t.get("w13_weight_zero_point"))
        d2 = dequantize_wna16_int4(t["w2_weight_packed"], t["w2_weight_scale"], t.get("w2_weight_zero_point"))
        layer = lk_moe.MoELayer.from_checkpoint(fmt, t, pool=pool, **silu_args)
        act = dict(silu_args)
    elif fmt == "mxfp4":
        t, _, _, b13, b2 = make_mxfp4(E, H, I, opt.get("Hp"), opt.get("Ip"), True, opt.get("bias", True), seed=seed)
        d13 = dequantize_mxfp4(t["w13_weight"], t["w13_weight_scale"])[:, :2 * I, :H]
        d13 = torch.cat([d13[:, 0::2], d13[:, 1::2]], dim=1)  # gpt-oss interleaved rows -> [gate; up]
        d2 = dequantize_mxfp4(t["w2_weight"], t["w2_weight_scale"])[:, :H, :I]
        act = dict(activation="swigluoai")
        if b13 is not None:
            act.update(w13_bias=torch.cat([b13[:, 0::2], b13[:, 1::2]], dim=1), w2_bias=b2)
        layer = lk_moe.MoELayer.from_checkpoint(fmt, t, pool=pool, hidden_size=H, intermediate_size=I,
                                                activation="swigluoai")
    else:
        t, _, _ = make_nvfp4(E, H, I, seed=seed)
        d13, d2 = dequantize_nvfp4_experts(t)
        layer = lk_moe.MoELayer.from_checkpoint(fmt, t, pool=pool, **silu_args)
        act = dict(silu_args)
    return layer, t, d13, d2, act


# int4 needs H and I multiples of 32 (group sizes are); nvfp4 multiples of 16; mxfp4 any (vLLM pads).
CASES = [("wna16_int4", 96, 160, dict(gs=32, asym=True, scale_dtype=torch.float16)),
         ("wna16_int4", 512, 320, dict(gs=64, asym=False)),
         ("mxfp4", 176, 72, dict(Hp=256, Ip=128)),
         ("mxfp4", 96, 64, dict(bias=False)),
         ("nvfp4", 176, 80, {}),
         ("nvfp4", 96, 64, {})]
IDS = [f"{f}-{h}x{i}-{i_}" for i_, (f, h, i, _) in enumerate(CASES)]


def _bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("fmt,H,I,opt", CASES, ids=IDS)
def test_quant4_views(tmp_path, fmt, H, I, opt):
    """Shapes, dtypes and bounds of the views; zero points, biases, global scales where the layer has them."""
    E = 3
    for pool in _pools(tmp_path):
        layer, t, _, _, _ = make_4bit_layer(fmt, E, H, I, pool=pool, **opt)
        kp1, kp2, h_pad = layer._impl.padded_dims
        sl = layer._impl.quant4_slices()
        assert len(sl) == layer.num_slices
        G = {"mxfp4": 32, "nvfp4": 16}.get(fmt)
        sdt = {"mxfp4": torch.uint8, "nvfp4": torch.float8_e4m3fn}.get(fmt, opt.get("scale_dtype", torch.bfloat16))
        for s, d in enumerate(sl):
            i0, i1, h0, h1 = d["bounds"]
            assert (i0, i1, h0, h1) == layer.slice_bounds(s)
            nbi, nbh = (i1 - i0) // 16, (h1 - h0) // 16
            g1 = G or kp1 // d["s13"].shape[3]
            g2 = G or kp2 // d["s2"].shape[2]
            assert d["w13"].dtype == torch.uint8 and d["w13"].shape == (E, nbi, 2, kp1 // 4, 16, 2)
            assert d["w2"].dtype == torch.uint8 and d["w2"].shape == (E, nbh, kp2 // 4, 16, 2)
            assert d["s13"].dtype == sdt and d["s13"].shape == (E, nbi, 2, kp1 // g1, 16)
            assert d["s2"].dtype == sdt and d["s2"].shape == (E, nbh, kp2 // g2, 16)
            if fmt == "wna16_int4":  # the engine segment divides the checkpoint group
                assert opt["gs"] % g1 == 0 and opt["gs"] % g2 == 0
            asym, bias = fmt == "wna16_int4" and opt["asym"], fmt == "mxfp4" and opt.get("bias", True)
            assert ("z13" in d) == ("z2" in d) == asym and ("b13" in d) == ("b2" in d) == bias
            if asym:
                assert d["z13"].shape == (E, nbi, 2, kp1 // g1, 8) and d["z2"].shape == (E, nbh, kp2 // g2, 8)
            if bias:
                assert d["b13"].dtype == torch.bfloat16 and d["b13"].shape == (E, nbi, 2, 16)
                assert d["b2"].shape == (E, nbh, 16)
            assert all(v.is_contiguous() for k, v in d.items() if k != "bounds")
        assert quant4_parts(layer) == tuple(k for k in ("w13", "s13", "z13", "b13", "w2", "s2", "z2", "b2")
                                            if k in sl[0])
        g = layer._impl.global_scales()
        if fmt == "nvfp4":
            assert torch.equal(g[0], t["w13_weight_scale_2"]) and torch.equal(g[1], t["w2_weight_scale_2"])
        else:
            assert g is None


@pytest.mark.parametrize("fmt,H,I,opt", CASES, ids=IDS)
def test_dequantizing_in_expert_groups_gives_the_same_bits(tmp_path, monkeypatch, fmt, H, I, opt):
    """Bounded temporaries (gpu_dequant.DEQUANT4_GROUP_WEIGHTS): one expert per pass == all at once."""
    layer = make_4bit_layer(fmt, 3, H, I, seed=H, **opt)[0]
    lay = GpuCopyLayout(layer, "torch")
    whole = lay.unpack(lay.sources)
    monkeypatch.setattr(gpu_dequant, "DEQUANT4_GROUP_WEIGHTS", 1)
    grouped = lay.unpack(lay.sources)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(whole, grouped))


@pytest.mark.parametrize("fmt,H,I,opt", CASES, ids=IDS)
def test_dequantized_views_equal_the_checkpoint_in_bf16(tmp_path, fmt, H, I, opt):
    """views -> plain-torch dequantization -> plain matrices == bf16(fp32 dequantized original checkpoint
    tensors), bit for bit, on one NUMA slice and on three; padding zero; biases in [gate; up] order."""
    E = 3
    for pool in _pools(tmp_path):
        layer, _, d13, d2, act = make_4bit_layer(fmt, E, H, I, pool=pool, seed=H, **opt)
        kp1, kp2, h_pad = layer._impl.padded_dims
        lay = GpuCopyLayout(layer, "torch")
        u13, u2 = lay.unpack(lay.sources)
        assert_unpacked_equal_bf16(u13, u2, d13, d2, (E, H, I), (kp1, kp2, h_pad))
        b = lay.biases(lay.sources)
        if "w13_bias" in act:
            b13, b2 = b
            assert b13.shape == (E, 2 * kp2) and b2.shape == (E, h_pad)
            assert torch.equal(b13[:, :I], act["w13_bias"][:, :I]) and torch.equal(b13[:, kp2:kp2 + I],
                                                                                   act["w13_bias"][:, I:])
            assert torch.equal(b2[:, :H], act["w2_bias"])
            assert b13[:, I:kp2].abs().sum() == 0 and b13[:, kp2 + I:].abs().sum() == 0 and b2[:, H:].abs().sum() == 0
        else:
            assert b is None


@pytest.mark.parametrize("fmt", FOUR_BIT)
def test_staging_chunk_layout_round_trip(tmp_path, fmt):
    """A chunk (consecutive or not) copied into a flat uint8 buffer as the streamer does, read back as
    slot views and unpacked: the chunk's experts of the whole-layer unpack (biases too)."""
    E, H, I = 6, 256, 192
    for pool in _pools(tmp_path):
        layer, *_ = make_4bit_layer(fmt, E, H, I, pool=pool)
        lay = GpuCopyLayout(layer, "torch")
        full13, full2 = lay.unpack(lay.sources)
        full_b = lay.biases(lay.sources)
        for chunk in ([0, 1, 2], [1, 3, 4], [5], [0, 2, 3, 5]):
            buf = torch.full((lay.chunk_bytes(len(chunk)) + 64,), 0xAB, dtype=torch.uint8)
            assert lay.copy_chunk(buf, chunk) == len(chunk) * lay.expert_bytes == lay.chunk_bytes(len(chunk))
            views = lay.slot_views(buf, len(chunk))
            u13, u2 = lay.unpack(views)
            assert torch.equal(_bits(u13), _bits(full13[chunk])) and torch.equal(_bits(u2), _bits(full2[chunk]))
            b = lay.biases(views)
            assert (b is None) == (full_b is None)
            if b is not None:
                assert torch.equal(b[0], full_b[0][chunk]) and torch.equal(b[1], full_b[1][chunk])
            assert (buf[lay.chunk_bytes(len(chunk)):] == 0xAB).all()  # nothing written past the chunk


@pytest.mark.parametrize("fmt,opt", [("wna16_int4", dict(gs=128, asym=False)), ("wna16_int4", dict(gs=32, asym=True)),
                                     ("mxfp4", {}), ("nvfp4", {})])
def test_expert_bytes(fmt, opt):
    """Per expert on the wire: 4-bit codes + the scales (int4: 2 bytes per row and engine segment, plus
    half a byte of zero point; mxfp4: 1 byte per row and 32 inputs, plus bf16 biases per row; nvfp4: 1
    byte per row and 16 inputs, plus 12 bytes of global scales): about a quarter of bf16's bytes, and the
    engine's host copy of one expert."""
    E, H, I = 4, 2048, 768
    layer, *_ = make_4bit_layer(fmt, E, H, I, **opt)
    kp1, kp2, h_pad = layer._impl.padded_dims
    rows13, rows2 = 2 * kp2, h_pad
    weights = rows13 * kp1 + rows2 * kp2
    if fmt == "wna16_int4":
        seg = layer._impl.quant4_slices()[0]
        n1, n2 = seg["s13"].shape[3], seg["s2"].shape[2]  # scales per row
        want = weights // 2 + (2 + 0.5 * opt["asym"]) * (rows13 * n1 + rows2 * n2)
    elif fmt == "mxfp4":
        want = weights // 2 + (rows13 * kp1 + rows2 * kp2) // 32 + 2 * (rows13 + rows2)
    else:
        want = weights // 2 + (rows13 * kp1 + rows2 * kp2) // 16 + 12
    assert streamed_expert_bytes(layer) == want
    assert GpuCopyLayout(layer).expert_bytes == want
    assert want < 0.3 * 2 * weights
    # The engine's host bytes (each of its <= 8 host buffers rounded up to 2 MiB pages).
    assert E * want <= layer.nbytes < E * want + 8 * (2 << 20)


def _streamed_on_cpu(layer, x, ids, w, chunks):
    """What HybridMoE._streamed does per chunk (copy into a staging buffer, slot views, dequantize,
    experts_forward with the layer's activation and biases), on CPU tensors; the output [M, H] bf16."""
    kp1, kp2, h_pad = layer._impl.padded_dims
    lay = GpuCopyLayout(layer, "torch")
    M, H = x.shape
    batch = RoutedBatch(ids, w, layer.num_experts)
    acc = torch.zeros(M, h_pad)
    x_pad = F.pad(x, (0, kp1 - H))
    for chunk in chunks:
        buf = torch.empty(lay.chunk_bytes(len(chunk)), dtype=torch.uint8)
        lay.copy_chunk(buf, chunk)
        views = lay.slot_views(buf, len(chunk))
        u13, u2 = lay.unpack(views)
        experts_forward(x_pad, batch, u13, u2, 0, acc, expert_ids=chunk, biases=lay.biases(views),
                        activation=layer.activation, swiglu=tuple(layer._impl.swiglu))
    return acc[:, :H].bfloat16()


@pytest.mark.parametrize("M", [64, 600])
@pytest.mark.parametrize("fmt,H,I,opt", [("wna16_int4", 512, 384, dict(gs=128, asym=True)),
                                         ("wna16_int4", 256, 192, dict(gs=64, asym=False, scale_dtype=torch.float16)),
                                         ("mxfp4", 176, 72, dict(Hp=256, Ip=128)),
                                         ("mxfp4", 256, 192, dict(bias=False)),
                                         ("nvfp4", 176, 80, {}),
                                         ("wna16_int4", 256, 192, dict(gs=32, asym=False, clamp=0.25)),
                                         ("nvfp4", 176, 80, dict(clamp=0.25)),
                                         ("wna16_int4", 256, 192, dict(gs=32, asym=False, situ=(0.6, 0.8))),
                                         ("nvfp4", 176, 80, dict(situ=(0.6, 0.0)))])
def test_fallback_math_on_the_cpu(tmp_path, fmt, H, I, opt, M):
    """The streamed path's compute run on the CPU, chunk by chunk, on one NUMA slice and on three.
    Tolerance: against the fp32 reference on the bf16-rounded dequantized weights (what the path
    computes with), exactly a bf16 layer's bound (conftest.assert_matches_reference, with the
    activation and biases as test_mxfp4 states it: |err| <= 1.01 u (mag + |ref|) + 1e-5 mag, u = 2^-8,
    relative RMS <= 2^-8); against the fp32 dequantized checkpoint weights, twice that (the one bf16
    rounding of each weight adds a term of the same size for int4 and nvfp4; mxfp4 weights are exact)."""
    E, K = 8, 4
    for pool in _pools(tmp_path):
        layer, _, d13, d2, act = make_4bit_layer(fmt, E, H, I, pool=pool, seed=5, **opt)
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        ids[3, 1] = -1
        out = _streamed_on_cpu(layer, x, ids, w, ([0, 1, 2], [3, 5], [4, 6, 7]))
        assert_matches_reference(out, x, d13.bfloat16(), d2.bfloat16(), ids, w, **act)
        assert_close_to_dequantized_checkpoint(out, x, d13, d2, ids, w, **act)


def test_gpu_path_of_the_4bit_formats():
    """wna16_int4: vLLM's W4A16 kernel from sm_80; the FP4 formats: the fallback on every GPU (no native
    FP4 kernel is wired; FP4 MMA would need sm_100+)."""
    for fmt in FOUR_BIT:
        assert fmt in gpu_dequant.GPU_FORMATS
        for cap in ((7, 5), (8, 0), (9, 0), (10, 0), (12, 0)):
            path, why = gpu_dequant.gpu_path(fmt, capability=cap, force_fallback=False)
            if fmt == "wna16_int4" and cap >= (8, 0):
                assert path == "native" and "int4 W4A16" in why, why
            elif fmt == "wna16_int4":
                assert path == "fallback" and "needs sm_80+" in why, why
            else:
                assert path == "fallback" and "no native GPU kernel" in why and "sm_100" in why, why
        path, why = gpu_dequant.gpu_path(fmt, capability=(9, 0), force_fallback=True)
        assert path == "fallback" and "LK_FORCE_GPU_FALLBACK=1" in why
    # The native kernels are wired for plain silu: a clamped-silu layer (DeepSeek-V4) takes the fallback.
    path, why = gpu_dequant.gpu_path("wna16_int4", capability=(9, 0), force_fallback=False, activation="silu_clamp")
    assert path == "fallback" and "computes silu only" in why and "silu_clamp" in why, why


# -- bad inputs
def test_dequant4_blocks_rejects_bad_inputs():
    codes = torch.zeros(2, 8, 16, 2, dtype=torch.uint8)  # 2 blocks of kp = 32
    bf = torch.ones(2, 1, 16, dtype=torch.bfloat16)
    e8 = torch.full((2, 1, 16), 127, dtype=torch.uint8)
    f8 = torch.ones(2, 2, 16).to(torch.float8_e4m3fn)
    one = torch.ones(1, 1, 1)
    assert gpu_dequant.dequant4_blocks("wna16_int4", codes, bf).shape == (2, 16, 32)
    assert (gpu_dequant.dequant4_blocks("wna16_int4", codes, bf) == -8).all()  # u = 0, symmetric z = 8
    assert (gpu_dequant.dequant4_blocks("nvfp4", codes + 0x22, f8, global_scale=one * 0.5) == 0.5).all()
    with pytest.raises(ValueError, match="format must be one of wna16_int4, mxfp4, nvfp4, got 'fp8_block'"):
        gpu_dequant.dequant4_blocks("fp8_block", codes, bf)
    with pytest.raises(ValueError, match=r"codes must be uint8 \[\.\.\., kp/4, 16, 2\], got torch.int8"):
        gpu_dequant.dequant4_blocks("mxfp4", codes.to(torch.int8), e8)
    with pytest.raises(ValueError, match="codes must be uint8"):
        gpu_dequant.dequant4_blocks("mxfp4", codes.reshape(2, 16, 8, 2), e8)
    with pytest.raises(ValueError, match="mxfp4 scales must be torch.uint8, got torch.bfloat16"):
        gpu_dequant.dequant4_blocks("mxfp4", codes, bf)
    with pytest.raises(ValueError, match="wna16_int4 scales must be torch.bfloat16 or torch.float16"):
        gpu_dequant.dequant4_blocks("wna16_int4", codes, bf.float())
    with pytest.raises(ValueError, match="scales must be \\[\\.\\.\\., kp/G, 16\\].*G dividing kp=32"):
        gpu_dequant.dequant4_blocks("wna16_int4", codes, torch.ones(2, 3, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="leading dims \\[2\\]"):
        gpu_dequant.dequant4_blocks("mxfp4", codes, e8[:1])
    with pytest.raises(ValueError, match="zeros must be uint8 \\[2, 1, 8\\]"):
        gpu_dequant.dequant4_blocks("wna16_int4", codes, bf, zeros=torch.zeros(2, 1, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="mxfp4 has no zero points"):
        gpu_dequant.dequant4_blocks("mxfp4", codes, e8, zeros=torch.zeros(2, 1, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="nvfp4 needs its fp32 global scale"):
        gpu_dequant.dequant4_blocks("nvfp4", codes, f8)
    with pytest.raises(ValueError, match="mxfp4 takes no global scale"):
        gpu_dequant.dequant4_blocks("mxfp4", codes, e8, global_scale=one)
    with pytest.raises(ValueError, match="global_scale must be float32"):
        gpu_dequant.dequant4_blocks("nvfp4", codes, f8, global_scale=one.double())


def test_4bit_layers_refuse_the_other_views_and_the_kernel():
    layer, *_ = make_4bit_layer("wna16_int4", 2, 256, 128)
    with pytest.raises(ValueError, match="quant_slices\\(\\) is for byte-weight layers.*wna16_int4 \\(use quant4_slices\\)"):
        layer._impl.quant_slices()
    with pytest.raises(ValueError, match="packed_slices\\(\\) gives bf16/fp16 experts.*use quant4_slices\\(\\)"):
        layer._impl.packed_slices()
    assert layer._impl.byte_codes is None
    with pytest.raises(ValueError, match="wna16_int4 experts have no dequantization kernel"):
        GpuCopyLayout(layer, "kernel")
    with pytest.raises(ValueError, match="dequant must be one of"):
        GpuCopyLayout(layer, "fast")
    assert GpuCopyLayout(layer, "auto").dequant_impl == "torch"
    from ..engine.conftest import make_experts
    from .test_gpu_quant_layout import make_layer as make_byte_layer
    bf16 = lk_moe.MoELayer(*make_experts(2, 256, 128))
    with pytest.raises(ValueError, match="quant4_slices\\(\\) is for 4-bit layers.*this layer is bf16"):
        bf16._impl.quant4_slices()
    fp8 = make_byte_layer("fp8_channel", 2, 256, 128)[0]
    with pytest.raises(ValueError, match="this layer is byte-weight \\(use quant_slices\\)"):
        fp8._impl.quant4_slices()
    assert bf16._impl.global_scales() is None and len(gpu_sources(fp8)) == fp8.num_slices


def test_experts_forward_rejects_an_unknown_activation():
    batch = RoutedBatch(torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 1), 1)
    with pytest.raises(ValueError, match="activation must be one of silu, silu_clamp, swigluoai, situ, got 'gelu'"):
        experts_forward(torch.zeros(1, 32).bfloat16(), batch, torch.zeros(1, 64, 32).bfloat16(),
                        torch.zeros(1, 16, 32).bfloat16(), 0, torch.zeros(1, 16), activation="gelu")
