#!/usr/bin/env bash
# DeepSeek-V4-Flash (deepseek-ai/DeepSeek-V4-Flash as released: MXFP4 routed experts, FP8 block projections) on one
# GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 48 GB, >= 16 cores, >= 192 GB RAM. Measured on the H200 machine with 20 of its 43 layers
# (dummy weights, docs/results/2026-12-04_h200_session24.log): 3.19 GiB of MXFP4 experts per layer in host RAM (all
# 43: ~137 GiB), 6.18 GiB of GPU weights (all 43: ~8 GiB, estimated), and vLLM 0.33 reserving ~8.5 KB of KV cache
# per token and layer (~370 KB per token for 43 layers: a 32K context takes ~12 GB). A 24 GB GPU: add
# --max-model-len 16384. Prefill from 1024 tokens streams the MXFP4 experts to the GPU (TTFT of an 8K prompt
# 2.4 s with 20 layers there); shorter prompts run on the CPU.
# The first start on a machine compiles vLLM's TileLang and DeepGEMM kernels for minutes; later starts reuse them.
#
# Usage: bash commands/deepseek_v4_flash_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name deepseek-v4-flash --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
