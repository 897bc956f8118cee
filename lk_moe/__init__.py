"""lk_moe: the open CPU engine for the routed experts of Mixture-of-Experts layers."""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401
from .config import ConfigError, EngineConfig
from .engine import default_pool, isa, make_pool, set_isa, supported_isas
from .layer import ForwardHandle, MoELayer

__version__ = "0.1.0.dev0"

__all__ = [
    "ConfigError", "EngineConfig", "ForwardHandle", "MoELayer",
    "default_pool", "isa", "make_pool", "set_isa", "supported_isas", "__version__",
]
