#!/usr/bin/env bash
# Kimi-K2-Thinking (1T-A32B, int4 experts in compressed-tensors W4A16, group 32,
# moonshotai/Kimi-K2-Thinking) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 32 GB each, >= 32 cores, >= 768 GB RAM (60 MoE layers x ~9.5 GB = ~570 GB of
# int4 experts with scales). The tokenizer needs --trust-remote-code. Prefill on the CPU here;
# LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 streams the int4 experts to the GPUs for long prompts instead
# (dequantized to bf16 there).
#
# Usage: bash commands/kimi_k2_int4_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
MODEL="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
shift
export LVLLM_MOE_NUMA_ENABLED=1
export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=0
ARGS=(
  --tensor-parallel-size 2
  --trust-remote-code
  --served-model-name kimi-k2
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
