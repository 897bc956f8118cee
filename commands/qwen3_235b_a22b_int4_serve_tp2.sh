#!/usr/bin/env bash
# Qwen3-235B-A22B, int4 experts (compressed-tensors W4A16), on two GPUs (tensor parallel).
# Assumes: 2 GPUs with >= 16 GB each, >= 16 cores, >= 192 GB RAM (~116 GB of int4 experts, half of
# each expert per rank; the group size must divide moe_intermediate_size/TP).
#
# Usage: bash commands/qwen3_235b_a22b_int4_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
  --tensor-parallel-size 2
  --served-model-name qwen3-235b-a22b
  --max-model-len 32768
  --max-num-seqs 4
  --gpu-memory-utilization 0.92
)
if [ "${LVLLM_DRY_RUN:-0}" = "1" ]; then  # print the command instead (tests/plugin/test_commands.py)
  env | grep -E '^(LVLLM|LK)_' | sort
  printf 'vllm serve %s' "$MODEL"; printf ' %q' "${ARGS[@]}" "$@"; echo
  exit 0
fi
exec vllm serve "$MODEL" "${ARGS[@]}" "$@"
