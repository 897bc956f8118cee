"""lvllm.post_import: a callback runs right after its module is imported, once, or at once when the
module is already there; find_spec alone does not use it up; an error in it fails the import."""
import importlib
import importlib.util
import sys
import threading
import types

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


@pytest.fixture
def gated_module(tmp_path, monkeypatch):
    """A module `lvllm_gated_mod` whose code waits, mid-import, until the test lets it finish."""
    gate = types.SimpleNamespace(started=threading.Event(), go=threading.Event())
    monkeypatch.setitem(sys.modules, "lvllm_gate", gate)
    (tmp_path / "lvllm_gated_mod.py").write_text(
        "import lvllm_gate\nlvllm_gate.started.set()\nlvllm_gate.go.wait(10)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lvllm_gated_mod", None)
    yield "lvllm_gated_mod", gate
    sys.modules.pop("lvllm_gated_mod", None)


@pytest.mark.parametrize("registered_before", [True, False])
def test_registering_while_another_thread_imports_waits_for_the_module(gated_module, registered_before):
    """registered_before: the import runs under our loader (a callback was pending); otherwise
    plain Python imports it. Either way a callback registered mid-import runs once, on the finished
    module, and none is lost."""
    name, gate = gated_module
    seen = []
    if registered_before:
        when_imported(name, lambda m: seen.append(("first", hasattr(m, "DONE"))))
    importer = threading.Thread(target=importlib.import_module, args=(name,))
    importer.start()
    assert gate.started.wait(10)
    assert name in sys.modules  # present, its code still running
    threading.Timer(0.2, gate.go.set).start()
    when_imported(name, lambda m: seen.append(("mid-import", hasattr(m, "DONE"))))
    importer.join(10)
    assert seen == ([("first", True)] if registered_before else []) + [("mid-import", True)]


def test_a_module_registering_on_itself_gets_called_after_its_code_ran(tmp_path, monkeypatch):
    (tmp_path / "lvllm_self_mod.py").write_text(
        "from lvllm.post_import import when_imported\nimport lvllm_probe_log\n"
        "when_imported(__name__, lambda m: lvllm_probe_log.append(('self', hasattr(m, 'LATER'))))\nLATER = 1\n")
    log = []
    monkeypatch.setitem(sys.modules, "lvllm_probe_log", log)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lvllm_self_mod", None)
    when_imported("lvllm_self_mod", lambda m: log.append(("outer", hasattr(m, "LATER"))))
    try:
        importlib.import_module("lvllm_self_mod")
    finally:
        sys.modules.pop("lvllm_self_mod", None)
    assert log == [("outer", True), ("self", True)]
