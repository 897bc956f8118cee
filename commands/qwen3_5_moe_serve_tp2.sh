#!/usr/bin/env bash
# Qwen3.5 MoE (hybrid Gated-DeltaNet attention; bf16 or FP8 block) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, host RAM of at least the checkpoint's expert bytes
# plus 10% (`lvllm doctor --model` prints them). bf16 checkpoints may set
# LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 to prefill long prompts on the GPUs.
# Prefill runs on the CPU by default here; GPU prefill streams FP8 experts too (vLLM's FP8 kernel
# from sm_89, else dequantized to bf16): LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 for long prompts.
#
# Usage: bash commands/qwen3_5_moe_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name qwen3.5-moe --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 0 -- "$@"
