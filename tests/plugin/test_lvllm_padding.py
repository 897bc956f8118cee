"""Padded rows of a captured batch: found from vLLM's forward context, dropped from the routing."""
from types import SimpleNamespace

import pytest
import torch

from lvllm.padding import drop_padding, padding_rows


def test_the_runner_marks_padding():
    ctx = SimpleNamespace(is_padding=torch.tensor([False, False, True, True, True]))
    assert padding_rows(ctx, 4).tolist() == [False, False, True, True]


def test_unknown_when_the_context_does_not_say():
    assert padding_rows(None, 4) is None
    assert padding_rows(SimpleNamespace(is_padding=None), 4) is None
    assert padding_rows(SimpleNamespace(is_padding=torch.tensor([False])), 4) is None  # shorter than the batch


def test_padded_rows_route_nowhere():
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32)
    out = drop_padding(ids, torch.tensor([False, True, False]))
    assert out.tolist() == [[1, 2], [-1, -1], [5, 6]] and out.dtype == torch.int32
    assert drop_padding(ids, None) is ids


def test_the_pinned_vllm_marks_padding_in_both_runners():
    """What padding_rows relies on, read from the installed vLLM: the forward context field, and that
    the V1 runner fills it (the V2 runner's input buffers carry it too)."""
    pytest.importorskip("vllm")
    import inspect

    from vllm.forward_context import ForwardContext
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu import input_batch
    assert "is_padding" in ForwardContext.__dataclass_fields__
    assert "is_padding=is_padding" in inspect.getsource(gpu_model_runner.GPUModelRunner)
    assert "is_padding" in inspect.getsource(input_batch.InputBuffers)
