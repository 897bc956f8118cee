#!/usr/bin/env bash
# DeepSeek-V3 / DeepSeek-R1 (FP8 block) on two GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 CPU cores (each rank's engine gets half of them),
# >= 768 GB RAM (~654 GB of FP8 experts, split between the ranks: each holds half of every expert).
# Prefill runs on the CPU here (--prefill 0 below). GPU prefill streams FP8 experts too (vLLM's FP8
# kernel from sm_89, else dequantized to bf16 on the GPU): put e.g. 1024 there for long prompts.
# Two sockets with one GPU each: add --numa-bind so each rank stays on its GPU's node.
#
# Usage: bash commands/deepseek_v3_fp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name deepseek-v3 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
