#!/usr/bin/env bash
# Qwen3-Next-80B-A3B (FP8 block, Qwen/Qwen3-Next-80B-A3B-Instruct-FP8; Gated-DeltaNet attention, a gated
# shared expert) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB, >= 16 cores, >= 96 GB RAM (48 MoE layers x 512 experts: ~77 GB of FP8
# experts). 10 small experts per token: few bytes per token, so per-step overheads weigh more than on
# the bigger models. Prompts of >= 2048 tokens stream the FP8 experts to the GPU (vLLM's FP8 kernel from
# sm_89, else dequantized to bf16); LVLLM_GPU_PREFILL_MIN_BATCH_SIZE changes that (0: CPU prefill).
# Shown so far: its tiny checkpoint switch on vs off, CPU prefill and GPU prefill + resident (H200,
# docs/results/2026-12-03_h200_session21.log); the release shape in FP8 with dummy weights, 32 of 48 layers, one H100:
# 66.4 tok/s at 1 request = 0.73 of the host-bandwidth bound, 3.32 GiB of GPU weights (2026-12-06_h100_session37.log).
#
# Usage: bash commands/qwen3_next_80b_fp8_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name qwen3-next-80b --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 2048 -- "$@"
