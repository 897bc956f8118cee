"""lk_moe: the open CPU engine for the routed experts of Mixture-of-Experts layers."""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401
from .config import ConfigError, EngineConfig
from .engine import default_pool, isa, make_pool, set_isa, supported_isas
from .layer import ForwardHandle, MoELayer


def __getattr__(name):
    # GPU-side classes load on first use (they need torch.cuda only when constructed).
    if name == "HybridMoE":
        from .hybrid import HybridMoE
        return HybridMoE
    if name == "ExpertStreamer":
        from .hybrid import ExpertStreamer
        return ExpertStreamer
    raise AttributeError(name)

__version__ = "0.1.0.dev0"


def build_info() -> dict:
    """What this build holds: version, git commit, CUDA toolkit and GPU architectures of the
    fallback kernels, CPU tiers, the torch it was built against (written by setup.py)."""
    import json
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.json")
    if not os.path.exists(path):
        return {"version": __version__, "note": "built without setup.py: no build record"}
    with open(path) as f:
        return json.load(f)

__all__ = [
    "ConfigError", "EngineConfig", "ForwardHandle", "MoELayer",
    "build_info", "default_pool", "isa", "make_pool", "set_isa", "supported_isas", "__version__",
]
