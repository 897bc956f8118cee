#!/usr/bin/env bash
# DeepSeek-V3 / DeepSeek-R1 (FP8 block, e.g. deepseek-ai/DeepSeek-V3) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 48 GB (other weights ~22 GB + KV cache), >= 32 CPU cores, >= 768 GB RAM
# (58 MoE layers x 11.3 GB = ~654 GB of FP8 experts). 80 GB GPU: LVLLM_GPU_RESIDENT_MOE_LAYERS=3-5
# keeps three layers (11.3 GB each) on the GPU with vLLM's FP8 kernel.
# Prefill runs on the CPU here (--prefill 0 below). GPU prefill streams FP8 experts too (vLLM's FP8
# kernel from sm_89, else dequantized to bf16 on the GPU): put e.g. 1024 there for long prompts.
# Two sockets: one engine spans both NUMA nodes (each node holds a slice of every expert).
#
# Usage: bash commands/deepseek_v3_fp8_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name deepseek-v3 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
