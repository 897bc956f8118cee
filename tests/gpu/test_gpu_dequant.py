"""The CUDA fallback kernel equals its plain-torch definition bit for bit (fp32 product, one bf16
rounding), on real layer shapes; bad inputs are refused."""
import pytest
import torch

from lk_moe import gpu_dequant

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU"),
              pytest.mark.skipif(gpu_dequant.library() is None, reason=gpu_dequant.library_error() or "")]


@pytest.mark.parametrize("codes", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("blocks,kp,seg", [(96, 2048, 128), (48, 768, 128), (7, 7168, 0), (33, 64, 0)])
def test_kernel_equals_reference(codes, blocks, kp, seg):
    g = torch.Generator().manual_seed(blocks + kp)
    packed = torch.randint(0, 256, (blocks * 16 * kp,), generator=g, dtype=torch.int64).to(torch.uint8)
    if codes == "fp8_e4m3":
        packed[(packed & 0x7F) == 0x7F] = 0x38
    scales = torch.rand(blocks * (kp // seg if seg else 16), generator=g) * 0.1 + 1e-3
    want = gpu_dequant.dequant_blocks_reference(packed, scales, kp, seg, codes)
    got = gpu_dequant.dequant_blocks(packed.cuda(), scales.cuda(), kp, seg, codes)
    torch.cuda.synchronize()
    assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))


def test_kernel_refuses_host_tensors():
    with pytest.raises(ValueError, match="CUDA device"):
        gpu_dequant.dequant_blocks(torch.zeros(16 * 32, dtype=torch.uint8), torch.ones(16), 32, 0, "int8")
