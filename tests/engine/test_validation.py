"""Bad input is a clear TypeError/ValueError naming the problem, never a crash."""
import pytest
import torch

import lk_moe

from .conftest import make_experts

E, H, I, K, M = 4, 256, 64, 2, 3


@pytest.fixture(scope="module")
def layer():
    w13, w2 = make_experts(E, H, I)
    return lk_moe.MoELayer(w13, w2)


def good():
    return (torch.randn(M, H).bfloat16(), torch.zeros(M, K, dtype=torch.int32), torch.ones(M, K))


@pytest.mark.parametrize(
    "mutate,exc,words",
    [
        (lambda x, i, w: (x.float(), i, w), TypeError, "x must be bfloat16 or float16"),
        (lambda x, i, w: (x, i.long(), w), TypeError, "topk_ids must be int32"),
        (lambda x, i, w: (x, i, w.bfloat16()), TypeError, "topk_weights must be float32"),
        (lambda x, i, w: (x[:, :100], i, w), ValueError, "x must have shape [M, H] with H = 256"),
        (lambda x, i, w: (x[0], i, w), ValueError, "x must have shape"),
        (lambda x, i, w: (x, i[:2], w), ValueError, "topk_ids must have shape [M, K] with M = 3"),
        (lambda x, i, w: (x, i, w[:, :1]), ValueError, "topk_weights must have shape [M, K] = [3, 2]"),
        (lambda x, i, w: (x.t().contiguous().t(), i, w), ValueError, "x must be contiguous"),
        (lambda x, i, w: (x, i.t().contiguous().t(), w), ValueError, "topk_ids must be contiguous"),
        (lambda x, i, w: (x.to("meta"), i, w), ValueError, "x must be a CPU tensor"),
        (lambda x, i, w: (x, i.fill_(E), w), ValueError, "expert id 4"),
        (lambda x, i, w: (x, i.fill_(-2), w), ValueError, "expert id -2"),
        (lambda x, i, w: ("not a tensor", i, w), TypeError, ""),
    ],
)
def test_bad_forward_inputs(layer, mutate, exc, words):
    x, ids, w = mutate(*good())
    with pytest.raises(exc) as ei:
        layer.forward(x, ids, w)
    assert words in str(ei.value)


def test_bad_out_buffer(layer):
    x, ids, w = good()
    with pytest.raises(TypeError, match="out must have x's dtype"):
        layer.forward_into(torch.empty(M, H, dtype=torch.float16), x, ids, w)
    with pytest.raises(ValueError, match="out must have shape"):
        layer.forward_into(torch.empty(M + 1, H, dtype=torch.bfloat16), x, ids, w)


def test_bad_weights():
    w13, w2 = make_experts(E, H, I)
    with pytest.raises(TypeError, match="w13 must be bfloat16 or float16"):
        lk_moe.MoELayer(w13.float(), w2)
    with pytest.raises(TypeError, match="same dtype"):
        lk_moe.MoELayer(w13, w2.half())
    with pytest.raises(ValueError, match=r"w2 must have shape \[E, H, I\] = \[4, 256, 64\]"):
        lk_moe.MoELayer(w13, w2[:, :, :32].contiguous())
    with pytest.raises(ValueError, match="w13 must have shape"):
        lk_moe.MoELayer(w13[0], w2)
    with pytest.raises(ValueError, match="w13 must have shape"):
        lk_moe.MoELayer(w13[:, :63].contiguous(), w2)
    with pytest.raises(ValueError, match="w2 must be contiguous"):
        lk_moe.MoELayer(w13, w2.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="activation 'gelu' is not supported"):
        lk_moe.MoELayer(w13, w2, activation="gelu")
    with pytest.raises(TypeError):
        lk_moe.MoELayer([1, 2], w2)


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="thread binding must be"):
        lk_moe.make_pool(binding="SOCKET")
    with pytest.raises(ValueError, match="threads must be"):
        lk_moe.make_pool(threads=-1)


def test_bad_isa_name():
    with pytest.raises(ValueError, match="unknown ISA tier 'sse9'"):
        lk_moe.set_isa("sse9")
    missing = [t for t in lk_moe._C.all_isas() if t not in lk_moe.supported_isas()]
    for t in missing:
        with pytest.raises(ValueError, match=f"ISA tier '{t}' is not supported by this CPU"):
            lk_moe.set_isa(t)


# ------------------------------------------------------------------ sizes: checked before any division or cast
def _checkpoint(fmt):
    """Small valid tensors of every format (E=3, H=256, I=128)."""
    from .test_channel_formats import make_channel_experts
    from .test_fp8_block import make_fp8_experts
    from .test_mxfp4 import make_mxfp4
    from .test_nvfp4 import make_nvfp4
    from .test_wna16 import make_int4_experts
    if fmt == "bf16":
        w13, w2 = make_experts(3, 256, 128)
        return dict(w13_weight=w13, w2_weight=w2)
    if fmt == "fp8_block":
        return make_fp8_experts(3, 256, 128)[0]
    if fmt in ("fp8_channel", "int8_channel"):
        return make_channel_experts(fmt, 3, 256, 128)[0]
    if fmt == "wna16_int4":
        return make_int4_experts(3, 256, 128, 32, asym=True)[0]
    if fmt == "nvfp4":
        return make_nvfp4(3, 256, 128)[0]
    if fmt == "mxfp8":
        from .test_mxfp8 import make_mxfp8_experts
        return make_mxfp8_experts(3, 256, 128)[0]
    return make_mxfp4(3, 256, 128)[0]


@pytest.mark.parametrize("fmt", list(lk_moe.MoELayer.FORMATS))
def test_zero_experts_rejected_for_every_format(fmt):
    tensors = {k: v[:0] for k, v in _checkpoint(fmt).items()}
    with pytest.raises(ValueError):
        lk_moe.MoELayer.from_checkpoint(fmt, tensors)


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel", "int8_channel"])
@pytest.mark.parametrize("dim", ["I", "H"])
def test_zero_sizes_rejected_for_byte_formats(fmt, dim):
    """I = 0 or H = 0 with scales shaped to match: these formats built such layers before."""
    t = _checkpoint(fmt)
    if dim == "I":
        t = dict(t, w13_weight=t["w13_weight"][:, :0], w2_weight=t["w2_weight"][:, :, :0].contiguous())
        s = "w13_weight_scale_inv" if fmt == "fp8_block" else "w13_weight_scale"
        t[s] = t[s][:, :0].contiguous()
        if fmt == "fp8_block":
            t["w2_weight_scale_inv"] = t["w2_weight_scale_inv"][:, :, :0].contiguous()
    else:
        t = dict(t, w13_weight=t["w13_weight"][:, :, :0].contiguous(), w2_weight=t["w2_weight"][:, :0])
        if fmt == "fp8_block":
            t["w13_weight_scale_inv"] = t["w13_weight_scale_inv"][:, :, :0].contiguous()
            t["w2_weight_scale_inv"] = t["w2_weight_scale_inv"][:, :0].contiguous()
        else:
            t["w2_weight_scale"] = t["w2_weight_scale"][:, :0].contiguous()
    with pytest.raises(ValueError, match="E >= 1, I >= 1, H >= 1|at least one block"):
        lk_moe.MoELayer.from_checkpoint(fmt, t, **({"block_size": (128, 128)} if fmt == "fp8_block" else {}))


def test_fp8_block_empty_scale_grid_is_an_error_not_sigfpe():
    t = _checkpoint("fp8_block")
    t = dict(t, w13_weight_scale_inv=torch.ones(3, 0, 2))  # the grid alone used to be divided by
    with pytest.raises(ValueError, match="at least one block"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", t)


@pytest.mark.parametrize("block", [(2 ** 32 + 128, 128), (128, 2 ** 32 + 128), (-128, 128), (128, 0), (2 ** 21, 128)])
def test_fp8_block_size_out_of_range(block):
    """2^32 + 128 used to pass and be cast to 128, reading past the scale grid."""
    with pytest.raises(ValueError, match=r"block_size must be \(rows, cols\) with 1 <= rows, cols <= 1048576"):
        lk_moe.MoELayer.from_checkpoint("fp8_block", _checkpoint("fp8_block"), block_size=block)


def test_mxfp4_negative_real_sizes():
    with pytest.raises(ValueError, match="hidden_size / intermediate_size must be >= 1"):
        lk_moe.MoELayer.from_checkpoint("mxfp4", _checkpoint("mxfp4"), hidden_size=-256)
