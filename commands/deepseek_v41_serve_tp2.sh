#!/usr/bin/env bash
# DeepSeek-V4.1 (DeepseekV41ForCausalLM as released: MXFP4 routed experts, FP8 block projections, Engram n-gram
# tables) on two GPUs (tensor parallel), routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each, >= 32 cores (each rank's engine gets half of them), >= 384 GB RAM: the
# experts are not duplicated (each rank holds half of every expert: ~72 GiB of the 143.9 GiB `lvllm doctor` counts
# on the release's shape), ~3.7 GiB of GPU weights per rank (estimated), the release's Engram tables (~189 GiB) in
# pinned host RAM, each rank holding its share of their heads (vLLM 0.33's default).
# Shown so far: its layers with the switch on at TP=1 only (docs/results/2026-12-04_h200_session25.log); TP=2 not run.
# Prefill from 1024 tokens streams the experts to the GPUs.
#
# Usage: bash commands/deepseek_v41_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name deepseek-v4.1 --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
