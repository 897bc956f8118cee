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
