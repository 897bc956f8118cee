#!/usr/bin/env bash
# Qwen3-235B-A22B (FP8 block) on two GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 16 GB each, >= 16 cores, >= 320 GB RAM (~227 GB of FP8 experts, half of each
# expert per rank; FP8 blocks of 128 need moe_intermediate_size/TP divisible by 128: TP <= 4).
# Prefill runs on the CPU here (--prefill 0 below). GPU prefill streams FP8 experts too (vLLM's FP8
# kernel from sm_89, else dequantized to bf16 on the GPU): put e.g. 1024 there for long prompts.
#
# Usage: bash commands/qwen3_235b_a22b_fp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name qwen3-235b-a22b --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
