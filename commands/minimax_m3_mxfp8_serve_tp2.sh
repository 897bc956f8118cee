#!/usr/bin/env bash
# MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration, its MXFP8 release) on two GPUs, routed experts in host RAM.
# Assumes: 2 GPUs with >= 24 GB each (~10 GiB of non-expert bf16 weights a rank, estimated from the release config;
# `lvllm doctor` prints it), >= 32 cores, >= 480 GB RAM: 57 MoE layers x 128 experts of 6144 x 3072 hold ~426 GB as
# MXFP8 (e4m3 codes + one e8m0 scale per 32 weights: 33/32 bytes a weight; bf16 would be ~826 GB).
# Add --language-model-only to leave the vision tower out (text only, less GPU memory). Prefill from 1024 tokens
# streams the MXFP8 experts to the GPUs (dequantized to bf16 there: no MXFP8 kernel below sm_100).
# Shown so far (tiny checkpoints in the release layout, one H100): switch on vs off, CPU prefill, GPU prefill +
# resident, MTP drafts (docs/results/2026-12-05_h100_session35.log); the MXFP8 experts against their bf16 twin with
# CPU prefill and with streamed GPU prefill + resident (2026-12-06_h100_session39.log). Not run at full size.
#
# Usage: bash commands/minimax_m3_mxfp8_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name minimax-m3 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 1024 -- "$@"
