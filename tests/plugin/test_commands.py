"""Every commands/<model>_serve_tp<N>.sh: its LVLLM_/LK_ values pass our config parsers, its
`vllm serve` arguments pass the pinned vLLM's own serve parser (where vLLM is installed: CI), its
header states the hardware it assumes, and through the shared launcher (commands/serve.sh) it runs
the same command line and environment as the standalone script it replaced."""
import glob
import os
import shlex
import subprocess

import pytest

from lk_moe.config import from_env as engine_env
from lvllm.config import from_env as lvllm_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "commands", "*_serve_tp*.sh")))
SERVE = [s for s in SCRIPTS if not os.path.basename(s).startswith("demo_")]
REQUIRED = ["deepseek_v3_fp8_serve_tp1", "deepseek_v3_fp8_serve_tp2", "deepseek_v4_flash_serve_tp1", "qwen3_30b_a3b_serve_tp1",
            "qwen3_235b_a22b_fp8_serve_tp1", "qwen3_235b_a22b_fp8_serve_tp2", "qwen3_235b_a22b_int4_serve_tp1",
            "qwen3_235b_a22b_int4_serve_tp2", "qwen3_5_moe_serve_tp2", "qwen3_next_80b_fp8_serve_tp1", "glm_4_5_serve_tp2", "minimax_m2_serve_tp2",
            "kimi_k2_int4_serve_tp2", "kimi_k25_int4_serve_tp2", "kimi_k3_serve_tp2", "deepseek_v4_flash_serve_tp2",
            "mixtral_8x22b_serve_tp1", "gpt_oss_120b_serve_tp1", "demo_tiny_serve_tp1", "deepseek_v41_serve_tp1",
            "deepseek_v41_serve_tp2", "qwen3_8_flash_next_serve_tp1", "glm_5_fp8_serve_tp2", "glm_5_3_serve_tp1",
            "minimax_m3_mxfp8_serve_tp2", "qwen3_6_35b_a3b_serve_tp1", "kimi_k25_int4_serve_tp1", "kimi_k3_serve_tp1"]


# What each script runs (for those older than the shared launcher: what their standalone scripts of
# 2bef6b3 ran): the vllm serve arguments between the checkpoint and the caller's,
# LVLLM_GPU_PREFILL_MIN_BATCH_SIZE, whether the script forces it (the environment cannot change it),
# and the default resident layers.
OLD = {
    "deepseek_v3_fp8_serve_tp1": ("--served-model-name deepseek-v3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "deepseek_v4_flash_serve_tp1": ("--served-model-name deepseek-v4-flash --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "deepseek_v3_fp8_serve_tp2": ("--tensor-parallel-size 2 --served-model-name deepseek-v3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "deepseek_v4_flash_serve_tp2": ("--tensor-parallel-size 2 --served-model-name deepseek-v4-flash --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "kimi_k3_serve_tp2": ("--tensor-parallel-size 2 --served-model-name kimi-k3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "1024", False, None),
    "kimi_k25_int4_serve_tp2": ("--tensor-parallel-size 2 --served-model-name kimi-k2.5 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "glm_4_5_serve_tp2": ("--tensor-parallel-size 2 --served-model-name glm-4.5 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", False, None),
    "gpt_oss_120b_serve_tp1": ("--served-model-name gpt-oss-120b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "0", True, None),
    "kimi_k2_int4_serve_tp2": ("--tensor-parallel-size 2 --trust-remote-code --served-model-name kimi-k2 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "minimax_m2_serve_tp2": ("--tensor-parallel-size 2 --served-model-name minimax-m2 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "mixtral_8x22b_serve_tp1": ("--served-model-name mixtral-8x22b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "2048", False, None),
    "qwen3_235b_a22b_fp8_serve_tp1": ("--served-model-name qwen3-235b-a22b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "qwen3_235b_a22b_fp8_serve_tp2": ("--tensor-parallel-size 2 --served-model-name qwen3-235b-a22b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "qwen3_235b_a22b_int4_serve_tp1": ("--served-model-name qwen3-235b-a22b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "qwen3_235b_a22b_int4_serve_tp2": ("--tensor-parallel-size 2 --served-model-name qwen3-235b-a22b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", True, None),
    "qwen3_30b_a3b_serve_tp1": ("--served-model-name qwen3-30b-a3b --max-model-len 32768 --max-num-seqs 8 --gpu-memory-utilization 0.90", "1024", False, "0-7"),
    "qwen3_next_80b_fp8_serve_tp1": ("--served-model-name qwen3-next-80b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "2048", False, None),
    "deepseek_v41_serve_tp1": ("--served-model-name deepseek-v4.1 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "deepseek_v41_serve_tp2": ("--tensor-parallel-size 2 --served-model-name deepseek-v4.1 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "qwen3_8_flash_next_serve_tp1": ("--served-model-name qwen3.8-flash-next --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "glm_5_fp8_serve_tp2": ("--tensor-parallel-size 2 --served-model-name glm-5 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "1024", False, None),
    "glm_5_3_serve_tp1": ("--served-model-name glm-5.3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "1024", False, None),
    "qwen3_5_moe_serve_tp2": ("--tensor-parallel-size 2 --served-model-name qwen3.5-moe --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", False, None),
    "minimax_m3_mxfp8_serve_tp2": ("--tensor-parallel-size 2 --served-model-name minimax-m3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "1024", False, None),
    "kimi_k25_int4_serve_tp1": ("--served-model-name kimi-k2.5 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "0", False, None),
    "kimi_k3_serve_tp1": ("--served-model-name kimi-k3 --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.92", "1024", False, None),
    "qwen3_6_35b_a3b_serve_tp1": ("--served-model-name qwen3.6-35b-a3b --max-model-len 32768 --max-num-seqs 4 --gpu-memory-utilization 0.90", "2048", False, None),
}


def dry_run(script, **extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env.update(extra_env, LVLLM_DRY_RUN="1")
    out = subprocess.run(["bash", script, "/models/checkpoint", "--port", "8123"], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout.strip().splitlines()
    variables = dict(line.split("=", 1) for line in out[:-1])
    variables.pop("LVLLM_DRY_RUN")
    argv = shlex.split(out[-1])
    assert argv[:3] == ["vllm", "serve", "/models/checkpoint"] and argv[-2:] == ["--port", "8123"]
    return variables, argv[2:]


def test_every_listed_model_has_a_script():
    have = {os.path.basename(s)[:-3] for s in SCRIPTS}
    assert not set(REQUIRED) - have, f"missing: {sorted(set(REQUIRED) - have)}"


@pytest.mark.parametrize("script", SERVE, ids=os.path.basename)
def test_switches_parse(script):
    variables, argv = dry_run(script)
    cfg = lvllm_env(variables)
    assert cfg.enabled, "the script must switch lk_moe on"
    engine_env(variables, logical_cpus=1024)
    tp = int(os.path.basename(script).rsplit("_tp", 1)[1][:-3])
    assert (tp > 1) == ("--tensor-parallel-size" in argv)
    if tp > 1:
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
    header = open(script).read().split("set -euo pipefail")[0]
    assert "Assumes:" in header and f"lvllm doctor --model /path/to/checkpoint --tp {tp}" in header


def test_every_script_is_recorded():
    assert {os.path.basename(s)[:-3] for s in SERVE} == set(OLD)


@pytest.mark.parametrize("script", SERVE, ids=os.path.basename)
def test_same_command_as_the_standalone_script(script):
    args, prefill, forced, resident = OLD[os.path.basename(script)[:-3]]
    variables, argv = dry_run(script)
    assert argv[1:-2] == shlex.split(args)
    want = {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": prefill}
    if resident:
        want["LVLLM_GPU_RESIDENT_MOE_LAYERS"] = resident
    assert variables == want
    # the caller's environment: kept where the script only defaults a value, overridden where it forces one
    variables, argv = dry_run(script, LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="4096", LVLLM_GPU_RESIDENT_MOE_LAYERS="0-1",
                              LK_THREADS="6")
    assert argv[1:-2] == shlex.split(args)
    assert variables == {"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": prefill if forced else "4096",
                         "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0-1", "LK_THREADS": "6"}


def test_launcher_alone_and_its_errors():
    launcher = os.path.join(ROOT, "commands", "serve.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env["LVLLM_DRY_RUN"] = "1"
    out = subprocess.run(["bash", launcher, "--tp", "2", "--name", "m", "--prefill-default", "512", "--", "/ckpt", "--port", "1"],
                         env=env, capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    assert "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=512" in out and "LVLLM_MOE_NUMA_ENABLED=1" in out
    assert shlex.split(out[-1]) == ["vllm", "serve", "/ckpt", "--tensor-parallel-size", "2", "--served-model-name", "m",
                                    "--max-model-len", "32768", "--port", "1"]
    r = subprocess.run(["bash", launcher, "--no-such-option", "1", "--", "/ckpt"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "unknown option --no-such-option" in r.stderr


def test_missing_model_argument_is_a_clear_error():
    r = subprocess.run(["bash", SERVE[0]], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "usage: bash" in r.stderr


@pytest.mark.parametrize("script", SERVE, ids=os.path.basename)
def test_vllm_accepts_the_arguments(script):
    vllm = pytest.importorskip("vllm")
    from lvllm import pins
    assert vllm.__version__ == pins.VLLM
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm.platforms as platforms
    if not platforms.current_platform.device_type:
        # No GPU here (CI): vLLM's CUDA build then has no platform, and its argument defaults
        # need one. Parsing does not touch the device: lend it the CPU platform's answers.
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()
    _, argv = dry_run(script)
    parser = FlexibleArgumentParser(prog="vllm")
    sub = ServeSubcommand()
    sub.subparser_init(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(["serve", *argv])
    sub.validate(args)
    assert args.model_tag == "/models/checkpoint"
