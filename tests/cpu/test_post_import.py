"""lvllm.post_import: a callback runs right after its module is imported, once, or at once when the
module is already there; find_spec alone does not use it up; an error in it fails the import."""
import importlib
import importlib.util
import sys

import pytest

from lvllm.post_import import when_imported


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """A module `lvllm_probe_mod` on sys.path, not yet imported."""
    (tmp_path / "lvllm_probe_mod.py").write_text("VALUE = 1\ndef f(a, b):\n    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lvllm_probe_mod", None)
    yield "lvllm_probe_mod"
    sys.modules.pop("lvllm_probe_mod", None)


def test_runs_after_the_module_ran_and_only_once(fresh_module):
    seen = []
    when_imported(fresh_module, lambda m: seen.append(m.VALUE))
    assert seen == []
    assert importlib.util.find_spec(fresh_module) is not None  # finding is not importing
    assert seen == []
    mod = importlib.import_module(fresh_module)
    assert seen == [1]
    import inspect
    assert "return a + b" in inspect.getsource(mod.f)  # the wrapped loader still serves source
    sys.modules.pop(fresh_module)
    importlib.import_module(fresh_module)
    assert seen == [1]


def test_runs_at_once_when_already_imported(fresh_module):
    importlib.import_module(fresh_module)
    seen = []
    when_imported(fresh_module, lambda m: seen.append(m.__name__))
    assert seen == [fresh_module]


def test_an_error_in_the_callback_fails_the_import(fresh_module):
    def refuse(module):
        raise RuntimeError("hook cannot be installed")
    when_imported(fresh_module, refuse)
    with pytest.raises(RuntimeError, match="hook cannot be installed"):
        importlib.import_module(fresh_module)
    assert fresh_module not in sys.modules
