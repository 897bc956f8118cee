"""Which rows of a MoE batch are padding that vLLM added to reach a captured CUDA-graph size.

Padded rows carry leftover hidden states that route to real experts; on the CPU path every one
would cost expert reads. vLLM 0.26's V2 model runner marks them (`ForwardContext.is_padding`);
the V1 runner, which most MoE models use in 0.26, does not, but it fills the padded tail of the
slot mapping with -1 (gpu_model_runner._get_slot_mappings). Both are persistent GPU buffers, so
a mask read from them inside a captured graph is right at every replay.
"""
from __future__ import annotations

from typing import Optional

import torch


def padding_rows(ctx, num_tokens: int) -> Optional[torch.Tensor]:
    """Bool [num_tokens] on the GPU, True for padded rows; None when the context cannot tell."""
    if ctx is None:
        return None
    pad = getattr(ctx, "is_padding", None)
    if isinstance(pad, torch.Tensor) and pad.dim() == 1 and pad.shape[0] >= num_tokens:
        return pad[:num_tokens].bool()
    mappings = getattr(ctx, "slot_mapping", None)
    if not isinstance(mappings, dict) or not mappings:
        return None  # no KV cache yet (profile run) or micro-batches (refused elsewhere)
    distinct = {t.data_ptr(): t for t in mappings.values() if isinstance(t, torch.Tensor)}
    if len(distinct) != 1:
        return None  # several KV-cache groups (hybrid attention/Mamba models): no single meaning
    slots = next(iter(distinct.values()))
    if slots.dim() != 1 or slots.shape[0] < num_tokens:
        return None
    return slots[:num_tokens] < 0


def current_padding_rows(num_tokens: int) -> Optional[torch.Tensor]:
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except ImportError:
        return None
    if not is_forward_context_available():
        return None
    return padding_rows(get_forward_context(), num_tokens)


def drop_padding(topk_ids: torch.Tensor, pad: Optional[torch.Tensor]) -> torch.Tensor:
    """Expert ids with every slot of a padded row set to -1 (the engine skips those)."""
    if pad is None:
        return topk_ids
    return topk_ids.masked_fill(pad[:, None], -1)
