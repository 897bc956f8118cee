#!/usr/bin/env python3
"""A soak of a default `vllm serve`: --streams concurrent streaming clients for --minutes, a sample every
--every seconds of the server's host RSS and pinned memory (every process it started), GPU memory
(nvidia-smi), the page-locked host memory the workers report (lvllm_pinned_host_bytes: VmPin does not
count CUDA's) and the lvllm_* counters (/metrics); then failed requests, memory after warm-up vs at the
end, and decode tok/s of the first --window minutes after the warm-up vs the last (target: within 5%).
Writes the samples (JSON lines, each with the tokens generated since the last by vLLM's own counter) and,
where matplotlib is importable, a PNG of memory and tok/s over time.

    python benchmarks/serve_soak.py --shape qwen3-30b-a3b --minutes 20 --streams 8 --out /tmp/soak
    python benchmarks/serve_soak.py --minutes 10 --streams 4 --serve-arg=--gpu-memory-utilization=0.17 \
        --lvllm-env LVLLM_GPU_EXPERT_CACHE=auto --long-prompt-words 1230   # a 24 GB VRAM cap (of 141 GB), an 8K-token prompt

The same numbers again from a samples file (e.g. to draw the PNG on another machine):
    python benchmarks/serve_soak.py --report /tmp/soak/samples.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import SHAPES, Server, _get, gpu_prefill_arg, lvllm_samples  # noqa: E402  (the same server launch)

GiB = 1 << 30


def group_memory(pgid: int) -> dict:
    """Host RSS and pinned bytes summed over the processes of the server's process group."""
    rss = pin = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("VmPin:"):
                        pin += int(line.split()[1]) * 1024
        except (OSError, ProcessLookupError, ValueError):
            continue
    return {"rss": rss, "pinned": pin}


def gpu_memory(field: str = "memory.used") -> int:
    """Bytes of `field` (memory.used or memory.total) over the machine's GPUs (nvidia-smi); -1 if unknown."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return sum(int(v) for v in out.split()) << 20
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return -1


def vram_cap(serve_args: list, total: int) -> int:
    """The VRAM vLLM may use: --gpu-memory-utilization (vLLM's default 0.9) x the GPUs' total."""
    util = 0.9
    for i, arg in enumerate(serve_args):
        if arg.startswith("--gpu-memory-utilization"):
            util = float(arg.split("=", 1)[1] if "=" in arg else serve_args[i + 1])
    return int(util * total) if total > 0 else -1


_BUDGET_LINE = re.compile(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired GPU memory "
                          r"utilization is \(([\d.]+), ([\d.]+) GiB\)")


def vllm_budget(server_log: str) -> dict:
    """vLLM's own statement of its budget (gpu_worker, after the KV cache is sized): the memory in use when it
    took its first snapshot (this process's CUDA context and anything else there; outside the budget, as for
    stock vLLM) and the bytes it may use from there (utilization x total). GiB to 2 decimals in the log, so
    +-0.005 GiB each. {} if the line is not there."""
    m = _BUDGET_LINE.search(server_log)
    if not m:
        return {}
    free, total, _, cap = (float(v) for v in m.groups())
    return {"vram_before": int((total - free) * GiB), "vram_cap": int(cap * GiB)}


class Clients:
    """`streams` threads, each sending one streaming completion after another; per request the time
    of its first and last token and the number of tokens (decode rate = tokens after the first /
    time between first and last)."""

    def __init__(self, port: int, streams: int, prompt_words: int, max_tokens: int):
        self.port, self.streams, self.prompt_words, self.max_tokens = port, streams, prompt_words, max_tokens
        self.done, self.failed, self.lock = [], [], threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(streams)]

    def _one(self, rng, prompt_words: int = 0, max_tokens: int = 0) -> tuple:
        """(sent, first token, last token, completion tokens, prompt tokens) of one streamed request."""
        import http.client
        prompt_words, max_tokens = prompt_words or self.prompt_words, max_tokens or self.max_tokens
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        words = " ".join(str(rng.randrange(10**6)) for _ in range(prompt_words))
        body = json.dumps({"model": "m", "prompt": words, "max_tokens": max_tokens, "stream": True,
                           "ignore_eos": True, "stream_options": {"include_usage": True}})
        t0 = time.time()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        first = last = None
        chunks = tokens = prompt = 0
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if msg.get("usage"):
                tokens = msg["usage"].get("completion_tokens", tokens)
                prompt = msg["usage"].get("prompt_tokens", prompt)
            if msg.get("choices"):
                now = time.time()
                first = first or now
                last = now
                chunks += 1
        c.close()
        if tokens != max_tokens:
            raise RuntimeError(f"{tokens} of {max_tokens} tokens")
        return t0, first, last, tokens, prompt

    def long_prompt(self, words: int) -> dict:
        """One request with a long prompt (sent while the streams run): its prompt tokens and TTFT, or
        the error."""
        try:
            t0, first, _, _, prompt = self._one(random.Random(-1), words, 16)
            return dict(ok=True, prompt_tokens=prompt, ttft_s=round(first - t0, 3))
        except Exception as e:
            return dict(ok=False, error=str(e)[:300])

    def _loop(self, i: int) -> None:
        rng = random.Random(i)
        while not self.stop.is_set():
            try:
                rec = self._one(rng)[:4]
                with self.lock:
                    self.done.append(rec)
            except Exception as e:  # a failed request is counted and the stream goes on
                with self.lock:
                    self.failed.append((time.time(), str(e)[:200]))
                time.sleep(1.0)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self, timeout: float):
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def decode_rate(done, t_from: float, t_to: float) -> float:
    """Output tokens per second generated inside [t_from, t_to): each request's tokens spread evenly
    over its first-to-last-token time, so requests cut by the window count by their share."""
    toks = 0.0
    for _, first, last, tokens in done:
        span = last - first
        if span <= 0:
            toks += tokens if t_from <= last < t_to else 0
            continue
        toks += tokens * max(0.0, min(last, t_to) - max(first, t_from)) / span
    return toks / max(t_to - t_from, 1e-9)


def generated_tokens(page: str) -> float | None:
    """vLLM's own count of generated tokens (vllm:generation_tokens_total, summed over its label sets) on a
    /metrics page; None where the page has none."""
    from lvllm.metrics import values
    found = [v for k, v in values(page).items() if k.split("{")[0] == "vllm:generation_tokens_total"]
    return sum(found) if found else None


def windows(t_end: float, warmup: float, window: float) -> tuple:
    """The compared windows of a soak that ran [0, t_end): the first `window` seconds after the warm-up and the
    last `window` seconds (they overlap when the soak is shorter than warm-up + two windows)."""
    return (warmup, min(warmup + window, t_end)), (max(t_end - window, 0.0), t_end)


def partial_summary(rows: list, samples: list) -> dict:
    """A summary for a soak that ended before writing its own (its start record and samples): counts from the
    last sample, decode tok/s of the first and last windows from the samples' per-interval rates."""
    start = next((r for r in rows if r.get("start")), None)
    if start is None or not samples:
        raise SystemExit("no summary and no start record in the samples file: nothing to report")
    (a0, a1), (b0, b1) = windows(samples[-1]["t"], start["warmup_s"], start["window_min"] * 60)
    first = [s["rate"] for s in samples if a0 < s["t"] <= a1] or [samples[0]["rate"]]
    last = [s["rate"] for s in samples if b0 < s["t"] <= b1] or [samples[-1]["rate"]]
    return dict(start, partial=True, minutes=round(samples[-1]["t"] / 60, 1), requests=samples[-1]["requests"],
                failed=samples[-1]["failed"], rate_first=sum(first) / len(first), rate_last=sum(last) / len(last),
                long_prompt=None)


# the memory series of a sample: key, what the report calls it
MEMORY = (("rss", "host RSS"), ("pinned_host", "pinned (lvllm_pinned_host_bytes)"), ("pinned", "pinned (VmPin)"),
          ("gpu", "GPU memory"))


def report(samples: list, summary: dict, png: str = "") -> str:
    warm = next((s for s in samples if s["t"] >= summary["warmup_s"]), samples[0])
    end = samples[-1]
    lines = [f"soak: {summary['minutes']} min, {summary['streams']} streams, {summary['requests']} requests, "
             f"{summary['failed']} failed" + (" (cut short: the run wrote no summary; decode rates from the samples)"
                                               if summary.get("partial") else "")]
    for key, what in MEMORY:
        if key not in warm or key not in end:
            continue
        a, b = warm[key], end[key]
        lines.append(f"{what}: {a / GiB:.2f} GiB after warm-up (t={warm['t']:.0f} s) -> {b / GiB:.2f} GiB at the end "
                     f"({(b - a) / GiB:+.3f} GiB, {(b - a) / max(a, 1) * 100:+.2f}%)")
    cap = summary.get("vram_cap", -1)
    if cap > 0:
        peak = max(s["gpu"] for s in samples)
        before = summary.get("vram_before")
        if before is not None:  # vLLM's own budget line: its cap counts from its first snapshot
            used, slack = peak - before, 0.01 * GiB  # the log's two rounded figures
            lines.append(f"GPU memory peak {peak / GiB:.2f} GiB (nvidia-smi), {used / GiB:.2f} GiB of it after vLLM's "
                         f"first snapshot ({before / GiB:.2f} GiB were in use then: the CUDA context), against vLLM's "
                         f"budget of {cap / GiB:.2f} GiB: " + ("held" if used <= cap + slack else
                                                                f"EXCEEDED by {(used - cap) / GiB:.2f} GiB"))
        else:
            lines.append(f"GPU memory peak {peak / GiB:.2f} GiB against the cap of {cap / GiB:.2f} GiB "
                         f"(--gpu-memory-utilization x {summary['gpu_total'] / GiB:.1f} GiB): "
                         + ("held" if peak <= cap else "EXCEEDED"))
    lp = summary.get("long_prompt")
    if lp:
        lines.append(f"long prompt: {lp['prompt_tokens']} tokens, TTFT {lp['ttft_s']} s next to the streams"
                     if lp.get("ok") else f"long prompt FAILED: {lp.get('error', 'no answer before the end')}")
    r0, r1 = summary["rate_first"], summary["rate_last"]
    (_, a1), (b0, _) = windows(summary["minutes"] * 60, summary["warmup_s"], summary["window_min"] * 60)
    lines.append(f"decode: {r0:.1f} tok/s in the first {summary['window_min']} min after warm-up, {r1:.1f} in the last "
                 f"({(r1 - r0) / max(r0, 1e-9) * 100:+.1f}%; target within 5%)"
                 + ("; the two windows overlap (a soak shorter than the warm-up and two windows)" if a1 > b0 else ""))
    if png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            t = [s["t"] / 60 for s in samples]
            fig, ax = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
            for key, label in MEMORY:
                if all(key in s for s in samples):
                    ax[0].plot(t, [s[key] / GiB for s in samples], marker=".", label=label)
            ax[0].set_ylabel("GiB")
            ax[0].legend()
            ax[0].set_title(f"vllm serve soak: {summary['streams']} streams, {summary.get('shape', '')} hybrid")
            ax[1].plot(t, [s.get("rate", 0) for s in samples], marker=".")
            ax[1].set_ylabel("generated tok/s (last interval)")
            ax[1].set_xlabel("minutes")
            fig.tight_layout()
            fig.savefig(png, dpi=100)
            lines.append(f"plot: {png}")
        except ImportError:
            lines.append("plot: matplotlib not importable here (draw it elsewhere with --report)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--model", default="")
    ap.add_argument("--mode", choices=("hybrid", "stock", "offload"), default="hybrid")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--every", type=float, default=30, help="seconds between samples")
    ap.add_argument("--window", type=float, default=5, help="minutes compared at the start and the end")
    ap.add_argument("--warmup", type=float, default=120, help="seconds of load before memory counts as warm")
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--gpu-prefill", type=gpu_prefill_arg, default=1024,
                    help="the hybrid server's GPU-prefill threshold; auto: left unset (auto-fit's, or the default)")
    ap.add_argument("--offload-gb", type=float, default=58)
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--lvllm-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an LVLLM_* / LK_* setting of the hybrid server, e.g. LVLLM_GPU_EXPERT_CACHE=auto")
    ap.add_argument("--long-prompt-words", type=int, default=0,
                    help="one more request at the start with a prompt of this many words (~6.7 tokens each with "
                         "the dummy model's tokenizer): a long prefill next to the streams")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--out", default="/tmp/soak")
    ap.add_argument("--vllm", default="")
    ap.add_argument("--report", default="", help="only report (and plot) an earlier run's samples file")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
        samples = [r for r in rows if "t" in r]
        summary = next((r for r in rows if r.get("summary")), None) or partial_summary(rows, samples)
        print(report(samples, summary, os.path.splitext(a.report)[0] + ".png"))
        return 0
    os.makedirs(a.out, exist_ok=True)
    a.vllm = a.vllm.split() if a.vllm else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    a.deadline, a.startup_only = 0, False
    if not a.model:
        from lvllm.testing.tiny_checkpoint import make_checkpoint
        import tempfile
        a.model = make_checkpoint(SHAPES[a.shape], os.path.join(tempfile.gettempdir(), f"lvllm-{a.shape}"), "big")
    srv = Server(a, a.mode, os.path.join(a.out, "serve.log"))
    startup = srv.wait_ready(a.startup_timeout)
    print(f"server healthy after {startup:.1f} s; soak of {a.minutes} min with {a.streams} streams", flush=True)
    clients = Clients(srv.port, a.streams, a.prompt_words, a.max_tokens)
    samples_path = os.path.join(a.out, "samples.jsonl")
    t0 = time.time()
    clients.start()
    long_result = {}
    if a.long_prompt_words:
        threading.Thread(target=lambda: long_result.update(clients.long_prompt(a.long_prompt_words)),
                         daemon=True).start()
    samples = []
    budget = vllm_budget(srv.text())
    # what a report needs besides the samples, first: a soak cut short (a machine taken back) still reports
    start = dict(shape=a.shape, minutes=a.minutes, streams=a.streams, startup_s=round(startup, 1),
                 warmup_s=a.warmup, window_min=a.window, gpu_total=gpu_memory("memory.total"))
    start["vram_cap"] = budget.get("vram_cap", vram_cap(a.serve_arg, start["gpu_total"]))
    if budget:
        start["vram_before"] = budget["vram_before"]
    with open(samples_path, "w") as out:
        out.write(json.dumps(dict(start, start=True)) + "\n")
        # the per-interval rate from vLLM's own counter of generated tokens (tokens of finished requests where the
        # page has none: with streams in lockstep those finish in bursts, a rate that hides any drift)
        last_t, last_n = t0, generated_tokens(_get(srv.base + "/metrics")[1]) or 0
        while time.time() - t0 < a.minutes * 60:
            time.sleep(max(0.0, t0 + (len(samples) + 1) * a.every - time.time()))
            now = time.time()
            with clients.lock:
                done = list(clients.done)
                failed = len(clients.failed)
            page = _get(srv.base + "/metrics")[1]
            generated = generated_tokens(page)
            toks = generated if generated is not None else sum(tokens for *_, tokens in done)
            s = dict(t=round(now - t0, 1), gpu=gpu_memory(), requests=len(done), failed=failed,
                     rate=round((toks - last_n) / max(now - last_t, 1e-9), 2), healthy=_get(srv.base + "/health")[0] == 200,
                     **group_memory(srv.proc.pid))
            if generated is not None:
                s["generated"] = generated
            lvllm = lvllm_samples(page)
            pinned = [v for k, v in lvllm.items() if k.startswith("lvllm_pinned_host_bytes{")]
            if pinned:  # what the workers page-locked (VmPin, in "pinned", does not count CUDA's page-locking)
                s["pinned_host"] = sum(pinned)
            s["lvllm"] = {k: v for k, v in lvllm.items() if "seconds" in k or "tokens" in k}
            last_t, last_n = now, toks
            samples.append(s)
            out.write(json.dumps(s) + "\n")
            out.flush()
            print(f"t={s['t']:6.0f} s  rss {s['rss'] / GiB:6.2f} GiB  pinned {s['pinned'] / GiB:6.2f} GiB  "
                  f"gpu {s['gpu'] / GiB:6.2f} GiB  {s['requests']} done {s['failed']} failed  {s['rate']:.1f} tok/s",
                  flush=True)
        end = time.time()
        clients.finish(600)
        (a0, a1), (b0, b1) = windows(end - t0, a.warmup, a.window * 60)
        summary = dict(start, summary=True, requests=len(clients.done), failed=len(clients.failed),
                       failures=clients.failed[:10], rate_first=decode_rate(clients.done, t0 + a0, t0 + a1),
                       rate_last=decode_rate(clients.done, t0 + b0, t0 + b1),
                       long_prompt=dict(long_result) if a.long_prompt_words else None)
        out.write(json.dumps(summary) + "\n")
    exited, rc, gone, killed = srv.stop(60)
    print(report(samples, summary, os.path.join(a.out, "soak.png")))
    print(f"SIGINT -> API server exited in {exited} s, exit code {rc}; every process gone after {gone} s"
          + ("; survivors killed" if killed else ""))
    long_ok = not a.long_prompt_words or summary["long_prompt"].get("ok", False)
    return 0 if summary["failed"] == 0 and long_ok else 1


if __name__ == "__main__":
    sys.exit(main())
