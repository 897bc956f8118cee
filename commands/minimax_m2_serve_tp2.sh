#!/usr/bin/env bash
# MiniMax-M2 (230B-A10B, FP8 block, MiniMaxAI/MiniMax-M2) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, >= 320 GB RAM (62 MoE layers x 3.6 GB = ~224 GB of
# FP8 experts). lk_moe never masks NaNs (no nan_to_num): a fault shows instead of being hidden.
# Prefill runs on the CPU here (--prefill 0 below). GPU prefill streams FP8 experts too (vLLM's FP8
# kernel from sm_89, else dequantized to bf16 on the GPU): put e.g. 1024 there for long prompts.
#
# Usage: bash commands/minimax_m2_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name minimax-m2 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
