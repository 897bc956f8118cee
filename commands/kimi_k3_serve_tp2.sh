#!/usr/bin/env bash
# Kimi-K3 (KimiK3ForConditionalGeneration as released: compressed-tensors MXFP4 routed experts) on two GPUs
# (tensor parallel), routed experts in host RAM; the vision tower, attention (KDA and MLA) and shared experts on
# the GPUs.
# Assumes: 2 GPUs with >= 48 GB each, >= 32 cores (each rank's engine gets half of them), and host RAM for the
# experts: 15.7 GB of MXFP4 experts a MoE layer (896 experts of a 3584-wide latent x 3072, the shapes vLLM
# 0.33's own Kimi-K3 kernels state); with Kimi-K2's 60 MoE layers that is ~940 GB, so >= 1.1 TB of RAM (the
# layer count is not in vLLM's code: `lvllm doctor` reads the real config). Each rank holds half of every expert.
# Shown so far: the tiny Kimi-K3 with the switch on on one H200 (docs/results/2026-12-04_h200_session27.log);
# not this script's topology. Prefill from 1024 tokens streams the experts to the GPUs.
#
# Usage: bash commands/kimi_k3_serve_tp2.sh /path/to/checkpoint [extra vllm serve arguments]
# Check the machine first: lvllm doctor --model /path/to/checkpoint --tp 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
lvllm_serve --tp 2 --name kimi-k3 --max-num-seqs 4 --gpu-memory-utilization 0.92 --prefill-default 1024 -- "$@"
