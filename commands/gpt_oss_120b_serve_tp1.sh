#!/usr/bin/env bash
# gpt-oss-120b (MXFP4 experts, openai/gpt-oss-120b) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 16 GB (other weights ~6 GB + KV cache), >= 16 cores, >= 96 GB RAM (36 layers x
# 1.7 GB = ~61 GB of MXFP4 experts with their scales and biases). 24+ GB GPU:
# LVLLM_GPU_RESIDENT_MOE_LAYERS=0-5 keeps six layers on the GPU with vLLM's MXFP4 kernel.
# Prefill on the CPU here; LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 streams the MXFP4 experts to the GPU
# for long prompts instead (dequantized to bf16 there, biases and swigluoai applied).
#
# Usage: bash commands/gpt_oss_120b_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
  --served-model-name gpt-oss-120b
  --max-model-len 32768
  --max-num-seqs 4
  --gpu-memory-utilization 0.90
)
if [ "${LVLLM_DRY_RUN:-0}" = "1" ]; then  # print the command instead (tests/plugin/test_commands.py)
  env | grep -E '^(LVLLM|LK)_' | sort
  printf 'vllm serve %s' "$MODEL"; printf ' %q' "${ARGS[@]}" "$@"; echo
  exit 0
fi
exec vllm serve "$MODEL" "${ARGS[@]}" "$@"
