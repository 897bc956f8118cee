#!/usr/bin/env bash
# The built-in demo (README "main job").
# Hardware: any x86-64 CPU; an NVIDIA GPU for serving.
# - Without a GPU: says so and runs the CPU engine demo (one Qwen3-30B-A3B-shaped MoE layer on
#   lk_moe, checked against torch and timed).
# - With a GPU: `vllm serve` of a generated tiny checkpoint comes with the vLLM plugin
#   (not in this build yet); until then the CPU engine demo runs there too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/tools/setup_env.sh"
cd "$root"
exec "$LVLLM_PYTHON" -m lk_moe.demo "$@"
