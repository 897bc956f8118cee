"""The GPU fallback's definition (lk_moe.gpu_dequant.dequant_blocks_reference), checked against an
independent construction: plain code rows packed by index arithmetic, decoded row by row."""
import pytest
import torch

from lk_moe.gpu_dequant import dequant_blocks_reference


def random_codes(rows, kp, codes, g):
    c = torch.randint(0, 256, (rows, kp), generator=g, dtype=torch.int64).to(torch.uint8)
    if codes == "fp8_e4m3":
        c[(c & 0x7F) == 0x7F] = 0x3C  # no NaN codes (e4m3fn has no inf; 0x7F/0xFF are NaN)
    return c


def pack(plain, kp):
    """[blocks*16, kp] -> bytes in the engine's block layout, by the layout's definition."""
    blocks = plain.shape[0] // 16
    out = torch.empty(blocks, 16 * kp, dtype=torch.uint8)
    for n in range(16):
        for k in range(kp):
            out[:, (k // 2) * 32 + 2 * n + (k & 1)] = plain[torch.arange(blocks) * 16 + n, k]
    return out.reshape(-1)


@pytest.mark.parametrize("codes", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("seg", [0, 8, 32])
def test_reference_matches_construction(codes, seg):
    g = torch.Generator().manual_seed(3 + seg)
    blocks, kp = 3, 64
    plain = random_codes(blocks * 16, kp, codes, g)
    scales = torch.rand(blocks * (kp // seg if seg else 16), generator=g) + 0.01
    got = dequant_blocks_reference(pack(plain, kp), scales, kp, seg, codes)
    vals = plain.view(torch.float8_e4m3fn).float() if codes == "fp8_e4m3" else plain.view(torch.int8).float()
    want = torch.empty(blocks * 16, kp, dtype=torch.bfloat16)
    for r in range(blocks * 16):
        b, n = divmod(r, 16)
        for k in range(0, kp, 8):
            s = scales[b * (kp // seg) + k // seg] if seg else scales[b * 16 + n]
            want[r, k:k + 8] = (vals[r, k:k + 8] * s).to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_bad_inputs():
    p = torch.zeros(16 * 32, dtype=torch.uint8)
    s = torch.ones(16)
    with pytest.raises(ValueError, match="codes must be one of"):
        dequant_blocks_reference(p, s, 32, 0, "fp4")
    with pytest.raises(TypeError):
        dequant_blocks_reference(p.to(torch.int8), s, 32, 0, "int8")
    with pytest.raises(ValueError, match="whole blocks"):
        dequant_blocks_reference(p[:-2], s, 32, 0, "int8")
    with pytest.raises(ValueError, match="scales must hold 2"):
        dequant_blocks_reference(p, s, 32, 16, "int8")
    with pytest.raises(ValueError, match="must be even"):
        dequant_blocks_reference(p, s, 32, 3, "int8")
