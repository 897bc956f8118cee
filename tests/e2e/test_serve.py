"""`vllm serve` with the switch on: an OpenAI chat request and a streaming one return text."""
from __future__ import annotations

import pytest

from lvllm.cli.demo_serve import chat, chat_stream, free_port, start_server, wait_healthy
from lvllm.testing.tiny_checkpoint import make_checkpoint

from .test_switch import pytestmark  # noqa: F401  (same skip conditions: GPU + vLLM)


def test_serve_chat_and_stream(tmp_path):
    model = make_checkpoint("qwen3_moe", str(tmp_path / "qwen3"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server = start_server(model, port, log)
        try:
            if not wait_healthy(base, server):
                log.flush()
                pytest.fail("vllm serve did not come up:\n" + log_path.read_text()[-5000:])
            msgs = [{"role": "user", "content": "Tell me about the mixture of experts and host memory."}]
            r = chat(base, msgs)
            text = r["choices"][0]["message"]["content"]
            print(f"[serve] chat completion: {text!r} usage {r['usage']}")
            assert isinstance(text, str) and text and r["usage"]["completion_tokens"] > 0
            chunks = list(chat_stream(base, msgs))
            print(f"[serve] streamed {len(chunks)} chunks: {''.join(chunks)!r}")
            assert len([c for c in chunks if c]) >= 2
            assert "".join(chunks) == text  # greedy: the stream spells the same answer
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except Exception:
                server.kill()
    assert "lk_moe: hybrid MoE layers" in log_path.read_text()
