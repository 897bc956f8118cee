"""Which rows of a MoE batch are padding that vLLM added to reach a captured CUDA-graph size.

Padded rows carry leftover hidden states that route to real experts; on the CPU path every one
would cost expert reads. vLLM 0.33 marks them in both model runners (`ForwardContext.is_padding`,
a persistent GPU bool buffer refreshed before every step, so a mask read from it inside a captured
graph is right at every replay). Its warm-up and capture runs mark every row as padding; its
profile run marks none (that run sizes the GPU prefill path at the largest batch).
"""
from __future__ import annotations

from typing import Optional

import torch


def padding_rows(ctx, num_tokens: int) -> Optional[torch.Tensor]:
    """Bool [num_tokens] on the GPU, True for padded rows; None when the context does not say."""
    pad = getattr(ctx, "is_padding", None)
    if isinstance(pad, torch.Tensor) and pad.dim() == 1 and pad.shape[0] >= num_tokens:
        return pad[:num_tokens].bool()
    return None


def current_padding_rows(num_tokens: int) -> Optional[torch.Tensor]:
    from vllm.forward_context import get_forward_context, is_forward_context_available
    if not is_forward_context_available():
        return None
    return padding_rows(get_forward_context(), num_tokens)


def drop_padding(topk_ids: torch.Tensor, pad: Optional[torch.Tensor]) -> torch.Tensor:
    """Expert ids with every slot of a padded row set to -1 (the engine skips those)."""
    if pad is None:
        return topk_ids
    return topk_ids.masked_fill(pad[:, None], -1)
