"""Test instrumentation for the e2e MoE-layer oracle (tests/e2e/moe_oracle.py): with LVLLM_TEST_MOE_CAPTURE=<dir>
set, every process that imports vLLM's RoutedExperts records what its routed expert layers compute, switch on or
off: per call of at least LVLLM_TEST_MOE_CAPTURE_MIN_ROWS rows (default 256: prefill chunks, not decode steps) outside
graph capture, the layer's input rows, topk ids and weights and its output, one file a call
(<dir>/<pid>-<n>.pt, written before the call returns: the run's driver sees every call that has returned). Unset,
nothing is imported or patched (lvllm.plugin.register reads the variable before the switch).

RoutedExperts.forward_modular is where stock's kernels and lvllm's hybrid method alike are called (vLLM 0.33.0's
MoE runner), after the router and before the runner's own routed scaling and the shared experts' add."""
from __future__ import annotations

import itertools
import os
import re

ENV = "LVLLM_TEST_MOE_CAPTURE"
ENV_MIN_ROWS = "LVLLM_TEST_MOE_CAPTURE_MIN_ROWS"
ROUTED_EXPERTS = "vllm.model_executor.layers.fused_moe.routed_experts"


def layer_index(layer_name: str):
    """The decoder layer of a RoutedExperts layer name (None for draft / MTP layers: the oracle's reference reads
    the target's layers)."""
    if "mtp" in layer_name.split("."):
        return None
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", layer_name)
    return int(m.group(1)) if m else None


def _patch(directory: str, min_rows: int, module) -> None:
    import torch
    cls = module.RoutedExperts
    inner = cls.forward_modular
    counter = itertools.count()

    def forward_modular(self, x, topk_weights, topk_ids, *args, **kwargs):
        out = inner(self, x, topk_weights, topk_ids, *args, **kwargs)
        idx = layer_index(self.layer_name)
        if (idx is not None and x.shape[0] >= min_rows and isinstance(out, torch.Tensor)
                and not (x.is_cuda and torch.cuda.is_current_stream_capturing())):
            torch.save({"layer_name": self.layer_name, "layer": idx, "x": x.detach().cpu(),
                        "topk_ids": topk_ids.detach().cpu(), "topk_weights": topk_weights.detach().float().cpu(),
                        "out": out.detach().cpu()}, os.path.join(directory, f"{os.getpid()}-{next(counter):05d}.pt"))
        return out

    cls.forward_modular = forward_modular


def install_from_env() -> bool:
    """Patch RoutedExperts when vLLM imports it, if LVLLM_TEST_MOE_CAPTURE names a directory; True if it does."""
    directory = os.environ.get(ENV, "").strip()
    if not directory:
        return False
    if not os.path.isdir(directory):
        raise ValueError(f"{ENV}={directory!r} is not a directory")
    raw = os.environ.get(ENV_MIN_ROWS, "256").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV_MIN_ROWS}={raw!r} is not a positive row count")
    from ..post_import import when_imported
    when_imported(ROUTED_EXPERTS, lambda module: _patch(directory, int(raw), module))
    return True
