#!/usr/bin/env bash
# Qwen3-235B-A22B, int4 experts (compressed-tensors W4A16), on two GPUs (tensor parallel).
# Assumes: 2 GPUs with >= 16 GB each, >= 16 cores, >= 192 GB RAM (~116 GB of int4 experts, half of
# each expert per rank; the group size must divide moe_intermediate_size/TP).
#
# Usage: bash commands/qwen3_235b_a22b_int4_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name qwen3-235b-a22b --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
