"""LVLLM_CUDA_BLOCKING_SYNC: the device's schedule flags through the runtime's own calls (a stand-in
runtime here; the GPU machine runs the real one in benchmarks/e2e_decode.py's hybrid-bsync mode)."""
import pytest

from lvllm.cuda_sync import SCHEDULE_BLOCKING_SYNC, use_blocking_sync


class FakeRuntime:
    def __init__(self, flags=0x08, set_rc=0, sticky=False):  # 0x08: cudaDeviceMapHost, kept as it is
        self.flags, self.set_rc, self.sticky, self.calls = flags, set_rc, sticky, []

    def cudaGetDeviceFlags(self, ref):
        ref._obj.value = self.flags
        return 0

    def cudaSetDeviceFlags(self, flags):
        self.calls.append(flags.value)
        if self.set_rc == 0 and not self.sticky:
            self.flags = flags.value
        return self.set_rc


def test_switches_the_schedule_and_keeps_the_other_flags():
    rt = FakeRuntime(flags=0x08 | 0x01)  # map host + spin
    assert use_blocking_sync(rt) == "CUDA waits: spin -> blocking sync"
    assert rt.calls == [0x08 | SCHEDULE_BLOCKING_SYNC]


@pytest.mark.parametrize("rt,words", [(FakeRuntime(set_rc=708), "cudaSetDeviceFlags failed (error 708)"),
                                      (FakeRuntime(sticky=True), "kept its schedule (auto)")])
def test_a_refusal_is_an_error_naming_the_setting(rt, words):
    with pytest.raises(RuntimeError) as e:
        use_blocking_sync(rt)
    assert "LVLLM_CUDA_BLOCKING_SYNC=1" in str(e.value) and words in str(e.value)


def test_without_a_gpu_it_is_a_clear_error():
    """No runtime loaded, or a runtime without a device: an error naming the setting, never a crash."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU machine's benchmark runs the real switch")
    with pytest.raises(RuntimeError, match=r"LVLLM_CUDA_BLOCKING_SYNC=1: (the CUDA runtime .* not loaded|cudaGetDeviceFlags failed)"):
        use_blocking_sync()
