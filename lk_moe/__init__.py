"""lk_moe: the open CPU engine for the routed experts of Mixture-of-Experts layers."""
import torch  # noqa: F401  (loads libtorch before the extension)

try:
    from . import _C  # noqa: F401
except ImportError as _e:  # a source checkout whose extension was never built, or one built for another torch
    import glob as _glob
    import os as _os
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _why = (f"it was never built here ({_here} holds no _C*.so)" if not _glob.glob(_os.path.join(_here, "_C*.so"))
            else f"loading it failed: {_e}")
    raise ImportError(
        f"lk_moe's compiled engine (lk_moe._C) cannot be loaded: {_why}. In a source checkout, build it "
        "first (`source tools/setup_env.sh`, or `pip install --no-build-isolation -e .`); an installed lvllm "
        "wheel must match the installed torch (lvllm doctor shows both); to use an installed wheel, run from "
        "outside the source tree (the checkout's lk_moe shadows it).") from None
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
