"""Decode work units (lk_moe._C._set_decode_units), their schedule (lk_moe._C._set_decode_schedule:
fixed units or guided self-scheduling) and the quantized decode tiles' far prefetch
(lk_moe._C._set_decode_prefetch): how a decode chunk is cut into work units changes which thread
computes a block and how long each weight stream is, and how far ahead a tile prefetches changes
when bytes arrive; never a result. Every format's output must be bit-identical under every setting
(the benchmark A/Bs rely on it, and so does the defaults' choice)."""
import pytest
import torch

import lk_moe
from lk_moe.reference import random_routing

from .conftest import make_experts
from .test_channel_formats import make_channel_experts
from .test_fp8_block import make_fp8_experts
from .test_mxfp4 import make_mxfp4
from .test_nvfp4 import make_nvfp4
from .test_wna16 import make_int4_experts

# (wide, units per thread, far prefetch bytes, schedule): the defaults first, then each knob away from them
SETTINGS = [("4bit", 4, 8192, "guided"), ("4bit", 4, 8192, "units"), ("int8_act", 4, 8192, "units"),
            ("quantized", 4, 8192, "units"), ("quantized", 2, 0, "units"), ("all", 1, 64, "units"),
            ("all", 4, 65536, "units"), ("4bit", 4, 0, "units"), ("all", 1, 0, "guided")]
H, I, E, K = 2048, 768, 8, 4  # Qwen3-30B-A3B's layer widths (fewer experts)


def _tensors(fmt):
    if fmt == "bf16":
        return make_experts(E, H, I, seed=7)
    if fmt == "fp8_block":
        return make_fp8_experts(E, H, I)[0]
    if fmt in ("fp8_channel", "int8_channel"):
        return make_channel_experts(fmt, E, H, I)[0]
    if fmt == "wna16_int4":
        return make_int4_experts(E, H, I, 128, asym=True)[0]
    if fmt == "mxfp4":
        return make_mxfp4(E, H, I)[0]
    return make_nvfp4(E, H, I)[0]


def _build(fmt, tensors, pool):
    if fmt == "bf16":
        return lk_moe.MoELayer(*tensors, pool=pool)
    kw = dict(activation="swigluoai") if fmt == "mxfp4" else {}
    return lk_moe.MoELayer.from_checkpoint(fmt, tensors, pool=pool, **kw)


@pytest.fixture
def restore_decode_settings():
    units, prefetch, schedule = lk_moe._C._decode_units(), lk_moe._C._decode_prefetch(), lk_moe._C._decode_schedule()
    yield
    lk_moe._C._set_decode_units(*units)
    lk_moe._C._set_decode_prefetch(prefetch)
    lk_moe._C._set_decode_schedule(schedule)


def test_defaults_schedule_decode_guided_and_prefetch_8k_ahead():
    assert lk_moe._C._decode_schedule() == "guided"
    assert lk_moe._C._decode_units() == ("4bit", 4)  # shapes the units of the "units" schedule
    assert lk_moe._C._decode_prefetch() == 8192


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "fp8_channel", "int8_channel", "wna16_int4", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("threads", [2, 5, 16])
def test_every_setting_gives_identical_outputs(fmt, threads, restore_decode_settings):
    pool = lk_moe.make_pool(threads=threads)
    layer = _build(fmt, _tensors(fmt), pool)
    cases = []
    for M in (1, 3, 12, 40):  # 40: 20 slots per expert, a prefill-sized chunk (fixed wide units)
        x = torch.randn(M, H).bfloat16()
        ids, w = random_routing(M, E, K)
        cases.append((x, ids, w))
    first = None
    for wide, per_thread, prefetch, schedule in SETTINGS:
        lk_moe._C._set_decode_units(wide, per_thread)
        lk_moe._C._set_decode_prefetch(prefetch)
        lk_moe._C._set_decode_schedule(schedule)
        outs = [layer.forward(x, ids, w) for x, ids, w in cases]
        assert all(torch.isfinite(o).all() for o in outs)
        if first is None:
            first = outs
            continue
        for (x, _, _), a, b in zip(cases, first, outs):
            assert torch.equal(a, b), f"{fmt}: M={len(x)} differs under ({wide}, {per_thread}, {prefetch}, {schedule})"


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_schedules_agree_on_a_numa_split_layer(tmp_path, fmt, restore_decode_settings):
    """Each node claims its own slice's blocks (synthetic 3-node machine, 2 threads per node)."""
    from .fake_sysfs import make_sysfs
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3], 2: [4, 5]})
    pool = lk_moe.make_pool(threads=6, binding="NONE", sysfs_root=root, allowed=list(range(6)))
    layer = _build(fmt, _tensors(fmt), pool)
    assert layer.num_slices == 3
    x = torch.randn(3, H).bfloat16()
    ids, w = random_routing(3, E, K)
    outs = {}
    for schedule in ("units", "guided"):
        lk_moe._C._set_decode_schedule(schedule)
        outs[schedule] = layer.forward(x, ids, w)
    assert torch.isfinite(outs["guided"]).all()
    assert torch.equal(outs["units"], outs["guided"])


def test_bad_settings_are_rejected(restore_decode_settings):
    with pytest.raises(ValueError, match="int8_act, 4bit, quantized or all"):
        lk_moe._C._set_decode_units("wider", 4)
    with pytest.raises(ValueError, match="units_per_thread in 1..64"):
        lk_moe._C._set_decode_units("all", 0)
    assert lk_moe._C._decode_units() == ("4bit", 4)
    for bytes_ahead in (-64, 100, 65600):
        with pytest.raises(ValueError, match="multiple of 64 up to 65536"):
            lk_moe._C._set_decode_prefetch(bytes_ahead)
    assert lk_moe._C._decode_prefetch() == 8192  # a rejected value leaves the setting alone
    with pytest.raises(ValueError, match="units or guided"):
        lk_moe._C._set_decode_schedule("static")
    assert lk_moe._C._decode_schedule() == "guided"
