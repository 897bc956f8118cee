"""`lvllm doctor [--model DIR] [--tp N] [--max-model-len L]`: what this machine offers lvllm, what will
fail, and (with a checkpoint) a suggested configuration printed as the env lines to use, with the plan
of one GPU's VRAM (lvllm.fit: weights, reserve, KV cache, GPU expert cache).

Each check prints one line: "ok", "warn" (works, but slower or fragile) or "FAIL" (startup or
serving will fail), with what to do. Exit status 1 if anything FAILs.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import resource
import sys
from dataclasses import dataclass
from typing import List, Optional

from .. import pins
from ..hugepages import thp_mode
from ..threads import physical_cores

PINS = {"vllm": pins.VLLM, "torch": pins.TORCH}
GiB = 1 << 30


def _size(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.1f} MiB"


@dataclass
class Line:
    level: str  # ok | warn | FAIL | info
    topic: str
    text: str


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _meminfo() -> dict:
    out = {}
    for ln in _read("/proc/meminfo").splitlines():
        k, _, v = ln.partition(":")
        parts = v.split()
        if parts:
            out[k] = int(parts[0]) * 1024
    return out


def _cpu_model() -> str:
    for ln in _read("/proc/cpuinfo").splitlines():
        if ln.startswith("model name"):
            return ln.split(":", 1)[1].strip()
    return "unknown CPU"


def _numa_nodes() -> int:
    base = "/sys/devices/system/node"
    try:
        return max(1, sum(1 for d in os.listdir(base) if d.startswith("node") and d[4:].isdigit()))
    except OSError:
        return 1


def _version(pkg: str) -> Optional[str]:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def build_line() -> Line:
    try:
        import lk_moe
        b = lk_moe.build_info()
    except Exception as e:  # the engine may not be built in this environment
        return Line("FAIL", "lvllm", f"lk_moe engine not importable ({type(e).__name__}: {e})")
    gpu = (f"GPU fallback kernels sm_{', sm_'.join(b['cuda_archs'])} (CUDA {b.get('cuda_toolkit')})"
           if b.get("cuda_archs") else "no GPU fallback kernels (built without nvcc)")
    return Line("info", "lvllm", f"{b.get('version')} (commit {b.get('git_commit', '?')}"
                                 f"{', modified' if b.get('git_dirty') else ''}, built {b.get('built_at', '?')} "
                                 f"for torch {b.get('torch', '?')}); CPU tiers {', '.join(b.get('cpu_tiers', []))}; {gpu}")


def machine_checks() -> List[Line]:
    lines = [build_line()]
    cpus = os.sched_getaffinity(0)
    try:
        import lk_moe
        isa = f"ISA tier {lk_moe.isa()} (supported: {', '.join(lk_moe.supported_isas())})"
    except Exception as e:  # the engine may not be built in this environment
        isa = f"lk_moe engine not importable ({type(e).__name__}: {e})"
    lines.append(Line("info", "cpu", f"{_cpu_model()}; {len(cpus)} logical CPUs usable, "
                                     f"{physical_cores(sorted(cpus))} physical cores, {_numa_nodes()} NUMA node(s); {isa}"))
    mem = _meminfo()
    lines.append(Line("info", "memory", f"{mem.get('MemTotal', 0) / GiB:.1f} GiB total, "
                                        f"{mem.get('MemAvailable', 0) / GiB:.1f} GiB available"))
    mode = thp_mode()
    lines.append(Line("ok" if mode in ("always", "madvise") else "warn", "hugepages",
                      f"transparent hugepages: {mode}" + ("" if mode in ("always", "madvise") else
                                                         " (expert reads are faster with 'madvise' or 'always')")))
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    lim = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / (1 << 20):.0f} MiB"
    # CUDA pins through the driver (cudaHostAlloc/Register), which as root or with the default
    # device permissions is not bound by RLIMIT_MEMLOCK on most systems; containers may differ.
    lines.append(Line("ok" if soft == resource.RLIM_INFINITY or soft >= 4 * GiB else "warn", "locked memory",
                      f"ulimit -l: {lim}" + ("" if soft == resource.RLIM_INFINITY or soft >= 4 * GiB else
                                             " (if pinning fails at startup: `ulimit -l unlimited`, or "
                                             "--ulimit memlock=-1 for containers)")))
    for pkg, want in PINS.items():
        have = _version(pkg)
        if have is None:
            lines.append(Line("warn" if pkg == "vllm" else "FAIL", pkg,
                              f"{pkg} not installed (lvllm needs {pkg}=={want}" +
                              (" to serve; the CPU engine works without it)" if pkg == "vllm" else ")")))
        else:
            ok = have.split("+")[0] == want
            lines.append(Line("ok" if ok else "FAIL", pkg, f"{pkg} {have}" + ("" if ok else f": lvllm needs {pkg}=={want}")))
    lines += gpu_checks()
    lines.append(plugin_check())
    lines += settings_checks()
    return lines


def settings_checks(env=None) -> List[Line]:
    """The check a switch-on startup makes in its first process (lvllm.settings), with its words."""
    from ..settings import ENGINE_SETTINGS, PLUGIN_SETTINGS, SettingsError, check
    env = dict(os.environ if env is None else env)
    try:
        settings = check(env)
    except SettingsError as e:
        return [Line("FAIL", "settings", f"{e}: `vllm serve` with LVLLM_MOE_NUMA_ENABLED=1 stops at startup on it")]
    given = [f"{n}={env[n]}" for n in PLUGIN_SETTINGS + ENGINE_SETTINGS if env.get(n, "").strip()]
    out = [Line("ok", "settings", "LVLLM_* and LK_* valid" + (f": {', '.join(given)}" if given else " (all defaults)"))]
    return out + [Line("warn", "settings", w) for w in settings.warnings]


def gpu_checks() -> List[Line]:
    try:
        import torch
    except ImportError:
        return [Line("FAIL", "gpu", "torch is not installed")]
    if not torch.cuda.is_available():
        return [Line("warn", "gpu", "no NVIDIA GPU visible: `vllm serve` needs one; the CPU engine demo runs without")]
    out = [Line("info", "cuda", f"CUDA {torch.version.cuda} (torch build)")]
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        p = torch.cuda.get_device_properties(i)
        out.append(Line("info", f"gpu{i}", f"{p.name}, sm_{p.major}{p.minor}, {free / GiB:.1f} of {total / GiB:.1f} GiB free"))
    return out


def plugin_check() -> Line:
    eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.value.startswith("lvllm.")]
    if not eps:
        return Line("FAIL", "plugin", "lvllm's vllm.general_plugins entry point is not installed "
                                      "(pip install the lvllm wheel into vLLM's environment)")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and eps[0].name not in [p.strip() for p in allowed.split(",")]:
        return Line("FAIL", "plugin", f"VLLM_PLUGINS={allowed!r} does not list {eps[0].name!r}: vLLM will not load lvllm")
    try:
        from ..config import from_env
        cfg = from_env()
    except ValueError:
        cfg = None  # settings_checks names the variable
    from ..plugin import PluginError, check_hook_targets
    try:
        hooks = f"hooks fit {check_hook_targets()}"
    except PluginError as e:
        return Line("FAIL", "plugin", str(e))
    state = ("unknown (a bad LVLLM_* value, see settings)" if cfg is None else
             "on" if cfg.enabled else "off (LVLLM_MOE_NUMA_ENABLED=0: stock vLLM)")
    return Line("ok", "plugin", f"entry point {eps[0].name} -> {eps[0].value}; {hooks}; switch {state}")


VLLM_GPU_UTIL = 0.9  # vLLM's default --gpu-memory-utilization


def model_checks(path: str, tp: int, max_model_len: int = 0, max_num_seqs: int = 0, gpu_gib: float = 0,
                 util: float = VLLM_GPU_UTIL, host_gib: float = 0) -> List[Line]:
    from .checkpoint_info import CheckpointError, read_checkpoint
    try:
        info = read_checkpoint(path)
    except CheckpointError as e:
        return [Line("FAIL", "model", str(e))]
    lines = []
    how = "estimated from config.json" if info.estimated else "from the safetensors headers"
    dtypes = ", ".join(f"{k} {_size(v)}" for k, v in sorted(info.expert_dtypes.items()))
    lines.append(Line("info", "model", f"{info.architecture} ({info.model_type}), quantization "
                                       f"{info.quant_method or 'none'}; {info.moe_layers} MoE of {info.num_layers} layers; "
                                       f"routed experts {_size(info.expert_bytes)} ({dtypes}), other weights "
                                       f"{_size(info.other_bytes)} ({how})"))
    if info.moe_layers == 0:
        lines.append(Line("FAIL", "model", "no MoE layers found: lvllm has nothing to offload"))
        return lines
    avail = int(host_gib * GiB) or _meminfo().get("MemAvailable", 0)
    from ..autofit import ENGINE_OVERHEAD, PROCESS_HOST_BYTES
    process_bytes = PROCESS_HOST_BYTES * tp  # vLLM's and torch's processes themselves
    engine_bytes = info.expert_bytes * ENGINE_OVERHEAD  # the engine's packed copy of the experts
    tables = info.host_table_bytes  # vLLM's own host-RAM tables (V4.1's Engram, Qwen4Exp's PLE)
    need = engine_bytes + process_bytes + tables
    lines.append(Line("ok" if avail >= need else "FAIL", "host RAM",
                      f"~{need / GiB:.0f} GiB of host RAM needed (experts {_size(engine_bytes)} in the "
                      f"engine + ~{process_bytes / GiB:.0f} GiB for vLLM's processes"
                      + (f" + its host tables {_size(tables)}" if tables else "")
                      + f"), {avail / GiB:.0f} GiB available" +
                      ("" if avail >= need else ": a smaller quantization of this model, or more RAM")))
    lines += suggest(info, tp, max_model_len, max_num_seqs, gpu_gib, util, host_gib=host_gib)
    return lines


def suggest(info, tp: int, max_model_len: int = 0, max_num_seqs: int = 0, gpu_gib: float = 0,
            util: float = VLLM_GPU_UTIL, machine=None, host_gib: float = 0) -> List[Line]:
    """lvllm.autofit's plan for this checkpoint on this machine (or on a described GPU; `machine`: a whole
    described one), as doctor lines and the environment that sets it."""
    from ..autofit import Request, plan
    from ..autofit_inputs import describe_machine, describe_model
    from ..fit import FitError
    ctx = max_model_len or int(info.config.get("max_position_embeddings", 4096))
    machine = machine or describe_machine(gpu_gib, util, host_gib)
    if not machine.gpu_bytes:
        return [Line("info", "plan", "no GPU here: give --gpu-gib N to plan for one")]
    head = (f"{machine.gpu_bytes / GiB:.0f} GiB GPU x {util:g} (--gpu-memory-utilization), host RAM available "
            f"{machine.host_bytes / GiB:.0f} GiB, {machine.cores} cores, ISA {machine.isa}, read "
            f"{machine.read_gbps:.0f} GB/s, H2D {machine.h2d_gbps:.0f} GB/s; context {ctx} tokens, TP {tp}")
    try:
        p = plan(machine, describe_model(info, tp, ctx), Request(max_model_len=ctx, tp=tp,
                                                                 max_num_seqs=max_num_seqs or None))
    except FitError as e:
        return [Line("info", "plan", head), Line("FAIL", "plan", str(e))]
    env = ["LVLLM_MOE_NUMA_ENABLED=1", f"LK_THREADS={p.threads}",
           f"LVLLM_GPU_PREFILL_MIN_BATCH_SIZE={p.gpu_prefill_min_batch}"]
    if p.resident_layers:  # the first MoE layers
        from ..runtime import _ranges
        from .checkpoint_info import moe_layer_indices
        env.append(f"LVLLM_GPU_RESIDENT_MOE_LAYERS={_ranges(moe_layer_indices(info.config)[:p.resident_layers])}")
    if p.cache_bytes:
        env.append(f"LVLLM_GPU_EXPERT_CACHE={p.cache_bytes / GiB:.2f}")
    return ([Line("info", "plan", head)] + [Line("info", "plan", ln) for ln in p.lines] +
            [Line("info", "suggested", "environment for `vllm serve " + info.path +
                  (f" --tensor-parallel-size {tp}" if tp > 1 else "") + f" --max-model-len {ctx}`:\n    " +
                  "\n    ".join(env) + "\n    (or LVLLM_MOE_NUMA_ENABLED=1 LVLLM_AUTO_FIT=1: this plan, made by each "
                  "worker at startup)")])


def render(lines: List[Line]) -> str:
    return "\n".join(f"{ln.level:>4}  {ln.topic:<13} {ln.text}" for ln in lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lvllm doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint directory (config.json + safetensors, or config only)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size you plan to serve with")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="context you plan to serve (default: the model's max_position_embeddings)")
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="sequences you plan to serve at full context at once (default: the plan's 2)")
    ap.add_argument("--gpu-gib", type=float, default=0,
                    help="plan for a GPU of this many GiB (default: this machine's GPU)")
    ap.add_argument("--host-gib", type=float, default=0,
                    help="plan for a host with this many GiB of RAM free (default: this machine's MemAvailable)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=VLLM_GPU_UTIL,
                    help="vLLM's --gpu-memory-utilization you plan to serve with")
    a = ap.parse_args(argv)
    if a.max_num_seqs < 0 or a.gpu_gib < 0 or a.host_gib < 0 or not 0 < a.gpu_memory_utilization <= 1:
        ap.error("--max-num-seqs, --gpu-gib and --host-gib must be >= 0, --gpu-memory-utilization in (0, 1]")
    if a.tp < 1:
        ap.error("--tp must be >= 1")
    if a.max_model_len < 0:
        ap.error("--max-model-len must be >= 1 (0: the model's own)")
    lines = machine_checks()
    if a.model:
        lines += model_checks(a.model, a.tp, a.max_model_len, a.max_num_seqs, a.gpu_gib, a.gpu_memory_utilization,
                              a.host_gib)
    print(render(lines))
    return 1 if any(ln.level == "FAIL" for ln in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
