#!/usr/bin/env bash
# GLM-5.3 (Glm5NextForCausalLM: Kimi Delta Attention + indexed sparse MLA, mHC residual streams) on one GPU,
# routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB, >= 16 cores, and for FP8 block experts >= 320 GB RAM (bf16: >= 640 GB): from
# `lvllm doctor` on the release's shape (42 MoE of 45 layers, a bf16 config with dummy weights) 567 GiB of bf16
# experts (~284 GiB as FP8) and ~8 GiB of bf16 GPU weights (estimated). Prefill from 1024 tokens streams the
# experts to the GPU.
# Shown so far: its tiny checkpoints (text-only and the release layout) switch on vs off, CPU prefill, GPU prefill +
# resident, MTP drafts in the release layout (one H100, docs/results/2026-12-06_h100_session36.log); the release shape
# in FP8 with dummy weights, 9 of 45 layers: 60.0 tok/s at 1 request = 0.85 of the host-bandwidth bound, 6.59 GiB of
# GPU weights against stock's 46.15 (2026-12-06_h100_session37.log). Not the full model.
#
# Usage: bash commands/glm_5_3_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name glm-5.3 --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
