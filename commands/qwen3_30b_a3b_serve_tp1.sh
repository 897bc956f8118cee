#!/usr/bin/env bash
# Qwen3-30B-A3B (bf16, e.g. Qwen/Qwen3-30B-A3B) on one GPU, routed experts in host RAM.
# Assumes: 1 NVIDIA GPU with >= 24 GB, >= 16 CPU cores, >= 96 GB RAM (experts: ~57 GB bf16 in
# host RAM; GPU: ~4 GB of other weights + 8 resident MoE layers (~9.7 GB) + KV cache).
# Other sizes: 16 GB GPU -> LVLLM_GPU_RESIDENT_MOE_LAYERS=0-1; 48+ GB -> 0-23; no room -> unset it.
# LK_THREADS defaults to the physical cores this process may use, minus 2 (minus 1 below 12 cores).
#
# Usage: bash commands/qwen3_30b_a3b_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="${LVLLM_GPU_PREFILL_MIN_BATCH_SIZE:-1024}"
export LVLLM_GPU_RESIDENT_MOE_LAYERS="${LVLLM_GPU_RESIDENT_MOE_LAYERS:-0-7}"
ARGS=(
  --served-model-name qwen3-30b-a3b
  --max-model-len 32768
  --max-num-seqs 8
  --gpu-memory-utilization 0.90
)
if [ "${LVLLM_DRY_RUN:-0}" = "1" ]; then  # print the command instead (tests/plugin/test_commands.py)
  env | grep -E '^(LVLLM|LK)_' | sort
  printf 'vllm serve %s' "$MODEL"; printf ' %q' "${ARGS[@]}" "$@"; echo
  exit 0
fi
exec vllm serve "$MODEL" "${ARGS[@]}" "$@"
