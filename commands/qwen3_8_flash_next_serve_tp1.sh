#!/usr/bin/env bash
# Qwen3.8-Flash-Next (vLLM 0.33's Qwen4ExpForCausalLM: Gated-DeltaNet + sparse-indexer attention, hyper-connections,
# per-layer n-gram embedding (PLE) tables) on one GPU, routed experts in host RAM.
# Assumes: 1 GPU with >= 24 GB, >= 16 cores, and host RAM for the experts and the PLE tables, which vLLM keeps in
# pinned host RAM by default: from `lvllm doctor` on the release's shape (40 MoE layers, a config with dummy
# weights) 150 GiB of bf16 experts, 47.7 GiB of tables and ~4.3 GiB of GPU weights (estimated), so >= 256 GB RAM
# for bf16 experts and >= 160 GB for FP8 ones (8-bit: half the expert bytes; NVFP4: a quarter).
# Shown so far: its tiny checkpoints (text and vision-language layouts) switch on vs off, CPU prefill and GPU prefill +
# resident (H100, docs/results/2026-12-06_h100_session39.log), MTP drafts (2026-12-05_h100_session34.log); the release
# shape with 12 of its MoE layers (bf16 experts, dummy weights): 0.88 of the host-bandwidth bound at 1 request (s39).
# Prefill from 1024 tokens streams the experts to the GPU.
#
# Usage: bash commands/qwen3_8_flash_next_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name qwen3.8-flash-next --max-num-seqs 4 --gpu-memory-utilization 0.90 --prefill-default 1024 -- "$@"
