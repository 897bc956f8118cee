#!/usr/bin/env bash
# DeepSeek-V3 / DeepSeek-R1 (FP8 block) on two GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 CPU cores (each rank's engine gets half of them),
# >= 768 GB RAM (~654 GB of FP8 experts, split between the ranks: each holds half of every expert).
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
# Two sockets with one GPU each: add --numa-bind so each rank stays on its GPU's node.
#
# Usage: bash commands/deepseek_v3_fp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
  --tensor-parallel-size 2
  --served-model-name deepseek-v3
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
