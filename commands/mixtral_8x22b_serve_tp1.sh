#!/usr/bin/env bash
# Mixtral-8x22B (bf16, e.g. mistralai/Mixtral-8x22B-Instruct-v0.1) on one GPU, experts in host RAM.
# Assumes: 1 GPU with >= 24 GB (other weights ~6 GB), >= 16 cores, >= 384 GB RAM (56 layers x 4.8 GB =
# ~270 GB of bf16 experts). Long prompts prefill on the GPU (experts streamed, ~4.8 GB a layer):
# lower LVLLM_GPU_PREFILL_MIN_BATCH_SIZE on fast PCIe, raise it on slow links.
#
# Usage: bash commands/mixtral_8x22b_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="${LVLLM_GPU_PREFILL_MIN_BATCH_SIZE:-2048}"
ARGS=(
  --served-model-name mixtral-8x22b
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
