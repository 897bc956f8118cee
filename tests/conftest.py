import pytest


def pytest_collection_modifyitems(config, items):
    # GPU suites skip cleanly where torch sees no CUDA device.
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing entirely
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible to torch)")
    for item in items:
        # the marker, not item.keywords: a CPU test with a parameter id "gpu" is no GPU test
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
