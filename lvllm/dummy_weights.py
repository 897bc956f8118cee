"""`--load-format dummy` (benchmarks) for hybrid layers, at host speed.

vLLM 0.33's DummyModelLoader fills every tensor of every module in place
(`initialize_single_dummy_weight`) with a serial random generator on the tensor's device: for a
routed-expert tensor in host RAM that is one CPU core at ~0.5 GB/s (measured with 0.26's filler,
the same generator), minutes of start-up for the 57 GB of a Qwen3-30B-A3B-shaped model.

So with the dummy format the hybrid method creates its tensors on the meta device (vLLM's filler
skips meta tensors), and `materialize` gives them host memory at hand-over: floating tensors are
filled with a random tile in vLLM's dummy range, tiled over the tensor (multi-threaded copies),
integer tensors (packed codes, group indices) are zeroed, as fresh `torch.empty` memory is in the
stock dummy run.

Block scales are the exception: the engine's cost does not depend on the values as long as they are
normal floats, and a zeroed or dummy-range scale is not. An e8m0 byte 0 is the subnormal 2^-127 and
an fp8 scale of +-1e-3 is an fp8 subnormal (fp32 subnormal inside the kernels' conversion); every
multiply by one is a microcode assist on Intel cores: a DeepSeek-V4-Flash MXFP4 layer at M = 1 took 4.3x
longer with zeroed e8m0 scales on the H200 machine's 16-core Xeon (2026-12-04; 17% on the Zen4 dev VM;
`benchmarks/moe_layer.py --mxfp4-scale-byte 0`), and its decode inside vLLM ran at 0.46-0.61 of the bandwidth
bound instead of 0.81-0.99. So scale tensors get values a released checkpoint has: e8m0 bytes 2^-9 .. 2^-5,
fp8 scales 16 .. 256.
"""
from __future__ import annotations

import torch

LOW, HIGH = -1e-3, 1e-3  # vLLM's initialize_dummy_weights range
TILE = 1 << 20  # random values per tile (a few MiB)
SEED = 1234
E8M0_LOW, E8M0_HIGH = 118, 122  # e8m0 scale bytes 2^(s - 127): 2^-9 .. 2^-5, as in released MXFP4 experts
FP8_SCALE_LOW, FP8_SCALE_HIGH = 16.0, 256.0  # normal fp8 e4m3 block scales (NVFP4)


def load_format_is_dummy() -> bool:
    from vllm.config import get_current_vllm_config
    fmt = getattr(get_current_vllm_config().load_config, "load_format", "auto")
    return str(getattr(fmt, "value", fmt)).lower() == "dummy"


def _is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _tile(n: int, dtype: torch.dtype, scale: bool, g: torch.Generator) -> torch.Tensor:
    """n dummy values of `dtype`: block scales in a normal range (see the module docstring), other
    floats in vLLM's dummy range."""
    if scale and dtype == torch.uint8:
        return torch.randint(E8M0_LOW, E8M0_HIGH + 1, (n,), generator=g, dtype=torch.uint8)
    if scale and _is_fp8(dtype):
        return torch.empty(n, dtype=torch.float32).uniform_(FP8_SCALE_LOW, FP8_SCALE_HIGH, generator=g).to(dtype)
    return torch.empty(n, dtype=torch.float32).uniform_(LOW, HIGH, generator=g).to(dtype)


def is_block_scale(name: str, dtype: torch.dtype) -> bool:
    """A quantized format's block scale that the engine multiplies by: e8m0 bytes (uint8) or fp8."""
    return "scale" in name and (dtype == torch.uint8 or _is_fp8(dtype))


def fill_(t: torch.Tensor, seed: int = SEED, name: str = "") -> torch.Tensor:
    """Fill a contiguous host tensor in place with a tile repeated over it: floats in vLLM's dummy range,
    block scales (`name` says which, `is_block_scale`) in a normal range, other integers zero."""
    if not t.is_contiguous():
        raise ValueError("dummy fill needs a contiguous tensor")
    scale = is_block_scale(name, t.dtype)
    if not torch.is_floating_point(t) and not scale:
        return t.zero_()
    flat = t.view(-1)
    n = min(TILE, flat.numel())
    if n == 0:
        return t
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    tile = _tile(n, t.dtype, scale, g)
    full = flat.numel() // n
    flat[: full * n].view(full, n).copy_(tile.expand(full, n))
    rest = flat.numel() - full * n
    if rest:
        flat[full * n:].copy_(tile[:rest])
    return t


def materialize(module: torch.nn.Module) -> int:
    """Give every meta parameter of `module` (not its children) filled host memory; returns bytes."""
    total = 0
    for name, p in list(module.named_parameters(recurse=False)):
        if p.device.type != "meta":
            continue
        # A meta tensor's storage cannot be swapped (`.data =` refuses): a new Parameter that
        # keeps the old one's attributes (weight_loader and the like).
        host = torch.nn.Parameter(fill_(torch.empty(p.shape, dtype=p.dtype, device="cpu"), name=name),
                                  requires_grad=p.requires_grad)
        host.__dict__.update(p.__dict__)
        module._parameters[name] = host
        total += host.numel() * host.element_size()
    return total
