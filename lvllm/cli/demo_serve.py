"""The built-in demo (README main job, `bash commands/demo_tiny_serve_tp1.sh`).

On a machine with an NVIDIA GPU and vLLM 0.33.0: write a tiny Qwen3-MoE checkpoint (random
weights, so the answer is gibberish), `vllm serve` it with lk_moe switched on, send one chat
request, print the answer and the plugin's startup summary, stop the server.
Without a GPU (or without vLLM): say so, and run the CPU engine demo (lk_moe.demo).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator, Optional

from .. import pins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log, extra_env: Optional[dict] = None, args=()) -> subprocess.Popen:
    env = dict(os.environ, LVLLM_MOE_NUMA_ENABLED="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port", str(port),
           "--max-model-len", "2048", "--max-num-seqs", "4", "--gpu-memory-utilization", "0.3",
           "--served-model-name", "tiny", *args]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(base: str, server: subprocess.Popen, timeout: float = 600) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            return False
        try:
            if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                return True
        except OSError:
            pass
        time.sleep(2)
    return False


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def chat(base: str, messages, max_tokens: int = 24) -> dict:
    return json.load(_post(base + "/v1/chat/completions", {"model": "tiny", "messages": messages,
                                                           "max_tokens": max_tokens, "temperature": 0}))


def chat_stream(base: str, messages, max_tokens: int = 24) -> Iterator[str]:
    """Yields the content deltas; ends after the server's [DONE]."""
    with _post(base + "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                                               "temperature": 0, "stream": True}) as resp:
        for line in resp:
            line = line.decode().strip()
            if line == "data: [DONE]":
                return
            if line.startswith("data: "):
                yield json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    raise RuntimeError("the stream ended without [DONE]")


def _why_no_serving() -> Optional[str]:
    try:
        import torch
        if not torch.cuda.is_available():
            return "No NVIDIA GPU found"
    except ImportError:
        return "torch is not installed"
    try:
        import vllm
    except ImportError:
        return f"vLLM is not installed (pip install vllm=={pins.VLLM})"
    if vllm.__version__ != pins.VLLM:
        return f"vLLM {vllm.__version__} is installed; lvllm needs {pins.VLLM}"
    return None


def main() -> int:
    why = _why_no_serving()
    if why:
        from lk_moe import demo
        return demo.main([], why_not_serving=why)
    from ..testing.tiny_checkpoint import make_checkpoint
    cache = os.path.join(os.path.expanduser("~"), ".cache", "lvllm", "demo-qwen3-moe")
    model = make_checkpoint("qwen3_moe", cache)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(cache, "serve.log")
    print(f"Serving a tiny Qwen3-MoE checkpoint ({model}) with lk_moe on; log: {log_path}", flush=True)
    with open(log_path, "w") as log:
        server = start_server(model, port, log)
        try:
            if not wait_healthy(base, server):
                log.flush()
                print(open(log_path).read()[-4000:])
                print("vllm serve did not come up (log above)")
                return 1
            msgs = [{"role": "user", "content": "What runs where in a hybrid MoE server?"}]
            r = chat(base, msgs)
            print(f"chat request -> {r['choices'][0]['message']['content']!r} "
                  f"({r['usage']['completion_tokens']} tokens; random weights, so no meaning)")
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    summary = [ln for ln in open(log_path).read().splitlines() if "lk_moe: hybrid MoE layers" in ln]
    print(summary[0].split("lk_moe:", 1)[1].strip() if summary else "(no lk_moe summary in the log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
