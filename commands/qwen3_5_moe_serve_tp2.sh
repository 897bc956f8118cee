#!/usr/bin/env bash
# Qwen3.5 MoE (hybrid Gated-DeltaNet attention; bf16 or FP8 block) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores, host RAM of at least the checkpoint's expert bytes
# plus 10% (`lvllm doctor --model` prints them). bf16 checkpoints may set
# LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 to prefill long prompts on the GPUs.
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
#
# Usage: bash commands/qwen3_5_moe_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="${LVLLM_GPU_PREFILL_MIN_BATCH_SIZE:-0}"
ARGS=(
  --tensor-parallel-size 2
  --served-model-name qwen3.5-moe
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
