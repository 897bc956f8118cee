#!/usr/bin/env bash
# Kimi-K3 (KimiK3ForConditionalGeneration as released: compressed-tensors MXFP4 routed experts) on one GPU, routed
# experts in host RAM; the vision tower, attention (KDA and MLA) and shared experts on the GPU.
# Assumes: 1 GPU with >= 24 GB (`lvllm doctor` estimates ~8 GiB of non-expert weights from the text shapes vLLM
# 0.33's own Kimi-K3 kernels state; it prints the real figure), >= 32 cores, and host RAM for the experts: 15.7 GB
# of MXFP4 experts a MoE layer (896 experts of a 3584-wide latent x 3072); with Kimi-K2's 60 MoE layers that is
# ~940 GB, so >= 1.1 TB of RAM (the layer count is not in vLLM's code: `lvllm doctor` reads the real config).
# Shown so far: the tiny Kimi-K3 with the switch on on one H200 (docs/results/2026-12-04_h200_session27.log); not the
# full model. Prefill from 1024 tokens streams the experts to the GPU.
#
# Usage: bash commands/kimi_k3_serve_tp1.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 1 --name kimi-k3 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 1024 -- "$@"
