"""What lvllm.autofit plans VRAM with: the KV bytes a token of context takes on one rank (from a model's
config), lvllm's own reserve, and FitError, the message of a model that does not fit.

Order of claims on a rank's usable VRAM (total x vLLM's --gpu-memory-utilization), lvllm.autofit.plan:
  1. the non-expert weights (attention, dense and shared MLPs, embeddings) of this rank;
  2. the runtime's own reserve: CUDA graphs and activations (RESERVE_BYTES, the H200 measured 0.5-1.2
     GiB of graphs for default capture sizes) and, with streamed prefill, the staging ring;
  3. the KV cache for the requested context;
  4. the rest: resident MoE layers and the GPU expert cache.
"""
from __future__ import annotations

from typing import Mapping

GiB = 1 << 30
# CUDA graphs (0.5-1.2 GiB measured on the H200 for vLLM's default capture sizes, sessions 17-19),
# activations of the largest prefill chunk and the allocator's slack.
RESERVE_BYTES = 2 * GiB
# The streamed-prefill staging ring (lvllm.runtime.staging_for: up to 4 slots of 256 MiB).
STAGING_BYTES = 1 * GiB
# Full-context sequences the KV cache is planned for when the request names none: one long request
# and one more at the same time.
DEFAULT_KV_SEQUENCES = 2


class FitError(ValueError):
    """The model does not fit this machine with the requested context; the message says why and what helps."""


def kv_bytes_per_token(cfg: Mapping, context: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token of context takes on one rank, from a Hugging Face config (its text
    config): MLA (kv_lora_rank: one latent of kv_lora_rank + qk_rope_head_dim per layer, the same on
    every rank), else K and V of the rank's KV heads per attention layer. Linear-attention layers keep
    a fixed state (none per token); sliding-window layers hold at most `sliding_window` tokens, so at a
    longer context they count by window / context. An upper bound for attention that compresses its
    cache further (DeepSeek-V4's CSA / HCA entries): those layers count as full ones."""
    layers = int(cfg.get("num_hidden_layers", 0))
    types = list(cfg.get("layer_types") or [])
    if not types and cfg.get("full_attention_interval"):
        n = int(cfg["full_attention_interval"])
        types = ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(layers)]
    types = types or ["full_attention"] * layers
    window = cfg.get("sliding_window")
    weight = 0.0
    for t in types:
        if "linear" in t:
            continue
        if "sliding" in t and window:
            weight += min(1.0, int(window) / max(1, context))
        else:
            weight += 1.0
    if cfg.get("kv_lora_rank"):
        per_layer = (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))) * dtype_bytes
    else:
        heads = int(cfg.get("num_attention_heads", 1))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(1, heads))
        per_rank_heads = max(1, -(-kv_heads // tp))  # fewer KV heads than ranks: each rank keeps one
        per_layer = 2 * per_rank_heads * head_dim * dtype_bytes
    return int(round(weight * per_layer))
