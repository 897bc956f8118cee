#!/usr/bin/env bash
# Kimi-K2.5 / K2.6 (KimiK25ForConditionalGeneration as released: int4 experts in compressed-tensors W4A16,
# group 32, beside a MoonViT vision tower) on two GPUs (tensor parallel), routed experts in host RAM; the vision
# tower on the GPUs. vLLM 0.33 reads its config and media processor itself (no --trust-remote-code).
# Assumes: 2 GPUs with >= 32 GB each, >= 32 cores (each rank's engine gets half of them), >= 768 GB RAM (60 MoE
# layers x ~9.5 GB = ~570 GB of int4 experts with scales, as Kimi-K2-Thinking; each rank holds half of every
# expert). Prefill on the CPU here; LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 streams the int4 experts to the GPUs for
# long prompts instead. Shown so far: tiny Kimi-K2.5 checkpoints (bf16 and int4) switch on vs off on one H200.
#
# Usage: bash commands/kimi_k25_int4_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name kimi-k2.5 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill 0 -- "$@"
