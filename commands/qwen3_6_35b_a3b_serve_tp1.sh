#!/usr/bin/env bash
# Qwen3.6-35B-A3B (and Qwen3.5-35B-A3B: the same architecture and model_type, Qwen3_5MoeForConditionalGeneration;
# Gated-DeltaNet + gated attention, a gated shared expert) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB, >= 16 cores, >= 80 GB RAM: 40 MoE layers x 256 experts of 2048 x 512 hold ~64 GB in
# bf16 (~32 GB as FP8 block). 8 small experts per token: few bytes per token, so per-step overheads weigh more
# than on the bigger models. Add --language-model-only to leave the vision tower out. Prompts of >= 2048 tokens
# stream the experts to the GPU; LVLLM_GPU_PREFILL_MIN_BATCH_SIZE changes that (0: CPU prefill).
# Shown so far (Qwen3.5-MoE tiny checkpoints, text and release layouts): switch on vs off, CPU prefill, GPU prefill +
# resident (docs/results/2026-12-03_h200_session21.log), MTP drafts (2026-12-05_h100_session34.log). Not run at
# full size.
#
# Usage: bash commands/qwen3_6_35b_a3b_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name qwen3.6-35b-a3b --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 2048 -- "$@"
