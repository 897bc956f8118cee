#!/usr/bin/env bash
# DeepSeek-V3 / DeepSeek-R1 (FP8 block, e.g. deepseek-ai/DeepSeek-V3) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 48 GB (other weights ~22 GB + KV cache), >= 32 CPU cores, >= 768 GB RAM
# (58 MoE layers x 11.3 GB = ~654 GB of FP8 experts). 80 GB GPU: LVLLM_GPU_RESIDENT_MOE_LAYERS=3-5
# keeps three layers (11.3 GB each) on the GPU with vLLM's FP8 kernel.
# FP8 experts run on the CPU for prefill too (GPU prefill of quantized experts is not in this release).
# Two sockets: one engine spans both NUMA nodes (each node holds a slice of every expert).
#
# Usage: bash commands/deepseek_v3_fp8_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
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
