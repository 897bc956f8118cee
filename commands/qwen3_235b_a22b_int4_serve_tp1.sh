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
