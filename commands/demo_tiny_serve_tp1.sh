#!/usr/bin/env bash
# The built-in demo (README quick start, "the main job").
# Assumes: any x86-64 CPU; for serving, one NVIDIA GPU (a few GB are enough) and vLLM 0.33.0.
# - With a GPU: writes a tiny Qwen3-MoE checkpoint of random weights (~/.cache/lvllm), runs
#   `vllm serve` on it with lk_moe switched on, sends one chat request and prints the answer
#   (gibberish: random weights) and lk_moe's startup summary.
# - Without a GPU (or vLLM): says so and runs the CPU engine demo (one Qwen3-30B-A3B-shaped MoE
#   layer on lk_moe, checked against torch and timed).
#
# Usage: bash commands/demo_tiny_serve_tp1.sh
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# An installed lvllm (`pip install` of the release wheel) runs as it is; in a source checkout
# without one, set up the venv and build first.
py="${PYTHON:-python3}"
if site=$(cd / && "$py" -c "import os, lk_moe._C, lvllm; print(os.path.dirname(os.path.dirname(lvllm.__file__)))" 2>/dev/null) \
    && [ "$site" != "$root" ]; then
  cd /
  exec "$py" -m lvllm.cli.demo_serve "$@"
fi
source "$root/tools/setup_env.sh"
cd "$root"
exec "$LVLLM_PYTHON" -m lvllm.cli.demo_serve "$@"
