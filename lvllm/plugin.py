"""The `vllm.general_plugins` entry point: vLLM runs `register()` once in every process.

Switch off (LVLLM_MOE_NUMA_ENABLED unset/0): return at once; nothing of vLLM's internals or of
lk_moe is imported, vLLM runs exactly as shipped. Switch on: check every LVLLM_* and LK_* setting
(lvllm.settings: a bad value stops startup in the first process, the API server, naming the
variable; this loads lk_moe's engine library but starts no thread), check that this is the vLLM the
hook was written for, then install one hook, once per process, at the moment vLLM itself imports
the module it goes into (lvllm.post_import: processes that never build a model, like the API
server, import none of vLLM's model code):

H1  RoutedExperts._get_quant_method: after vLLM picked the layer's method, ask the layer policy;
    hybrid layers get their method re-classed into the hybrid method (lvllm.hybrid_method), which
    also answers `requires_device_loading = False`, so vLLM's post-load step leaves its host
    tensors on the host.

H2  GPUModelRunner.profile_run, in both of vLLM's model runners (v1/worker/gpu_model_runner.py and
    the V2 runner, v1/worker/gpu/model_runner.py): run inside lvllm.padding.profile_run(), so the
    memory-profile batch costs the CPU engine no expert reads (it still sizes the GPU paths).

H3  GPUModelRunner.execute_model, in both model runners: lvllm.runtime.before_step() first (not for
    the V2 runner's dummy runs): the GPU expert cache's refills and policy run between steps, never
    inside one (a captured graph replays with whatever its slots hold then).

Any check that fails raises PluginError naming the vLLM function and version: never a
half-installed plugin, never a silent fallback to stock vLLM.

Test instrumentation, switch on or off: LVLLM_TEST_MOE_CAPTURE=<dir> (the e2e MoE-layer oracle's runs only) records
what the routed expert layers compute (lvllm.testing.moe_capture); unset, register() reads nothing else first.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os

from .config import FALSE_VALUES, LvllmConfig
from .pins import VLLM as SUPPORTED_VLLM
from .post_import import when_imported
from .settings import SettingsError, check as check_settings

logger = logging.getLogger("vllm.lvllm")

_installed = False
_capturing = False


class PluginError(RuntimeError):
    """lvllm cannot hook into this vLLM; startup stops instead of running without lk_moe."""


def _switch_is_on() -> bool:
    # Anything but an off value counts as on here; from_env then refuses a non-boolean by name.
    return os.environ.get("LVLLM_MOE_NUMA_ENABLED", "").strip().lower() not in FALSE_VALUES


def _params(fn) -> tuple:
    return tuple(inspect.signature(fn).parameters)


ROUTED_EXPERTS = "vllm.model_executor.layers.fused_moe.routed_experts"
# The model runners whose profile run H2 wraps: V1's, and the V2 runner (VLLM_USE_V2_MODEL_RUNNER).
MODEL_RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")


def _check_version() -> str:
    """The pinned vLLM, with the modules the hooks go into; nothing of vLLM's model code imported."""
    try:
        import vllm
    except ImportError as e:
        raise PluginError(f"LVLLM_MOE_NUMA_ENABLED=1 but vLLM cannot be imported: {e}") from None
    version = getattr(vllm, "__version__", "?")
    if version != SUPPORTED_VLLM:
        raise PluginError(f"lvllm supports vLLM {SUPPORTED_VLLM} only; this is vLLM {version}. "
                          f"Install vllm=={SUPPORTED_VLLM} or set LVLLM_MOE_NUMA_ENABLED=0")
    rel = os.path.join(*ROUTED_EXPERTS.split(".")[1:]) + ".py"
    if not any(os.path.exists(os.path.join(root, rel)) for root in getattr(vllm, "__path__", [])):
        raise PluginError(f"vLLM {version} has no module {ROUTED_EXPERTS}; lvllm cannot install its hooks")
    return version


def _check(where: str, expect: dict) -> None:
    """expect: {name: (function, parameter names)} as in the pinned vLLM."""
    for name, (fn, params) in expect.items():
        if fn is None or not callable(fn):
            raise PluginError(f"{where} has no {name}; lvllm cannot install its hooks")
        got = _params(getattr(fn, "__wrapped__", fn))
        if got != params:
            raise PluginError(f"{where}: {name}{got} differs from the expected {params}; "
                              "lvllm cannot install its hooks")


def _routed_experts_surface(module) -> dict:
    from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    if not isinstance(getattr(QuantizeMethodBase, "requires_device_loading", None), bool):
        # Without it vLLM's post-load step would copy every host expert to the GPU and back.
        raise PluginError("QuantizeMethodBase has no requires_device_loading flag; "
                          "lvllm cannot keep the experts on the host")
    return {
        "RoutedExperts._get_quant_method": (getattr(getattr(module, "RoutedExperts", None), "_get_quant_method", None),
                                            ("self", "prefix", "quant_config", "moe_config")),
        "FusedMoEMethodBase.apply": (FusedMoEMethodBase.apply,
                                     ("self", "layer", "x", "topk_weights", "topk_ids", "shared_experts",
                                      "shared_experts_input")),
        "FusedMoEMethodBase.create_weights": (FusedMoEMethodBase.create_weights,
                                              ("self", "layer", "num_experts", "hidden_size",
                                               "intermediate_size_per_partition", "params_dtype",
                                               "extra_weight_attrs")),
    }


def check_hook_targets() -> str:
    """What a switch-on startup checks, done now (for `lvllm doctor`; imports vLLM's MoE layer and
    model loader). Returns "vLLM <version>"; raises PluginError naming what does not fit."""
    import importlib
    where = f"vLLM {_check_version()}"
    _check(where, _routed_experts_surface(importlib.import_module(ROUTED_EXPERTS)))
    for name in MODEL_RUNNERS:
        module = importlib.import_module(name)
        _check(f"{where} ({name})", _profile_run_surface(module))
        _check(f"{where} ({name})", _execute_model_surface(module))
    return where


def _hook_routed_experts(cfg: LvllmConfig, where: str, module) -> None:
    """H1, once vLLM has imported its RoutedExperts module in this process."""
    _check(where, _routed_experts_surface(module))
    RoutedExperts = module.RoutedExperts
    original_get_quant_method = RoutedExperts._get_quant_method

    def _get_quant_method(self, prefix, quant_config, moe_config):
        # lk_moe (the policy reads its format table) loads with the first MoE layer a process builds.
        from .hybrid_method import make_hybrid
        from .policy import plan_for
        from .runtime import get_runtime
        method = original_get_quant_method(self, prefix, quant_config, moe_config)
        # the worker's runtime starts with the first MoE layer; with LVLLM_AUTO_FIT=1 its config carries the
        # plan (resident layers, prefill threshold, cache), made before any weight loads
        rt = get_runtime(cfg)
        plan = plan_for(prefix, method, self, moe_config, rt.cfg, _target_layers(), _model_tag())
        if plan.kind == "hybrid":
            make_hybrid(method, self, plan, rt.cfg)
        rt.note_planned(plan)
        logger.debug("lk_moe: %s -> %s%s", prefix, plan.kind, f" ({plan.format})" if plan.format else "")
        return method

    _get_quant_method.__wrapped__ = original_get_quant_method
    RoutedExperts._get_quant_method = _get_quant_method


def _model_tag():
    """vLLM's model tag of the model being built ("backbone" for the target; draft tags: policy.DRAFT_MODEL_TAGS)."""
    from vllm.compilation import backends
    return getattr(backends, "model_tag", None)


def _target_layers():
    """The decoder-layer count of the model vLLM is building (MTP draft layers are numbered past it)."""
    from vllm.config import get_current_vllm_config_or_none
    vc = get_current_vllm_config_or_none()
    hf = getattr(getattr(vc, "model_config", None), "hf_config", None)
    if hf is None:
        return None
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    n = getattr(text, "num_hidden_layers", None)
    return int(n) if n else None


def _profile_run_surface(module) -> dict:
    runner = getattr(module, "GPUModelRunner", None)
    return {"GPUModelRunner.profile_run": (getattr(runner, "profile_run", None), ("self", "randomize_inputs"))}


def _hook_profile_run(where: str, module) -> None:
    """H2, once vLLM has imported a model runner module in this process."""
    _check(f"{where} ({module.__name__})", _profile_run_surface(module))
    runner = module.GPUModelRunner
    original = runner.profile_run

    @functools.wraps(original)
    def profile_run(self, randomize_inputs: bool = False):
        from .padding import profile_run as marked
        with marked():
            return original(self, randomize_inputs)

    runner.profile_run = profile_run


# The parameters of execute_model in each runner (H3 passes them through; only their start matters).
EXECUTE_MODEL_PARAMS = {
    "vllm.v1.worker.gpu_model_runner": ("self", "scheduler_output", "intermediate_tensors"),
    "vllm.v1.worker.gpu.model_runner": ("self", "scheduler_output", "intermediate_tensors", "dummy_run",
                                        "skip_attn_for_dummy_run", "is_profile", "context_len",
                                        "valid_dummy_state_slots", "randomize_inputs"),
}


def _execute_model_surface(module) -> dict:
    runner = getattr(module, "GPUModelRunner", None)
    return {"GPUModelRunner.execute_model": (getattr(runner, "execute_model", None),
                                             EXECUTE_MODEL_PARAMS[module.__name__])}


def _hook_execute_model(where: str, module) -> None:
    """H3, once vLLM has imported a model runner module in this process."""
    _check(f"{where} ({module.__name__})", _execute_model_surface(module))
    runner = module.GPUModelRunner
    original = runner.execute_model

    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        if not kwargs.get("dummy_run", False):
            from .runtime import before_step
            before_step()
        return original(self, scheduler_output, *args, **kwargs)

    runner.execute_model = execute_model


# vLLM's MegaMoE experts are no RoutedExperts (they never call the quant-method hook): with the switch on they
# would keep every routed expert on the GPU without a word.
MEGA_MOE = "vllm.model_executor.layers.fused_moe.deep_gemm_mega_moe"


def _refuse_megamoe(module) -> None:
    cls = getattr(module, "DeepGemmMegaMoEExperts", None)
    if cls is None:
        return

    def __init__(self, *args, **kwargs):
        from .policy import UnsupportedMoELayer
        raise UnsupportedMoELayer(
            "lvllm: DeepGemmMegaMoEExperts (vLLM's MegaMoE backend, e.g. --kernel-config moe_backend=deep_gemm_mega_moe) "
            "builds the routed experts outside vLLM's RoutedExperts, so lk_moe cannot keep them in host RAM: with "
            "LVLLM_MOE_NUMA_ENABLED=1 leave the MoE backend to vLLM's default, or switch lvllm off")

    cls.__init__ = __init__


# DeepSeek-V4.1's latency-specialized decode (additional_config decode_backend=latency_specialized) computes the
# routed experts from the layers' GPU weight tensors itself, past the quant method lk_moe replaces.
SPECIALIZED_DECODE = "vllm.models.deepseek_v41.nvidia.specialized_decode"


def _refuse_specialized_decode(module) -> None:
    original = getattr(module, "specialized_decode_config", None)
    if original is None:
        return

    @functools.wraps(original)
    def specialized_decode_config(vllm_config):
        extra = getattr(vllm_config, "additional_config", None)
        if isinstance(extra, dict) and extra.get("decode_backend", "auto") == "latency_specialized":
            from .policy import UnsupportedMoELayer
            raise UnsupportedMoELayer(
                "lvllm: decode_backend=latency_specialized (DeepSeek-V4.1) computes the routed experts from their "
                "GPU weights itself, past lk_moe: with LVLLM_MOE_NUMA_ENABLED=1 leave decode_backend at auto, or "
                "switch lvllm off")
        return original(vllm_config)

    module.specialized_decode_config = specialized_decode_config


def _install(cfg: LvllmConfig) -> None:
    where = f"vLLM {_check_version()}"
    when_imported(ROUTED_EXPERTS, functools.partial(_hook_routed_experts, cfg, where))
    when_imported(MEGA_MOE, _refuse_megamoe)
    when_imported(SPECIALIZED_DECODE, _refuse_specialized_decode)
    for name in MODEL_RUNNERS:
        when_imported(name, functools.partial(_hook_profile_run, where))
        when_imported(name, functools.partial(_hook_execute_model, where))


def register() -> None:
    """Entry point (vllm.general_plugins). Idempotent within a process."""
    global _installed, _capturing
    if os.environ.get("LVLLM_TEST_MOE_CAPTURE") and not _capturing:
        from .testing.moe_capture import install_from_env
        try:
            _capturing = install_from_env()
        except ValueError as e:
            raise PluginError(f"lvllm: {e}") from None
    if not _switch_is_on() or _installed:
        return
    try:
        settings = check_settings()
    except SettingsError as e:
        raise PluginError(f"lvllm: {e}") from None
    cfg = settings.plugin
    _install(cfg)  # imports vLLM, which sets up the "vllm" loggers
    _installed = True
    from .metrics import setup_first_process
    setup_first_process()  # the API server's /metrics shows the workers' lk_moe counters
    for warning in settings.warnings:
        logger.warning("lvllm: %s", warning)
    # the "enabled" line comes from the worker's runtime (lvllm.runtime.get_runtime): vLLM 0.33 configures its
    # loggers at engine start, after plugins load, so an INFO line here is dropped
