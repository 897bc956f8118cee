"""One serving stack: the versions in lvllm/pins.py are the ones requirements/ and pyproject.toml ask for,
and the ones the installed packages are (where they are installed, as in CI)."""
import importlib.metadata as md
import os
import re

import pytest

from lvllm import pins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pins_in(path):
    with open(os.path.join(ROOT, path)) as f:
        return dict(re.findall(r"\b(torch|vllm)==([0-9][0-9.]*)", f.read()))


@pytest.mark.parametrize("path", ["pyproject.toml", "requirements/cuda.txt", "requirements/cpu.txt",
                                  "requirements/test.txt"])
def test_every_file_asks_for_the_pinned_versions(path):
    want = {"torch": pins.TORCH, "vllm": pins.VLLM}
    got = _pins_in(path)
    assert got, f"{path} pins neither torch nor vllm"
    assert {k: want[k] for k in got} == got, path


def test_the_installed_stack_is_the_pinned_one():
    for name, want in (("torch", pins.TORCH), ("vllm", pins.VLLM)):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            continue
        assert have.split("+")[0] == want, f"{name} {have} installed, {want} pinned"
