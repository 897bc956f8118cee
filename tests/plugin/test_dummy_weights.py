"""`--load-format dummy` for hybrid layers (lvllm.dummy_weights): block scales get normal values.

A zeroed e8m0 byte is the subnormal 2^-127 and an fp8 scale in vLLM's dummy range (+-1e-3) is an fp8
subnormal: the engine's multiplies by them are microcode assists on Intel cores, which made benchmarks
with dummy weights measure the assists instead of the memory reads (see the module docstring)."""
import torch

import lk_moe
from lk_moe.reference import moe_torch_baseline_mxfp4
from lvllm import dummy_weights as dw

FLT_MIN = torch.finfo(torch.float32).tiny
FP8_MIN_NORMAL = torch.finfo(torch.float8_e4m3fn).tiny


def test_e8m0_scales_are_normal_powers_of_two():
    t = dw.fill_(torch.empty(3, 64, 8, dtype=torch.uint8), name="w13_weight_scale")
    assert int(t.min()) >= dw.E8M0_LOW and int(t.max()) <= dw.E8M0_HIGH
    values = torch.pow(2.0, t.float() - 127)
    assert bool((values >= FLT_MIN).all())
    assert t.unique().numel() > 1  # a random tile, not one constant


def test_fp8_scales_are_positive_normals():
    t = dw.fill_(torch.empty(2, 32, 4, dtype=torch.float8_e4m3fn), name="w2_weight_scale")
    f = t.float()
    assert bool((f >= FP8_MIN_NORMAL).all()) and bool((f <= dw.FP8_SCALE_HIGH).all())


def test_codes_and_indices_stay_zero_and_floats_in_vllms_range():
    codes = dw.fill_(torch.empty(4, 16, dtype=torch.uint8), name="w13_weight")
    assert int(codes.abs().max()) == 0
    g_idx = dw.fill_(torch.empty(64, dtype=torch.int32), name="w13_weight_g_idx")
    assert int(g_idx.abs().max()) == 0
    fp8_weights = dw.fill_(torch.empty(4, 64, dtype=torch.float8_e4m3fn), name="w13_weight")
    assert float(fp8_weights.float().abs().max()) <= 2**-9  # not a scale: the dummy range, as fp8 rounds it
    bf16 = dw.fill_(torch.empty(5, 7, dtype=torch.bfloat16), name="w13_weight_scale")  # float scale
    assert float(bf16.float().abs().max()) <= dw.HIGH * 1.01


def test_block_scale_names():
    assert dw.is_block_scale("w13_weight_scale", torch.uint8)
    assert dw.is_block_scale("w2_weight_scale", torch.float8_e4m3fn)
    assert not dw.is_block_scale("w13_weight_scale_2", torch.float32)  # nvfp4 global scale: a normal float
    assert not dw.is_block_scale("w13_weight", torch.uint8)


def test_materialize_fills_meta_params_by_name():
    m = torch.nn.Module()
    m.w13_weight = torch.nn.Parameter(torch.empty(2, 8, 16, dtype=torch.uint8, device="meta"), requires_grad=False)
    m.w13_weight_scale = torch.nn.Parameter(torch.empty(2, 8, 1, dtype=torch.uint8, device="meta"),
                                            requires_grad=False)
    m.w13_weight_scale.weight_loader = "kept"
    nbytes = dw.materialize(m)
    assert nbytes == 2 * 8 * 16 + 2 * 8
    assert m.w13_weight.device.type == "cpu" and int(m.w13_weight.abs().max()) == 0
    assert int(m.w13_weight_scale.min()) >= dw.E8M0_LOW
    assert m.w13_weight_scale.weight_loader == "kept"


def test_engine_runs_dummy_mxfp4_experts_like_the_reference():
    """A layer built from dummy-filled MXFP4 tensors (gpt-oss layout) computes what torch computes."""
    E, H, I, K = 4, 256, 128, 2
    shapes = dict(w13_weight=((E, 2 * I, H // 2), torch.uint8), w2_weight=((E, H, I // 2), torch.uint8),
                  w13_weight_scale=((E, 2 * I, H // 32), torch.uint8), w2_weight_scale=((E, H, I // 32), torch.uint8),
                  w13_bias=((E, 2 * I), torch.bfloat16), w2_bias=((E, H), torch.bfloat16))
    tensors = {n: dw.fill_(torch.empty(s, dtype=d), name=n) for n, (s, d) in shapes.items()}
    layer = lk_moe.MoELayer.from_checkpoint("mxfp4", tensors, activation="swigluoai")
    x = torch.randn(3, H).bfloat16()
    ids = torch.tensor([[0, 1], [2, 3], [1, 3]], dtype=torch.int32)
    w = torch.full((3, K), 0.5)
    out = layer.forward(x, ids, w).float()
    ref = moe_torch_baseline_mxfp4(x, tensors, ids, w).float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=0.02, atol=1e-4)
