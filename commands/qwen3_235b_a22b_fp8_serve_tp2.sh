#!/usr/bin/env bash
# Qwen3-235B-A22B (FP8 block) on two GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 16 GB each, >= 16 cores, >= 320 GB RAM (~227 GB of FP8 experts, half of each
# expert per rank; FP8 blocks of 128 need moe_intermediate_size/TP divisible by 128: TP <= 4).
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
#
# Usage: bash commands/qwen3_235b_a22b_fp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
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
