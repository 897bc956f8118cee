#!/usr/bin/env python3
"""`vllm serve` as a user runs it, default settings, dummy weights: startup by phase, the lk_moe counters on
/metrics, vLLM's own load client at several concurrencies, mid-stream disconnects, and shutdown on SIGINT.

Modes (each its own `vllm serve` process, on the same machine one after another):
  hybrid   LVLLM_MOE_NUMA_ENABLED=1: routed experts on lk_moe, GPU prefill from --gpu-prefill tokens
  stock    stock vLLM, everything on the GPU (the startup reference: hybrid must start within 1.5x)
  offload  stock vLLM with --cpu-offload-gb sized to the experts (the load-client baseline to beat)

Per mode: seconds from launch to a healthy /health, split by vLLM's and lk_moe's own log lines (weights
load, lk_moe's repack, torch.compile, memory profile, CUDA-graph capture, the engine's init); the lvllm_*
counters scraped right after startup (warm-up, capture and profile runs must leave zero expert tokens) and
after the load; `vllm bench serve --dataset-name random` at each --concurrency (failed requests, TTFT, TPOT,
ITL, throughput); --disconnects streams dropped after their first tokens, then the server must still
answer; then SIGINT and the seconds until the server exited, with its exit code.

    python benchmarks/serve_load.py --shape gpt-oss-120b --modes hybrid,stock --startup-only
    python benchmarks/serve_load.py --shape qwen3-30b-a3b --modes hybrid,offload --concurrency 1,8,32
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = {"qwen3-30b-a3b": "qwen3_moe", "gpt-oss-120b": "gpt_oss"}

# (phase, pattern of the log line, group holding seconds); the last match of each counts, except for
# the capture, whose passes (vLLM captures its FULL and PIECEWISE graphs separately) add up.
SUMMED = ("capture_s",)
PHASES = [
    ("weights_s", r"Loading weights took ([\d.]+) seconds"),
    ("lk_moe_repack_s", r"lk_moe: experts of all .* in ([\d.]+) s\)"),
    ("model_load_s", r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds"),
    ("compile_s", r"torch\.compile took ([\d.]+) s in total"),
    ("profile_s", r"Memory profiling takes ([\d.]+) seconds"),
    ("capture_s", r"Graph capturing finished in ([\d.]+) secs"),
    ("engine_init_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
]


def phases(log_text: str) -> dict:
    out = {}
    for name, pattern in PHASES:
        m = re.findall(pattern, log_text)
        if m:
            out[name] = sum(float(v) for v in m) if name in SUMMED else float(m[-1])
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except Exception as e:  # not up yet, or refused
        return None, str(e)


def lvllm_samples(page: str) -> dict:
    from lvllm.metrics import values
    return {k: v for k, v in values("\n".join(ln for ln in page.splitlines() if ln.startswith("lvllm_"))).items()
            if not k.split("{")[0].endswith("_created")}


def counter_summary(samples: dict) -> str:
    """'cpu_decode 1234 calls / 0 tokens, ...' of lvllm_moe_* summed over ranks."""
    parts = []
    for path in ("cpu_decode", "cpu_prefill", "gpu_prefill"):
        calls = sum(v for k, v in samples.items() if k.startswith("lvllm_moe_calls_total") and f'path="{path}"' in k)
        tokens = sum(v for k, v in samples.items() if k.startswith("lvllm_moe_tokens_total") and f'path="{path}"' in k)
        secs = sum(v for k, v in samples.items() if k.startswith("lvllm_moe_expert_seconds_total") and f'path="{path}"' in k)
        parts.append(f"{path} {calls:.0f} calls / {tokens:.0f} tokens / {secs:.1f} s")
    return ", ".join(parts)


def lvllm_env(pairs) -> dict:
    """--lvllm-env KEY=VALUE entries (lvllm's and the engine's settings for the hybrid server)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith(("LVLLM_", "LK_")):
            raise SystemExit(f"--lvllm-env takes LVLLM_*=value or LK_*=value, got {pair!r}")
        out[key] = value
    return out


def gpu_prefill_arg(value: str):
    """--gpu-prefill: a token count, or "auto" (LVLLM_GPU_PREFILL_MIN_BATCH_SIZE left unset)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a token count or auto, got {value!r}") from None


class Server:
    def __init__(self, a, mode: str, log_path: str):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LVLLM_")}
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if mode == "hybrid":
            env.update(LVLLM_MOE_NUMA_ENABLED="1", LVLLM_STATS_INTERVAL="30")
            if a.gpu_prefill != "auto":  # auto: unset, for the planner (LVLLM_AUTO_FIT=1) or the default
                env["LVLLM_GPU_PREFILL_MIN_BATCH_SIZE"] = str(a.gpu_prefill)
            env.update(lvllm_env(getattr(a, "lvllm_env", [])))
        cmd = a.vllm + ["serve", a.model, "--load-format", "dummy", "--port", str(self.port),
               "--served-model-name", "m", "--disable-uvicorn-access-log"]
        if mode == "offload":
            cmd += ["--cpu-offload-gb", str(a.offload_gb)]
        cmd += a.serve_arg
        self.cmd = cmd
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.t0 = time.time()
        # Its own process group: SIGINT goes to the server alone, as Ctrl-C in its terminal would.
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
                                     start_new_session=True)

    def wait_ready(self, timeout: float) -> float:
        while time.time() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} during startup (log {self.log_path})")
            if _get(self.base + "/health", 2.0)[0] == 200:
                return time.time() - self.t0
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve not healthy after {timeout:.0f} s (log {self.log_path})")

    def text(self) -> str:
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self, timeout: float = 60.0) -> tuple:
        """SIGINT to the API server; (seconds until it exited, its exit code, seconds until every process
        it started was gone too, whether any had to be killed). None where it did not happen in `timeout`."""
        t = time.time()
        self.proc.send_signal(signal.SIGINT)  # what `kill -INT` or Ctrl-C in its terminal sends
        try:
            rc = self.proc.wait(timeout)
            exited = round(time.time() - t, 1)
        except subprocess.TimeoutExpired:
            rc = exited = None
        while self._group_alive() and time.time() - t < timeout:  # engine core, workers
            time.sleep(0.1)
        all_gone = None if self._group_alive() else round(time.time() - t, 1)
        killed = all_gone is None
        if killed:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        return exited, rc, all_gone, killed


def left(a, margin: float = 0.0) -> float:
    """Seconds to --deadline less margin (inf without one): every wait below stays inside it."""
    return float("inf") if not a.deadline else a.deadline - time.time() - margin


def bench(a, srv: Server, conc: int, out_dir: str) -> dict:
    n = max(a.min_prompts, a.prompts_per_conc * conc)
    name = f"bench_c{conc}.json"
    cmd = a.vllm + ["bench", "serve", "--backend", "vllm", "--base-url", srv.base, "--model", "m",
           "--tokenizer", a.model, "--dataset-name", "random", "--random-input-len", str(a.input_len),
           "--random-output-len", str(a.output_len), "--num-prompts", str(n), "--max-concurrency", str(conc),
           "--ignore-eos", "--save-result", "--result-dir", out_dir, "--result-filename", name,
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--seed", str(conc)]
    with open(os.path.join(out_dir, f"bench_c{conc}.log"), "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=min(a.bench_timeout, left(a, 60)),
                           cwd=tempfile.gettempdir())
    path = os.path.join(out_dir, name)
    if r.returncode != 0 or not os.path.exists(path):
        return {"concurrency": conc, "prompts": n, "error": f"vllm bench serve rc {r.returncode}"}
    with open(path) as f:
        j = json.load(f)
    keep = ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
            "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
            "mean_itl_ms", "median_itl_ms", "p99_itl_ms")
    return dict({"concurrency": conc, "prompts": n}, **{k: j.get(k) for k in keep})


def disconnects(srv: Server, n: int, output_len: int) -> dict:
    """n streams at once, each dropped after its first chunks (a client that goes away); then one
    complete request must still come back."""
    import http.client

    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        body = json.dumps({"model": "m", "prompt": f"disconnect test {i} " * 50, "max_tokens": output_len,
                           "stream": True, "ignore_eos": True})
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read1(64) if hasattr(r, "read1") else r.read(64)
        c.close()  # mid-stream

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    time.sleep(2.0)
    t = time.time()
    req = urllib.request.Request(srv.base + "/v1/completions", json.dumps(
        {"model": "m", "prompt": "after the disconnects", "max_tokens": 16, "ignore_eos": True}).encode(),
        {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, body = r.status, json.loads(r.read())
    except Exception as e:
        return {"streams_dropped": n, "after_ok": False, "error": str(e)}
    # Tokens, not text: dummy weights may sample special tokens, which detokenize to nothing.
    tokens = (body.get("usage") or {}).get("completion_tokens")
    health = _get(srv.base + "/health")[0]
    return {"streams_dropped": n, "after_ok": status == 200 and tokens == 16 and health == 200,
            "after_tokens": tokens, "after_s": round(time.time() - t, 2)}


def run_mode(a, mode: str) -> dict:
    out_dir = os.path.join(a.log_dir, f"{a.shape}-{mode}")
    os.makedirs(out_dir, exist_ok=True)
    srv = Server(a, mode, os.path.join(out_dir, "serve.log"))
    res = {"mode": mode, "shape": a.shape, "command": " ".join(srv.cmd)}
    try:
        res["startup_s"] = round(srv.wait_ready(min(a.startup_timeout, left(a, 45))), 1)
        res.update(phases(srv.text()))
        page = _get(srv.base + "/metrics")[1]
        with open(os.path.join(out_dir, "metrics_startup.txt"), "w") as f:
            f.write(page)
        res["counters_at_startup"] = lvllm_samples(page)
        if not a.startup_only:
            res["load"] = []
            for c in a.concurrency:
                if left(a, 120) <= 0:
                    res["load"].append({"concurrency": c, "error": "skipped: too close to --deadline"})
                    continue
                res["load"].append(bench(a, srv, c, out_dir))
            if a.disconnects and left(a, 90) > 0:
                res["disconnects"] = disconnects(srv, a.disconnects, a.output_len)
            page = _get(srv.base + "/metrics")[1]
            with open(os.path.join(out_dir, "metrics_after.txt"), "w") as f:
                f.write(page)
            res["counters_after"] = lvllm_samples(page)
    except Exception as e:
        res["error"] = str(e)
    finally:
        res["shutdown_s"], res["exit_code"], res["all_exited_s"], res["killed"] = srv.stop(max(5.0, min(60.0, left(a, 10))))
    return res


def print_mode(r: dict) -> None:
    print(f"## {r['shape']} {r['mode']}: {r['command']}", flush=True)
    if "error" in r:
        print(f"   ERROR: {r['error']}")
    ph = ", ".join(f"{k[:-2]} {r[k]:.1f}" for k, _ in PHASES if k in r)
    print(f"   startup {r.get('startup_s', '?')} s to /health ({ph})")
    if r.get("counters_at_startup"):
        print(f"   lk_moe counters at startup: {counter_summary(r['counters_at_startup'])}")
    for b in r.get("load", []):
        if "error" in b:
            print(f"   c={b['concurrency']}: {b['error']}")
            continue
        print(f"   c={b['concurrency']:>2} {b['prompts']} prompts: completed {b['completed']} failed {b['failed']}; "
              f"TTFT median {b['median_ttft_ms']:.0f} ms p99 {b['p99_ttft_ms']:.0f}; TPOT median {b['median_tpot_ms']:.1f} "
              f"ms; ITL median {b['median_itl_ms']:.1f} ms p99 {b['p99_itl_ms']:.1f}; "
              f"{b['output_throughput']:.1f} output tok/s, {b['request_throughput']:.3f} req/s")
    if "disconnects" in r:
        print(f"   disconnects: {r['disconnects']}")
    if r.get("counters_after"):
        print(f"   lk_moe counters after the load: {counter_summary(r['counters_after'])}")
    print(f"   SIGINT -> API server exited in {r['shutdown_s']} s, exit code {r['exit_code']}; every process it "
          f"started gone after {r['all_exited_s']} s" + ("; survivors were killed" if r.get("killed") else ""), flush=True)


def print_table(results: dict) -> None:
    by = {(r["shape"], r["mode"]): r for r in results.values()}
    for shape in sorted({s for s, _ in by}):
        stock, hybrid, offload = by.get((shape, "stock")), by.get((shape, "hybrid")), by.get((shape, "offload"))
        if stock and hybrid and stock.get("startup_s") and hybrid.get("startup_s"):
            print(f"{shape}: startup hybrid {hybrid['startup_s']} s / stock {stock['startup_s']} s = "
                  f"{hybrid['startup_s'] / stock['startup_s']:.2f}x (target <= 1.5x)")
        if hybrid and offload:
            for hb in hybrid.get("load", []):
                ob = next((b for b in offload.get("load", []) if b["concurrency"] == hb["concurrency"]), None)
                if ob and "error" not in ob and "error" not in hb and ob["output_throughput"]:
                    print(f"{shape} c={hb['concurrency']}: output tok/s hybrid {hb['output_throughput']:.1f} / "
                          f"offload {ob['output_throughput']:.1f} = {hb['output_throughput'] / ob['output_throughput']:.2f}x; "
                          f"TTFT median {hb['median_ttft_ms']:.0f} / {ob['median_ttft_ms']:.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--model", default="", help="checkpoint dir (default: the shape's config + tokenizer, generated)")
    ap.add_argument("--modes", default="hybrid,stock")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prompts-per-conc", type=int, default=2, help="prompts per run = this x concurrency")
    ap.add_argument("--min-prompts", type=int, default=4)
    ap.add_argument("--disconnects", type=int, default=8, help="streams dropped mid-way after the load (0: none)")
    ap.add_argument("--startup-only", action="store_true", help="startup, counters and shutdown only")
    ap.add_argument("--gpu-prefill", type=gpu_prefill_arg, default=1024,
                    help="the hybrid server's GPU-prefill threshold; auto: left unset (auto-fit's, or the default)")
    ap.add_argument("--offload-gb", type=float, default=58)
    ap.add_argument("--serve-arg", action="append", default=[], help="one more `vllm serve` argument (repeat)")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--bench-timeout", type=float, default=600)
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "serve_load"))
    ap.add_argument("--results", default="", help="JSON file to merge this run's results into")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("LVLLM_DEVICE_DEADLINE", 0) or 0),
                    help="epoch seconds by which every server is stopped (default: LVLLM_DEVICE_DEADLINE, else none)")
    ap.add_argument("--vllm", default="", help="the vllm command (default: this Python's vLLM, as `vllm`)")
    a = ap.parse_args()
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c]
    a.vllm = a.vllm.split() if a.vllm else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    if not a.model:
        from lvllm.testing.tiny_checkpoint import make_checkpoint
        a.model = make_checkpoint(SHAPES[a.shape], os.path.join(tempfile.gettempdir(), f"lvllm-{a.shape}"), "big")
    results = {}
    if a.results and os.path.exists(a.results):
        with open(a.results) as f:
            results = json.load(f)
    for mode in [m for m in a.modes.split(",") if m]:
        if left(a, 90) <= 0:
            print(f"## {a.shape} {mode}: skipped, too close to --deadline", flush=True)
            continue
        r = run_mode(a, mode)
        results[f"{a.shape}/{mode}"] = r
        print_mode(r)
        if a.results:
            with open(a.results, "w") as f:
                json.dump(results, f, indent=1)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
