"""The GPU path of mxfp8 experts (MiniMax-M3's MXFP8 release), everything that runs on the host: the engine's
views of its packed e4m3 codes and e8m0 scales (Layer.quant_slices), the bytes one expert takes over PCIe, the
chunk layout of a staging slot, and the dequantization by torch ops (lk_moe.gpu_dequant.dequant_mx_blocks) that
the GPU runs too.

Numerics: code x 2^(s - 127) has 4 significant bits and is exact in bf16 within its normal range, so the unpacked
matrices must equal the checkpoint's dequantized weights (reference.dequantize_mxfp8, exact in fp32) rounded to
bf16 bit for bit, and the streamed path computes a plain bf16 layer on exactly the checkpoint's weights."""
import pytest
import torch
import torch.nn.functional as F

import lk_moe
from lk_moe import gpu_dequant
from lk_moe.gpu_experts import RoutedBatch, experts_forward
from lk_moe.gpu_layout import unpack_w13, unpack_w2
from lk_moe.hybrid import GpuCopyLayout, streamed_expert_bytes
from lk_moe.reference import dequantize_mxfp8, random_routing

from ..engine.conftest import assert_matches_reference
from ..engine.test_mxfp8 import make_mxfp8_experts
from .test_gpu_quant_layout import _pools, assert_unpacked_equal_bf16

# H and I multiples of 32 (what MXFP8 checkpoints hold), some not of 64; rows split over one and three NUMA slices
SHAPES = [(512, 256), (384, 160), (224, 96)]


def make_layer(E, H, I, pool=None, seed=0, **kw):
    tensors, d13, d2 = make_mxfp8_experts(E, H, I, seed=seed, spread=3)
    return lk_moe.MoELayer.from_checkpoint("mxfp8", tensors, pool=pool, **kw), tensors, d13, d2


@pytest.mark.parametrize("H,I", SHAPES)
def test_quant_slices_views(tmp_path, H, I):
    """Shapes, dtypes and contents of the views against the checkpoint: codes in the byte block layout, one e8m0
    byte per row and 32 inputs ([kp/32, 16] a block), 127 (a scale of one, over zero codes) past the real rows
    and columns."""
    E = 3
    for pool in _pools(tmp_path):
        layer, t, _, _ = make_layer(E, H, I, pool=pool)
        kp1, kp2, _ = layer._impl.padded_dims
        assert layer._impl.byte_codes is None  # no fp32 scales: the fallback kernel does not take it
        sl = layer._impl.quant_slices()
        assert len(sl) == layer.num_slices
        c13, c2 = t["w13_weight"].view(torch.uint8), t["w2_weight"].view(torch.uint8)
        sc13, sc2 = t["w13_weight_scale"], t["w2_weight_scale"]
        for s, (w13, s13, w2, s2, i0, i1, h0, h1) in enumerate(sl):
            assert (i0, i1, h0, h1) == layer.slice_bounds(s)
            nbi, nbh = (i1 - i0) // 16, (h1 - h0) // 16
            assert w13.dtype == torch.uint8 and w13.shape == (E, nbi, 2, kp1 // 2, 16, 2)
            assert s13.dtype == torch.uint8 and s13.shape == (E, nbi, 2, kp1 // 32, 16)
            assert w2.dtype == torch.uint8 and w2.shape == (E, nbh, kp2 // 2, 16, 2)
            assert s2.dtype == torch.uint8 and s2.shape == (E, nbh, kp2 // 32, 16)
            u13, u2 = unpack_w13([w13]), unpack_w2([w2])
            for h in range(2):
                real = max(0, min(I, i1) - i0)
                rows = u13[:, h * (i1 - i0):(h + 1) * (i1 - i0)]
                assert torch.equal(rows[:, :real, :H], c13[:, h * I + i0:h * I + i0 + real])
                assert rows[:, real:].sum() == 0 and rows[:, :, H:].sum() == 0
                # scales [E, nbi, kp1/32, 16] -> [E, rows, kp1/32]
                got = s13[:, :, h].transpose(2, 3).reshape(E, nbi * 16, kp1 // 32)
                cols = sc13.shape[-1]
                assert torch.equal(got[:, :real, :cols], sc13[:, h * I + i0:h * I + i0 + real])
                assert (got[:, real:] == 127).all() and (got[:, :, cols:] == 127).all()
            real = max(0, min(H, h1) - h0)
            assert torch.equal(u2[:, :real, :I], c2[:, h0:h0 + real])
            got = s2.transpose(2, 3).reshape(E, nbh * 16, kp2 // 32)
            cols = sc2.shape[-1]
            assert torch.equal(got[:, :real, :cols], sc2[:, h0:h0 + real])
            assert (got[:, real:] == 127).all() and (got[:, :, cols:] == 127).all()


@pytest.mark.parametrize("H,I", SHAPES)
def test_dequantized_views_equal_the_checkpoint_in_bf16(tmp_path, H, I):
    """views -> dequant_mx_blocks -> plain matrices == bf16(the exact dequantized checkpoint), bit for bit, on one
    NUMA slice and on three."""
    E = 3
    for pool in _pools(tmp_path):
        layer, _, d13, d2 = make_layer(E, H, I, pool=pool, seed=H)
        lay = GpuCopyLayout(layer, "auto")
        assert lay.dequant_impl == "torch"
        u13, u2 = lay.unpack(lay.sources)
        assert_unpacked_equal_bf16(u13, u2, d13, d2, (E, H, I), layer._impl.padded_dims)


def test_expert_groups_give_the_same_bits():
    """Dequantizing a few experts at a time (what bounds the GPU temporaries) changes nothing."""
    layer, _, _, _ = make_layer(5, 512, 256, seed=3)
    sl = [(v[0], v[1]) for v in layer._impl.quant_slices()]
    whole = gpu_dequant.dequant_mx_w13(sl)
    kp1 = layer._impl.padded_dims[0]
    per_expert = sl[0][0][0].numel()
    for max_weights in (1, per_expert, 2 * per_expert + 1):
        assert torch.equal(gpu_dequant.dequant_mx_w13(sl, max_weights=max_weights), whole)
    assert whole.shape[-1] == kp1


def test_staging_chunk_layout_round_trip(tmp_path):
    """A chunk (consecutive or not) copied into a flat uint8 buffer as the streamer does, read back as slot views
    and unpacked: the chunk's experts of the whole-layer unpack; bytes = n x expert_bytes."""
    E, H, I = 6, 512, 384
    for pool in _pools(tmp_path):
        layer, _, _, _ = make_layer(E, H, I, pool=pool)
        lay = GpuCopyLayout(layer, "torch")
        full13, full2 = lay.unpack(lay.sources)
        for chunk in ([0, 1, 2], [1, 3, 4], [5], [0, 2, 3, 5]):
            buf = torch.full((lay.chunk_bytes(len(chunk)) + 64,), 0xAB, dtype=torch.uint8)
            assert lay.copy_chunk(buf, chunk) == len(chunk) * lay.expert_bytes
            u13, u2 = lay.unpack_slot(buf, len(chunk))
            assert torch.equal(u13, full13[chunk]) and torch.equal(u2, full2[chunk])
            assert (buf[lay.chunk_bytes(len(chunk)):] == 0xAB).all()


def test_expert_bytes():
    """Per expert on the wire: block-padded codes (one byte a weight) + one e8m0 byte per 32: 33/32 of a byte a
    weight, the engine's own host copy (about half of bf16's)."""
    E, H, I = 4, 2048, 768
    layer, _, _, _ = make_layer(E, H, I)
    kp1, kp2, h_pad = layer._impl.padded_dims
    weights = 2 * kp2 * kp1 + h_pad * kp2
    assert streamed_expert_bytes(layer) == GpuCopyLayout(layer).expert_bytes == weights * 33 // 32
    assert abs(layer.nbytes / E - weights * 33 // 32) < 4 * 4096 / E


def test_streamed_math_on_the_cpu():
    """The streamed path's compute (experts_forward on the unpacked bf16 matrices, chunk by chunk), run on the
    CPU: a bf16 layer's error against the fp32 reference on the exact checkpoint weights, with MiniMax-M3's
    activation (swigluoai on [gate; up] rows, limit 7) and with silu."""
    E, H, I, K, M = 8, 512, 384, 4, 60
    for act, kw in (("silu", {}), ("swigluoai", dict(activation="swigluoai", swiglu_limit=7.0))):
        layer, _, d13, d2 = make_layer(E, H, I, seed=5, **kw)
        kp1, _, h_pad = layer._impl.padded_dims
        lay = GpuCopyLayout(layer, "torch")
        x = (torch.randn(M, H) * 4).bfloat16()
        ids, w = random_routing(M, E, K)
        batch = RoutedBatch(ids, w, E)
        acc = torch.zeros(M, h_pad)
        for chunk in ([0, 1, 2], [3, 5], [4, 6, 7]):
            buf = torch.empty(lay.chunk_bytes(len(chunk)), dtype=torch.uint8)
            lay.copy_chunk(buf, chunk)
            u13, u2 = lay.unpack_slot(buf, len(chunk))
            experts_forward(F.pad(x, (0, kp1 - H)), batch, u13, u2, 0, acc, expert_ids=chunk,
                            activation=act, swiglu=tuple(layer._impl.swiglu))
        assert_matches_reference(acc[:, :H].bfloat16(), x, d13, d2, ids, w, activation=act)


def test_dequant_mx_blocks_codes_scales_and_nan():
    """Every e4m3 code under scales 2^-20..2^20 is exact; e4m3's NaN code and the NaN scale (255) give NaN; bad
    shapes and dtypes are refused naming what is wanted."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (2, 32, 16, 2), generator=g).to(torch.uint8)
    codes[codes & 0x7F == 0x7F] = 0  # NaN codes: below
    scales = torch.randint(107, 148, (2, 2, 16), generator=g).to(torch.uint8)
    got = gpu_dequant.dequant_mx_blocks(codes, scales)  # [2, 16, 64]
    rows = codes.transpose(1, 2).reshape(2, 16, 64).view(torch.float8_e4m3fn)
    want = dequantize_mxfp8(rows, scales.transpose(1, 2))
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want)
    codes[1, 3, 5, 1] = 0x7F  # row 5, input 7 of block 1
    scales[0, 1, 2] = 255  # row 2, inputs 32..63 of block 0
    got = gpu_dequant.dequant_mx_blocks(codes, scales)
    assert got[1, 5, 7].isnan() and got[0, 2, 32:].isnan().all() and got.isnan().sum() == 33
    with pytest.raises(ValueError, match="codes must be uint8"):
        gpu_dequant.dequant_mx_blocks(codes.view(torch.int8), scales)
    with pytest.raises(ValueError, match=r"mxfp8 scales must be uint8 \[2, 2, 16\]"):
        gpu_dequant.dequant_mx_blocks(codes, scales[:, :1])
    with pytest.raises(ValueError, match="mxfp8 scales must be uint8"):
        gpu_dequant.dequant_mx_blocks(codes, scales.float())


def test_gpu_path_and_dequant_choice():
    """mxfp8 takes the fallback on every GPU (no MXFP8 kernel wired: its MMA needs sm_100+), dequantized by torch
    ops: "kernel" is refused naming the way out."""
    for cap in ((8, 0), (9, 0), (10, 0), (12, 0)):
        path, why = gpu_dequant.gpu_path("mxfp8", capability=cap, force_fallback=False)
        assert path == "fallback" and "MXFP8 MMA needs sm_100+" in why, why
    assert "mxfp8" in gpu_dequant.GPU_FORMATS and "mxfp8" in gpu_dequant.TORCH_DEQUANT_FORMATS
    layer, _, _, _ = make_layer(2, 256, 128)
    with pytest.raises(ValueError, match="mxfp8 experts have no dequantization kernel"):
        GpuCopyLayout(layer, "kernel")
