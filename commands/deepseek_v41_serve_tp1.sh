#!/usr/bin/env bash
# DeepSeek-V4.1 (DeepseekV41ForCausalLM as released: MXFP4 routed experts, FP8 block projections, Engram n-gram
# tables) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 48 GB, >= 16 cores, >= 384 GB RAM. From `lvllm doctor` on the release's shape (43 MoE
# layers, a config with dummy weights): 137.1 GiB of MXFP4 experts (143.9 GiB in the engine), ~7.3 GiB of GPU
# weights (estimated from the config), ~86 KB of KV cache per token (a 32K context takes ~2.7 GiB); on top, the
# release's Engram tables (~189 GiB) in pinned host RAM (vLLM 0.33's default; that config scales them down to
# 7.9 GiB, doctor on the real checkpoint counts its own). A 24 GB GPU: add --max-model-len 16384. Prefill from 1024
# tokens streams the MXFP4 experts to the GPU; shorter prompts run on the CPU.
# Shown so far: 10 of its layers on V4-Flash's backbone with the switch on, one H200 (docs/results/
# 2026-12-04_h200_session25.log: it starts and decodes); not this script's full model.
# The first start on a machine compiles vLLM's TileLang and DeepGEMM kernels for minutes; later starts reuse them.
#
# Usage: bash commands/deepseek_v41_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name deepseek-v4.1 --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
