#!/usr/bin/env bash
# GLM-4.5 / GLM-4.6 (355B-A32B, FP8 block, e.g. zai-org/GLM-4.5-FP8) on two GPUs, experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, >= 448 GB RAM (89 MoE layers x 3.8 GB = ~336 GB of
# FP8 experts). bf16 checkpoints need ~672 GB and may set LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024.
# Prefill runs on the CPU by default here; GPU prefill streams FP8 experts too (vLLM's FP8 kernel
# from sm_89, else dequantized to bf16): LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 for long prompts.
#
# Usage: bash commands/glm_4_5_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name glm-4.5 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 0 -- "$@"
