"""Which rows of a MoE batch are no real tokens: padding vLLM added to reach a captured CUDA-graph
size, and every row of its memory-profile run.

Padded rows carry leftover hidden states that route to real experts; on the CPU path every one
would cost expert reads. vLLM 0.33 marks them in both model runners (`ForwardContext.is_padding`,
a persistent GPU bool buffer refreshed before every step, so a mask read from it inside a captured
graph is right at every replay), for every model, however many KV-cache groups it has. Its
warm-up, capture and sampler warm-up runs mark every row as padding. Its profile run marks none:
it measures the GPU memory of the largest batch, which the streamed GPU-prefill path needs
measured, while on the CPU path those rows would only cost minutes of expert reads at startup
(8192 rows through every layer). The plugin wraps both runners' `profile_run` in `profile_run()`
below, and the CPU path then gets no expert ids for it; the GPU path runs as it would.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

_profile_runs = 0  # > 0 while a model runner of this process runs vLLM's profile run


@contextlib.contextmanager
def profile_run():
    global _profile_runs
    _profile_runs += 1
    try:
        yield
    finally:
        _profile_runs -= 1


def in_profile_run() -> bool:
    return _profile_runs > 0


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


def engine_ids(topk_ids: torch.Tensor) -> torch.Tensor:
    """The expert ids the CPU engine gets: -1 in every slot of a row that is no real token (all of
    them during the profile run), so those rows cost no expert reads."""
    if in_profile_run():
        return torch.full_like(topk_ids, -1)
    return drop_padding(topk_ids, current_padding_rows(topk_ids.shape[0]))
