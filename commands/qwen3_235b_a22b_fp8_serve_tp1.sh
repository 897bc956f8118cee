#!/usr/bin/env bash
# Qwen3-235B-A22B (FP8 block, e.g. Qwen/Qwen3-235B-A22B-FP8) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB (other weights ~8 GB), >= 16 cores, >= 320 GB RAM (94 MoE layers x
# 2.4 GB = ~227 GB of FP8 experts). 48 GB GPU: LVLLM_GPU_RESIDENT_MOE_LAYERS=0-9 (vLLM's FP8 kernel).
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
#
# Usage: bash commands/qwen3_235b_a22b_fp8_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
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
