"""`vllm serve` with the switch on: an OpenAI chat request and a streaming one return text."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from .test_switch import ROOT, pytestmark  # noqa: F401  (same skip conditions: GPU + vLLM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, stream=False):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def test_serve_chat_and_stream(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from make_tiny_checkpoint import make_checkpoint
    model = make_checkpoint("qwen3_moe", str(tmp_path / "qwen3"))
    port = _free_port()
    env = dict(os.environ, LVLLM_MOE_NUMA_ENABLED="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
                               "--port", str(port), "--max-model-len", "2048", "--max-num-seqs", "4",
                               "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail("vllm serve did not come up:\n" + open(tmp_path / "serve.log").read()[-5000:])
            time.sleep(2)
        msgs = [{"role": "user", "content": "Tell me about the mixture of experts and host memory."}]
        r = json.load(_post(base + "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 24,
                                                            "temperature": 0}))
        text = r["choices"][0]["message"]["content"]
        print(f"[serve] chat completion: {text!r} usage {r['usage']}")
        assert isinstance(text, str) and text and r["usage"]["completion_tokens"] > 0
        chunks, done = [], False
        with _post(base + "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 24,
                                                   "temperature": 0, "stream": True}) as resp:
            for line in resp:
                line = line.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    chunks.append(delta.get("content") or "")
        print(f"[serve] streamed {len(chunks)} chunks: {''.join(chunks)!r}")
        assert done and len([c for c in chunks if c]) >= 2
        assert "".join(chunks) == text  # greedy: the stream spells the same answer
        log.flush()
        assert "lk_moe: hybrid MoE layers" in open(tmp_path / "serve.log").read()
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
