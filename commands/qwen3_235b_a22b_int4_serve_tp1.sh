#!/usr/bin/env bash
# Qwen3-235B-A22B, int4 experts in compressed-tensors W4A16 (pack-quantized) format, on one GPU.
# Assumes: 1 GPU with >= 24 GB, >= 16 cores, >= 192 GB RAM (~116 GB of int4 experts with group scales).
# GPTQ/AWQ-format int4 checkpoints are not read by this release (startup says so); use a
# compressed-tensors W4A16 one. Prefill on the CPU here; LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024
# streams the int4 experts to the GPU for long prompts instead (dequantized to bf16 there).
#
# Usage: bash commands/qwen3_235b_a22b_int4_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name qwen3-235b-a22b --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
