"""The native GPU path (lk_moe.gpu_native), everything that runs without a GPU: the re-layout of the
streamed engine blocks into the tensors vLLM 0.33.0's fused-MoE kernels read, run with torch on CPU
tensors, against the checkpoint tensors as vLLM's own methods hold them (bit for bit), and which
path each format takes on each GPU generation.

The layouts vLLM's kernels read (vllm/model_executor/layers/fused_moe/fused_moe.py, 0.33.0):
- fp8_block (Fp8MoEMethod): w13 fp8 [E, 2I, H], w2 [E, H, I], scale_inv fp32 [E, 2I/128, H/128],
  [E, H/128, I/128]: exactly the checkpoint tensors.
- fp8_channel / int8_channel (CT W8A8): codes as above, scales fp32 [E, 2I, 1], [E, H, 1].
- wna16_int4 (CT WNA16, Triton method's process_weights_after_loading): the K-first int32 checkpoint
  tensors transposed to N-first and viewed as uint8 ([E, N, K/2], input k in byte k/2, low nibble for
  even k), scales transposed to [E, N, K/G]; zero points (vLLM's MoeWNA16 layout) uint8 [E, N/2, K/G],
  row n in byte n/2, low nibble for even n, i.e. the checkpoint's int32 [E, K/G, N/8] as bytes, transposed.
Padding: gate rows I..kp2 and up rows kp2 + I.. of w13, inputs H..kp1 and I..kp2 hold zero codes (and
zero channel scales); the native tensors keep the engine's padded sizes."""
import pytest
import torch

from lk_moe import gpu_dequant, gpu_native
from lk_moe.hybrid import GpuCopyLayout, quant4_parts

from .test_gpu_4bit_layout import make_4bit_layer
from .test_gpu_quant_layout import _pools, make_layer

BYTE = ("fp8_block", "fp8_channel", "int8_channel")
SHAPES = {"fp8_block": [(512, 384), (2048, 768)], "fp8_channel": [(256, 128), (200, 72)],
          "int8_channel": [(256, 128), (200, 72)]}


def _native(layer, sources=None):
    cl = GpuCopyLayout(layer, "torch")
    parts = quant4_parts(layer) if layer.format == "wna16_int4" else ()
    return cl, gpu_native.relayout(layer.format, cl.sources if sources is None else sources,
                                   layer._impl.padded_dims, parts)


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16) if t.element_size() == 2 else t


def _assert_rows(got, want, I, kp2):
    """w13-shaped got [E, 2*kp2, ...] holds want [E, 2I, ...] as gate rows 0..I, up rows kp2..kp2+I."""
    assert torch.equal(_bits(got[:, :I]), _bits(want[:, :I]))
    assert torch.equal(_bits(got[:, kp2:kp2 + I]), _bits(want[:, I:]))


@pytest.mark.parametrize("fmt,H,I", [(f, h, i) for f in BYTE for h, i in SHAPES[f]])
def test_byte_relayout_equals_checkpoint(tmp_path, fmt, H, I):
    E = 3
    for pool in _pools(tmp_path):  # one NUMA slice, then three
        layer, t, _, _ = make_layer(fmt, E, H, I, pool=pool)
        kp1, kp2, h_pad = layer._impl.padded_dims
        _, w = _native(layer)
        code = torch.int8 if fmt == "int8_channel" else torch.float8_e4m3fn
        assert w.w1.dtype == w.w2.dtype == code and w.w1z is None and w.w2z is None
        assert w.w1.shape == (E, 2 * kp2, kp1) and w.w2.shape == (E, kp1, kp2)
        assert all(x.is_contiguous() for x in w[:4])
        _assert_rows(w.w1[:, :, :H], t["w13_weight"], I, kp2)
        assert torch.equal(_bits(w.w2[:, :H, :I]), _bits(t["w2_weight"]))
        # padding holds zero codes
        assert _bits(w.w1)[:, :, H:].sum() == 0 and _bits(w.w1)[:, I:kp2].sum() == 0
        assert _bits(w.w2)[:, H:].sum() == 0 and _bits(w.w2)[:, :, I:].sum() == 0
        if fmt == "fp8_block":
            assert torch.equal(w.w1s, t["w13_weight_scale_inv"]) and torch.equal(w.w2s, t["w2_weight_scale_inv"])
        else:
            s13, s2 = t["w13_weight_scale"].reshape(E, 2 * I, 1), t["w2_weight_scale"].reshape(E, H, 1)
            assert w.w1s.shape == (E, 2 * kp2, 1) and w.w2s.shape == (E, kp1, 1)
            _assert_rows(w.w1s, s13, I, kp2)
            assert torch.equal(w.w2s[:, :H], s2) and w.w2s[:, H:].abs().sum() == 0


@pytest.mark.parametrize("gs,asym,scale_dtype", [(32, True, torch.bfloat16), (64, False, torch.bfloat16),
                                                 (128, True, torch.float16)])
def test_int4_relayout_equals_vllm_tensors(tmp_path, gs, asym, scale_dtype):
    """vLLM's layout built from the checkpoint as its own methods do it (see the module docstring)."""
    E, H, I = 3, 512, 384
    for pool in _pools(tmp_path):
        layer, t, _, _, _ = make_4bit_layer("wna16_int4", E, H, I, pool=pool, gs=gs, asym=asym,
                                            scale_dtype=scale_dtype)
        kp1, kp2, h_pad = layer._impl.padded_dims
        assert (kp1, kp2) == (H, I)
        _, w = _native(layer)
        assert w.w1.dtype == w.w2.dtype == torch.uint8 and w.w1s.dtype == scale_dtype
        assert torch.equal(w.w1, t["w13_weight_packed"].transpose(1, 2).contiguous().view(torch.uint8))
        assert torch.equal(w.w2, t["w2_weight_packed"].transpose(1, 2).contiguous().view(torch.uint8))
        assert torch.equal(_bits(w.w1s), _bits(t["w13_weight_scale"].transpose(1, 2).contiguous()))
        assert torch.equal(_bits(w.w2s), _bits(t["w2_weight_scale"].transpose(1, 2).contiguous()))
        if asym:
            z13 = t["w13_weight_zero_point"].contiguous().view(torch.uint8)[:, :, :I].transpose(1, 2)
            z2 = t["w2_weight_zero_point"].contiguous().view(torch.uint8)[:, :, :H // 2].transpose(1, 2)
            assert torch.equal(w.w1z, z13) and torch.equal(w.w2z, z2)
            assert w.w1z.is_contiguous() and w.w2z.is_contiguous()
        else:
            assert w.w1z is None and w.w2z is None


@pytest.mark.parametrize("fmt", BYTE + ("wna16_int4",))
def test_native_weights_are_worth_the_fallback_weights(tmp_path, fmt):
    """What the native tensors are worth (fp32 code x scale, int4 (u - z) x scale), rounded to bf16,
    equals the fallback's dequantized matrices bit for bit; w2 rows past h_pad are zero. Also for a
    chunk of experts out of order (as a sparse batch streams them)."""
    H, I = (512, 384) if fmt in ("fp8_block", "wna16_int4") else (200, 72)
    for pool in _pools(tmp_path):
        layer = make_layer(fmt, 5, H, I, pool=pool)[0] if fmt in BYTE else make_4bit_layer(fmt, 5, H, I, pool=pool)[0]
        kp1, kp2, h_pad = layer._impl.padded_dims
        cl, _ = _native(layer)
        chunk = [4, 1, 2]
        sources = [[s[chunk] for s in srcs] for srcs in cl.sources]
        _, w = _native(layer, sources)
        f13, f2 = cl.unpack(sources)
        n13, n2 = gpu_native.dequantize(fmt, w)
        assert torch.equal(n13.bfloat16().view(torch.int16), f13.view(torch.int16))
        assert torch.equal(n2[:, :h_pad].bfloat16().view(torch.int16), f2.view(torch.int16))
        assert n2[:, h_pad:].abs().sum() == 0


def test_relayout_refuses_other_formats():
    with pytest.raises(ValueError, match="mxfp4 experts have no native GPU path"):
        gpu_native.relayout("mxfp4", [], (64, 64, 64))


def test_map_ids_sends_minus_one_past_the_experts():
    ids = torch.tensor([[3, -1], [0, 7]], dtype=torch.int32)
    got = gpu_native.NativeExperts.map_ids(ids, 8)
    assert got.dtype == torch.int32 and got.tolist() == [[3, 8], [0, 7]]


# -- which path each format takes, by compute capability

WANT = {  # capability -> format -> path (force_fallback=False)
    (7, 5): dict(fp8_block="fallback", fp8_channel="fallback", int8_channel="fallback", wna16_int4="fallback",
                 mxfp4="fallback", nvfp4="fallback"),
    (8, 0): dict(fp8_block="fallback", fp8_channel="fallback", int8_channel="native", wna16_int4="native",
                 mxfp4="fallback", nvfp4="fallback"),
    (8, 9): dict(fp8_block="native", fp8_channel="native", int8_channel="native", wna16_int4="native",
                 mxfp4="fallback", nvfp4="fallback"),
    (9, 0): dict(fp8_block="native", fp8_channel="native", int8_channel="native", wna16_int4="native",
                 mxfp4="fallback", nvfp4="fallback"),
    (10, 0): dict(fp8_block="native", fp8_channel="native", int8_channel="native", wna16_int4="native",
                  mxfp4="fallback", nvfp4="fallback"),
}


@pytest.mark.parametrize("cap", sorted(WANT))
def test_gpu_path_by_capability(cap):
    for fmt, want in WANT[cap].items():
        path, why = gpu_dequant.gpu_path(fmt, capability=cap, force_fallback=False)
        assert path == want, (fmt, cap, why)
        assert why.startswith(f"{fmt}: ")
        if path == "native":
            assert f"sm_{cap[0]}{cap[1]}" in why and gpu_native.KERNELS[fmt][1] in why
        forced, why = gpu_dequant.gpu_path(fmt, capability=cap, force_fallback=True)
        assert forced == "fallback" and "LK_FORCE_GPU_FALLBACK=1" in why
    assert gpu_dequant.gpu_path("bf16", capability=cap)[0] == "bf16"


def test_gpu_path_without_a_gpu_is_the_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    path, why = gpu_dequant.gpu_path("fp8_block", capability=None, force_fallback=False)
    assert path == "fallback" and "no GPU" in why


def test_native_kernels_name_vllm_and_only_wired_formats():
    assert set(gpu_dequant.NATIVE_KERNELS) == {"fp8_block", "fp8_channel", "int8_channel", "wna16_int4"}
    for fmt, (cap, what) in gpu_dequant.NATIVE_KERNELS.items():
        assert cap >= gpu_dequant.HARDWARE_NATIVE[fmt] and "vLLM fused_experts" in what


# -- the FusedMoEQuantConfig handed to vLLM's fused_experts (vLLM importable on the CPU; no kernel runs)

@pytest.mark.parametrize("fmt", BYTE + ("wna16_int4",))
def test_quant_config_selects_the_intended_vllm_kernel(tmp_path, fmt):
    pytest.importorskip("vllm.model_executor.layers.fused_moe.fused_moe")
    from lk_moe.gpu_native import NativeExperts, _vllm
    H, I = (512, 384) if fmt in ("fp8_block", "wna16_int4") else (256, 128)
    layer = make_layer(fmt, 2, H, I)[0] if fmt in BYTE else make_4bit_layer(fmt, 2, H, I, gs=32)[0]
    _, w = _native(layer)
    n = NativeExperts.__new__(NativeExperts)  # no GPU here: skip the constructor's kernel check
    n.format = fmt
    _, n._cfg, _ = _vllm()
    q = n.quant_config(w)
    assert q.w1_scale is w.w1s and q.w2_scale is w.w2s
    flags = (q.use_fp8_w8a8, q.use_int8_w8a8, q.use_int8_w8a16, q.use_int4_w4a16)
    if fmt == "fp8_block":
        assert flags == (True, False, False, False) and q.block_shape == [128, 128] and not q.per_act_token_quant
    elif fmt == "fp8_channel":
        assert flags == (True, False, False, False) and q.block_shape is None
        assert q.per_act_token_quant and q.per_out_ch_quant
    elif fmt == "int8_channel":
        assert flags == (False, False, True, False) and q.block_shape is None and q.quant_dtype is None
    else:
        assert flags == (False, False, False, True) and q.block_shape == [0, 32] and q.quant_dtype is None
        assert q.w1_zp is w.w1z and q.w2_zp is w.w2z and w.w1z is not None
