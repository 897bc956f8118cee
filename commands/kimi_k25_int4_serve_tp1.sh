#!/usr/bin/env bash
# Kimi-K2.5 / K2.6 (KimiK25ForConditionalGeneration as released: int4 experts in compressed-tensors W4A16,
# group 32, beside a MoonViT vision tower) on one GPU, routed experts in host RAM; the vision tower, MLA attention,
# dense and shared experts on the GPU. vLLM 0.33 reads its config and media processor itself (no --trust-remote-code).
# Assumes: 1 GPU with >= 48 GB (`lvllm doctor` estimates ~28 GiB of non-expert weights from the release's config;
# it prints the real figure), >= 32 cores, >= 640 GB RAM (60 MoE layers x ~9.5 GB = ~570 GB of int4 experts with
# scales, as Kimi-K2-Thinking). Prefill on the CPU by default here (streaming ~570 GB of experts per long prompt
# over PCIe costs more); LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=1024 streams them instead.
# Shown so far: tiny Kimi-K2.5 checkpoints (bf16 and int4) switch on vs off on one H200; not the full model.
#
# Usage: bash commands/kimi_k25_int4_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name kimi-k2.5 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 0 -- "$@"
