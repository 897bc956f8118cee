#!/usr/bin/env bash
# GLM-4.5 / GLM-4.6 (355B-A32B, FP8 block, e.g. zai-org/GLM-4.5-FP8) on two GPUs, experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, >= 448 GB RAM (89 MoE layers x 3.8 GB = ~336 GB of
# FP8 experts). bf16 checkpoints need ~672 GB and may set LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024.
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
#
# Usage: bash commands/glm_4_5_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="${LVLLM_GPU_PREFILL_MIN_BATCH_SIZE:-0}"
ARGS=(
  --tensor-parallel-size 2
  --served-model-name glm-4.5
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
