"""lk_moe.formats, the one Python table of expert formats, agrees with the engine's C++ table and is
what its readers (MoELayer, the GPU paths, the plugin's policy) use."""
import lk_moe
from lk_moe import _C, formats, gpu_dequant
from lvllm import policy


def test_the_python_table_is_the_engines():
    """The same rows in the same order; an activation the table offers (what lvllm runs end to end) is
    one the engine computes (the engine's nvfp4 computes swigluoai too; lvllm does not hand it over yet)."""
    engine = _C.formats()
    assert [f.name for f in formats.TABLE] == [name for name, _ in engine]
    for f, (_, swigluoai) in zip(formats.TABLE, engine):
        assert swigluoai or "swigluoai" not in f.activations, f.name


def test_rows_are_well_formed():
    for f in formats.TABLE:
        assert f.family in ("bf16", "byte", "four_bit"), f
        assert f.tensors[:2] in (("w13_weight", "w2_weight"), ("w13_weight_packed", "w2_weight_packed")), f
        assert not set(f.tensors) & set(f.optional), f
        assert f.activations and len(set(f.activations)) == len(f.activations), f
        assert f.biases == any(n.endswith("_bias") for n in f.optional), f


def test_readers_take_the_table():
    for f in formats.TABLE:
        assert lk_moe.MoELayer.tensor_names(f.name) == (f.tensors, f.optional)
    assert gpu_dequant.GPU_FORMATS == formats.GPU == policy.GPU_PREFILL_FORMATS
    assert gpu_dequant.BYTE_FORMATS + gpu_dequant.FOUR_BIT_FORMATS == tuple(
        f.name for f in formats.TABLE if f.family != "bf16")


def test_an_unknown_format_is_named_with_the_supported_ones():
    import pytest
    with pytest.raises(ValueError, match=r"unsupported expert format 'fp6'; supported: bf16, fp8_block"):
        formats.get("fp6")
