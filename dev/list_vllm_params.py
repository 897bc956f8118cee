"""What vLLM 0.33.0 builds for a tiny checkpoint, on this machine's CPU: every parameter (name, shape, dtype) and the
fused projections' shard sizes, with the plugin off. For writing a new architecture's tiny checkpoint in the names
vLLM's loader reads (its load_weights maps the checkpoint's names onto these; tests/plugin/vllm_cpu_load.py's
load-coverage check then shows every element loaded). Construction only: nothing is loaded or computed; the CPU
platform stands in for the GPU one, with the architecture's lenders from tests/plugin/vllm_cpu_load.py.

    python dev/list_vllm_params.py --arch deepseek_v41 [--layers 0-1] > /tmp/v41-params.txt
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "plugin"))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, help="an architecture of tools/make_tiny_checkpoint.py")
    ap.add_argument("--quant", default="bf16", help="its --quant (default bf16)")
    ap.add_argument("--layers", default="", help="only these decoder layers' parameters, e.g. 0-1 (default all)")
    ap.add_argument("--port", type=int, default=29933)
    a = ap.parse_args(argv)

    import torch
    import vllm_cpu_load as lenders  # the CPU platform and the architectures' lenders

    from lvllm.testing.tiny_checkpoint import LANGUAGE_MODEL_ONLY, make_checkpoint
    lenders.lend_for(a.arch, a.quant)
    lenders.lend_plain_cpu_gemm()
    from vllm.config import EngramConfig, LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import initialize_model

    keep = None
    if a.layers:
        lo, _, hi = a.layers.partition("-")
        keep = set(range(int(lo), int(hi or lo) + 1))
    with tempfile.TemporaryDirectory() as d:
        model_dir = make_checkpoint(a.arch, os.path.join(d, a.arch), quant=a.quant)
        target = ModelConfig(model=model_dir, dtype="bfloat16", max_model_len=512,
                             language_model_only=a.arch in LANGUAGE_MODEL_ONLY)
        vc = VllmConfig(model_config=target, load_config=LoadConfig(load_format="dummy"),
                        engram_config=EngramConfig(cpu_offload=False))  # tables in plain memory (no pinning here)
        with set_current_vllm_config(vc), torch.device("cpu"):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{a.port}")
            initialize_model_parallel(1)
            model = initialize_model(vllm_config=vc)

    def wanted(name: str) -> bool:
        m = re.search(r"\.layers\.(\d+)\.", name)
        return keep is None or m is None or int(m.group(1)) in keep

    for name, p in model.named_parameters():
        if wanted(name):
            print(f"{name} {tuple(p.shape)} {str(p.dtype).replace('torch.', '')}")
    for name, m in model.named_modules():
        if getattr(m, "output_sizes", None) and wanted(name + "."):
            print(f"fused {name} ({type(m).__name__}): shards {list(m.output_sizes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
