#!/usr/bin/env bash
# The shared launcher of commands/<model>_serve_tp<N>.sh: lk_moe's switches and the `vllm serve`
# command line. Each model script names its model, TP size and model-specific flags and calls
# `lvllm_serve`; it can also be run by itself for a model without a script:
#   bash commands/serve.sh --tp 1 --name my-moe --max-num-seqs 4 --gpu-memory-utilization 0.90 \
#     --prefill-default 1024 -- /path/to/checkpoint [extra vllm serve arguments]
# Options (before `--`):
#   --tp N                          tensor-parallel size (1: no --tensor-parallel-size argument)
#   --name NAME                     --served-model-name
#   --max-num-seqs N, --gpu-memory-utilization F, --max-model-len N (default 32768)
#   --flag ARG                      one more vllm serve argument, placed after the TP size (repeatable)
#   --prefill N                     LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=N whatever the environment says
#   --prefill-default N             LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=N unless the environment sets it
#   --resident-default LAYERS       LVLLM_GPU_RESIDENT_MOE_LAYERS=LAYERS unless the environment sets it
# After `--`: the checkpoint path, then extra vllm serve arguments (appended last).
# LVLLM_DRY_RUN=1 prints the LVLLM_/LK_ environment and the command instead of running it
# (tests/plugin/test_commands.py reads that).

lvllm_serve() {
  local tp=1 name="" seqs="" gpu_mem="" max_len=32768 flags=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --tp) tp="$2"; shift 2 ;;
      --name) name="$2"; shift 2 ;;
      --max-num-seqs) seqs="$2"; shift 2 ;;
      --gpu-memory-utilization) gpu_mem="$2"; shift 2 ;;
      --max-model-len) max_len="$2"; shift 2 ;;
      --flag) flags+=("$2"); shift 2 ;;
      --prefill) export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="$2"; shift 2 ;;
      --prefill-default)
        export LVLLM_GPU_PREFILL_MIN_BATCH_SIZE="${LVLLM_GPU_PREFILL_MIN_BATCH_SIZE:-$2}"; shift 2 ;;
      --resident-default)
        export LVLLM_GPU_RESIDENT_MOE_LAYERS="${LVLLM_GPU_RESIDENT_MOE_LAYERS:-$2}"; shift 2 ;;
      --) shift; break ;;
      *) echo "lvllm_serve: unknown option $1 (see commands/serve.sh)" >&2; return 2 ;;
    esac
  done
  local model="${1:?usage: bash $0 /path/to/checkpoint [extra vllm serve arguments]}"
  shift
  export LVLLM_MOE_NUMA_ENABLED=1
  local args=()
  if [ "$tp" != 1 ]; then args+=(--tensor-parallel-size "$tp"); fi
  args+=(${flags[@]+"${flags[@]}"})
  if [ -n "$name" ]; then args+=(--served-model-name "$name"); fi
  args+=(--max-model-len "$max_len")
  if [ -n "$seqs" ]; then args+=(--max-num-seqs "$seqs"); fi
  if [ -n "$gpu_mem" ]; then args+=(--gpu-memory-utilization "$gpu_mem"); fi
  if [ "${LVLLM_DRY_RUN:-0}" = "1" ]; then
    env | grep -E '^(LVLLM|LK)_' | sort
    printf 'vllm serve %s' "$model"; printf ' %q' "${args[@]}" "$@"; echo
    exit 0
  fi
  exec vllm serve "$model" "${args[@]}" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run by itself, not sourced by a model script
  set -euo pipefail
  lvllm_serve "$@"
fi
