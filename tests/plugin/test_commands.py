"""Every commands/<model>_serve_tp<N>.sh: its LVLLM_/LK_ values pass our config parsers, its
`vllm serve` arguments pass the pinned vLLM's own serve parser (where vLLM is installed: CI), and its
header states the hardware it assumes."""
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
REQUIRED = ["deepseek_v3_fp8_serve_tp1", "deepseek_v3_fp8_serve_tp2", "qwen3_30b_a3b_serve_tp1",
            "qwen3_235b_a22b_fp8_serve_tp1", "qwen3_235b_a22b_fp8_serve_tp2", "qwen3_235b_a22b_int4_serve_tp1",
            "qwen3_235b_a22b_int4_serve_tp2", "qwen3_5_moe_serve_tp2", "glm_4_5_serve_tp2", "minimax_m2_serve_tp2",
            "kimi_k2_int4_serve_tp2", "mixtral_8x22b_serve_tp1", "gpt_oss_120b_serve_tp1", "demo_tiny_serve_tp1"]


def dry_run(script):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env["LVLLM_DRY_RUN"] = "1"
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
