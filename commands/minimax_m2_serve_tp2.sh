#!/usr/bin/env bash
# MiniMax-M2 (230B-A10B, FP8 block, MiniMaxAI/MiniMax-M2) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, >= 320 GB RAM (62 MoE layers x 3.6 GB = ~224 GB of
# FP8 experts). lk_moe never masks NaNs (no nan_to_num): a fault shows instead of being hidden.
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
#
# Usage: bash commands/minimax_m2_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
  --tensor-parallel-size 2
  --served-model-name minimax-m2
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
