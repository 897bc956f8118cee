"""Where nvcc exists (CI included), the build must produce the GPU fallback kernels for every
architecture the release supports; cuobjdump (PyPI nvidia-cuda-cuobjdump, or Triton's copy)
lists what the library holds."""
import glob
import os
import shutil
import site
import subprocess

import pytest

import lk_moe
from lk_moe import gpu_dequant

ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
LIB = os.path.join(os.path.dirname(lk_moe.__file__), "_lk_cuda.so")


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in site.getsitepackages():
        for pattern in ("nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump",
                        "triton/backends/nvidia/bin/cuobjdump"):
            hits = glob.glob(os.path.join(base, pattern))
            if hits:
                return hits[0]
    return None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here: the CPU-only build skips the GPU kernels")
def test_gpu_kernels_built_for_every_architecture():
    assert os.path.exists(LIB), f"nvcc is on PATH but {LIB} was not built ({gpu_dequant.library_error()})"
    tool = _cuobjdump()
    if tool is None:
        pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (requirements/test.txt)")
    out = subprocess.run([tool, "--list-elf", LIB], capture_output=True, text=True, check=True).stdout
    found = sorted({a for a in ARCHS if f".{a}.cubin" in out}, key=ARCHS.index)
    assert found == ARCHS, f"cuobjdump --list-elf:\n{out}"
    ptx = subprocess.run([tool, "--list-ptx", LIB], capture_output=True, text=True, check=True).stdout
    assert "sm_120" in ptx  # PTX of the newest, for GPUs newer than this build
    assert gpu_dequant.compiled_archs()[-1] == "120"
