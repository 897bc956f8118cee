"""Padded rows of a captured batch: found from vLLM's forward context, dropped from the routing."""
from types import SimpleNamespace

import torch

from lvllm.padding import drop_padding, padding_rows


def test_v2_runner_marks_padding():
    ctx = SimpleNamespace(is_padding=torch.tensor([False, False, True, True, True]), slot_mapping={})
    assert padding_rows(ctx, 4).tolist() == [False, False, True, True]


def test_v1_runner_slot_mapping_tail_is_minus_one():
    slots = torch.tensor([17, 3, 250, -1, -1, -1])
    ctx = SimpleNamespace(is_padding=None, slot_mapping={"model.layers.0.self_attn.attn": slots,
                                                         "model.layers.1.self_attn.attn": slots})
    assert padding_rows(ctx, 4).tolist() == [False, False, False, True]


def test_unknown_when_the_context_cannot_tell():
    assert padding_rows(None, 4) is None
    assert padding_rows(SimpleNamespace(is_padding=None, slot_mapping=None), 4) is None  # profile run
    two_groups = {"a": torch.tensor([1, -1]), "b": torch.tensor([-1, 2])}  # hybrid models
    assert padding_rows(SimpleNamespace(is_padding=None, slot_mapping=two_groups), 2) is None
    short = {"a": torch.tensor([1])}
    assert padding_rows(SimpleNamespace(is_padding=None, slot_mapping=short), 4) is None


def test_padded_rows_route_nowhere():
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32)
    out = drop_padding(ids, torch.tensor([False, True, False]))
    assert out.tolist() == [[1, 2], [-1, -1], [5, 6]] and out.dtype == torch.int32
    assert drop_padding(ids, None) is ids
