#!/usr/bin/env bash
# Qwen3-235B-A22B (FP8 block, e.g. Qwen/Qwen3-235B-A22B-FP8) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB (other weights ~8 GB), >= 16 cores, >= 320 GB RAM (94 MoE layers x
# 2.4 GB = ~227 GB of FP8 experts). 48 GB GPU: LVLLM_GPU_RESIDENT_MOE_LAYERS=0-9 (vLLM's FP8 kernel).
# Prefill runs on the CPU here (--prefill 0 below). GPU prefill streams FP8 experts too (vLLM's FP8
# kernel from sm_89, else dequantized to bf16 on the GPU): put e.g. 1024 there for long prompts.
#
# Usage: bash commands/qwen3_235b_a22b_fp8_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name qwen3-235b-a22b --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
