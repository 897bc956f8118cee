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


def test_the_profile_run_gives_the_engine_no_rows():
    from lvllm.padding import engine_ids, in_profile_run, profile_run
    ids = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    assert engine_ids(ids) is ids and not in_profile_run()  # no forward context here: nothing is padding
    with profile_run():
        with profile_run():  # nested (a runner calling another's): still marked
            assert engine_ids(ids).tolist() == [[-1, -1], [-1, -1]]
        assert in_profile_run()
    assert not in_profile_run()


PROFILE_HOOK = r"""
import importlib, sys
from lvllm import padding
from lvllm.plugin import MODEL_RUNNERS
for name in MODEL_RUNNERS:  # imported first: the hook then goes in at register()
    m = importlib.import_module(name)
    def probe(self, randomize_inputs=False):
        return padding.in_profile_run(), randomize_inputs
    m.GPUModelRunner.profile_run = probe
import lvllm.plugin as p
p.register()
for name in MODEL_RUNNERS:
    runner = sys.modules[name].GPUModelRunner
    assert runner.profile_run(None, True) == (True, True), name
    assert not padding.in_profile_run()
print("profile hook ok")
"""


def test_both_runners_profile_run_is_marked():
    """H2 on the pinned vLLM: both model runners' profile_run run inside padding.profile_run()."""
    pytest.importorskip("vllm")
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env.update(LVLLM_MOE_NUMA_ENABLED="1", PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", PROFILE_HOOK], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "profile hook ok" in r.stdout, r.stderr[-3000:]
