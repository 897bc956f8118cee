#!/usr/bin/env bash
# DeepSeek-V4-Flash (deepseek-ai/DeepSeek-V4-Flash as released: MXFP4 routed experts, FP8 block projections) on two
# GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores (each rank's engine gets half of them), >= 192 GB RAM: the
# ~137 GiB of MXFP4 experts of all 43 layers (3.19 GiB a layer, measured with 20 layers on one H200:
# docs/results/2026-12-04_h200_session27.log) are split between the ranks, each holding half of every expert.
# GPU weights ~8 GiB in all (estimated from the 20-layer run's 6.18 GiB), split between the GPUs, leave room for
# a 32K context on 24 GB cards. Prefill from 1024 tokens streams the experts to the GPUs; shorter prompts run on
# the CPU. Two sockets with one GPU each: add --numa-bind so each rank stays on its GPU's node.
# TP=2 has not been run with this model (no two-GPU machine lent since the fifth session).
# The first start on a machine compiles vLLM's TileLang and DeepGEMM kernels for minutes; later starts reuse them.
#
# Usage: bash commands/deepseek_v4_flash_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name deepseek-v4-flash --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
