"""`--load-format dummy` (benchmarks) for hybrid layers, at host speed.

vLLM 0.33's DummyModelLoader fills every tensor of every module in place
(`initialize_single_dummy_weight`) with a serial random generator on the tensor's device: for a
routed-expert tensor in host RAM that is one CPU core at ~0.5 GB/s (measured with 0.26's filler,
the same generator), minutes of start-up for the 57 GB of a Qwen3-30B-A3B-shaped model.

So with the dummy format the hybrid method creates its tensors on the meta device (vLLM's filler
skips meta tensors), and `materialize` gives them host memory at hand-over: floating tensors are
filled with a random tile in vLLM's dummy range, tiled over the tensor (multi-threaded copies),
integer tensors (packed 4-bit, e8m0 scales) are zeroed, as fresh `torch.empty` memory is in the
stock dummy run. Decode and prefill cost of the engine does not depend on the values.
"""
from __future__ import annotations

import torch

LOW, HIGH = -1e-3, 1e-3  # vLLM's initialize_dummy_weights range
TILE = 1 << 20  # random values per tile (a few MiB)
SEED = 1234


def load_format_is_dummy() -> bool:
    from vllm.config import get_current_vllm_config
    fmt = getattr(get_current_vllm_config().load_config, "load_format", "auto")
    return str(getattr(fmt, "value", fmt)).lower() == "dummy"


def fill_(t: torch.Tensor, seed: int = SEED) -> torch.Tensor:
    """Fill a contiguous host tensor in place: tiled uniform values (floats), zeros (integers)."""
    if not t.is_contiguous():
        raise ValueError("dummy fill needs a contiguous tensor")
    if not torch.is_floating_point(t):
        return t.zero_()
    flat = t.view(-1)
    n = min(TILE, flat.numel())
    if n == 0:
        return t
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    tile = torch.empty(n, dtype=torch.float32).uniform_(LOW, HIGH, generator=g).to(t.dtype)
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
        host = torch.nn.Parameter(fill_(torch.empty(p.shape, dtype=p.dtype, device="cpu")),
                                  requires_grad=p.requires_grad)
        host.__dict__.update(p.__dict__)
        module._parameters[name] = host
        total += host.numel() * host.element_size()
    return total
