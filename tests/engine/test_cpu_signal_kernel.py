"""The single-kernel CPU signal (LK_CPU_SIGNAL=kernel) as far as a machine without a GPU can check
it: the CUDA library exports the entry point, and the CPU path refuses the signal with a clear
error when there is no CUDA device. The kernel itself runs in tests/gpu/test_cpu_path.py."""
import ctypes
import os
import shutil

import pytest
import torch

import lk_moe
from lk_moe import _C, gpu_dequant
from lk_moe.cpu_path import CpuExpertPath

from .conftest import make_experts

LIB = os.path.join(os.path.dirname(lk_moe.__file__), "_lk_cuda.so")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here: the CPU-only build skips the GPU kernels")
def test_cuda_library_exports_the_kernel_signal():
    assert os.path.exists(LIB), gpu_dequant.library_error()
    lib = ctypes.CDLL(LIB)
    assert hasattr(lib, "lk_cpu_call_kernel")


def test_kernel_args_is_bound():
    assert hasattr(_C.HostCall, "kernel_args") and hasattr(_C, "_kernel_poller_pause")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_kernel_signal_without_cuda_fails_clearly():
    w13, w2 = make_experts(4, 64, 32)
    layer = lk_moe.MoELayer(w13, w2)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        CpuExpertPath(layer, max_tokens=4, top_k=2, signal="kernel")


def test_unknown_signal_is_refused():
    w13, w2 = make_experts(4, 64, 32)
    layer = lk_moe.MoELayer(w13, w2)
    with pytest.raises(ValueError, match="'hostfn', 'mailbox', 'kernel'"):
        CpuExpertPath(layer, max_tokens=4, top_k=2, signal="doorbell")
