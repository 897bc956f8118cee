#!/usr/bin/env bash
# GLM-5 (GlmMoeDsaForCausalLM, FP8 block as released: zai-org/GLM-5-FP8) on two GPUs (tensor parallel), routed
# experts in host RAM; MLA + DSA sparse attention and the dense layers on the GPUs.
# Assumes: 2 GPUs with >= 48 GB each, >= 32 cores (each rank's engine gets half of them), >= 768 GB RAM: from
# `lvllm doctor` on the release's shape (75 MoE of 78 layers, a bf16 config with dummy weights) 1350 GiB of bf16
# experts, so ~675 GiB as FP8 (each rank holds half of every expert), and ~25.5 GiB of bf16 GPU weights (about half
# as FP8, split over the ranks). Prefill from 1024 tokens streams the FP8 experts to the GPUs.
# Shown so far: the tiny GLM-5 checkpoint, switch on vs off, CPU and GPU prefill with a resident layer, one H200
# (docs/results/2026-12-03_h200_session20.log, again in 2026-12-03_h200_session21.log); not this script's topology or
# the full model.
#
# Usage: bash commands/glm_5_fp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name glm-5 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 1024 -- "$@"
