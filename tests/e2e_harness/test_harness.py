"""What tests/e2e/generate.py's explicit shutdown relies on in vLLM 0.33.0 (it runs only on a GPU, so a
vLLM that moved these would otherwise show up as e2e runs that hang or abort at exit)."""
import inspect

import pytest

core_client = pytest.importorskip("vllm.v1.engine.core_client")


def test_front_end_client_can_be_shut_down():
    from vllm.v1.engine.llm_engine import LLMEngine
    assert "self.engine_core = " in inspect.getsource(LLMEngine.__init__)
    for client in (core_client.SyncMPClient, core_client.InprocClient):
        assert callable(getattr(client, "shutdown", None)), client


def test_daemon_thread_names_generate_py_joins():
    from tests.e2e.generate import FRONT_END_THREADS
    src = inspect.getsource(core_client)
    for name in FRONT_END_THREADS:
        assert f'name="{name}"' in src, name


def test_prompts_repeat_a_run_when_asked_and_stay_the_same_otherwise():
    """generate.py's prompts: --prompt-period repeats a random run (n-gram drafts find matches); without it the same
    seeded random prompts as before (the e2e suites' saved runs and the teacher-forced prompts stay comparable)."""
    import random

    from tests.e2e.generate import prompts
    rng = random.Random(0)
    ids = [i for i in range(100) if i not in {0, 1, 2}]
    assert prompts(100, [7, 3]) == [[rng.choice(ids) for _ in range(n)] for n in (7, 3)]
    p = prompts(100, [40, 5], period=16)[0]
    assert p[:16] == p[16:32] == prompts(100, [16])[0] and p[32:] == p[:8] and len(p) == 40
