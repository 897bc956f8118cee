"""Run a function on a module right after it is imported (at once if it already is).

The plugin patches vLLM's MoE layer and loader only in the processes that import them (the ones
that build the model). Importing them itself would load vLLM's whole fused-MoE stack (Triton,
triton_kernels, ...) into processes that never build a model, such as the API server or the
`LLM()` front end. Measured on the H200, 2026-12-01, with that eager import: 3 of 8 switch-on
gpt-oss runs had their `LLM()` front-end process (no lk_moe loaded in it) abort at exit with
"terminate called without an active exception"; 0 of 4 switch-off runs.
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from typing import Callable, Dict, List, Set

Callback = Callable[[object], None]


class _RunAfterExec(importlib.abc.Loader):
    """Wraps the module's own loader; everything but exec_module goes to it unchanged. The
    callbacks are taken when the module has run, not when its spec was found (find_spec alone,
    e.g. importlib.util.find_spec, imports nothing and must not use them up)."""

    def __init__(self, loader, finder: "_Finder", name: str):
        self._loader = loader
        self._finder = finder
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        finder = self._finder
        with finder.lock:
            finder.executing.add(self._name)
        ran = False
        try:
            self._loader.exec_module(module)
            ran = True
        finally:
            # Taken under the lock that when_imported registers under: a callback is either taken
            # here or registered after this point, when the module counts as imported (never lost).
            # A failed import keeps them for the next attempt.
            with finder.lock:
                finder.executing.discard(self._name)
                callbacks = finder.pending.pop(self._name, []) if ran else []
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... for inspect and friends
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.pending: Dict[str, List[Callback]] = {}
        self.executing: Set[str] = set()  # modules whose code runs now under _RunAfterExec
        self.lock = threading.Lock()

    def find_spec(self, name, path, target=None):
        with self.lock:
            if name not in self.pending:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _RunAfterExec(spec.loader, self, name)
        return spec


_finder = _Finder()


def when_imported(name: str, callback: Callback) -> None:
    """callback(module) right after `name` is imported in this process, or now if it already is.
    An exception from the callback propagates out of the import that triggered it. Thread-safe: an
    import finishing in another thread meanwhile neither loses the callback nor hands it a module
    whose code is still running."""
    with _finder.lock:
        module = sys.modules.get(name)
        if module is None or name in _finder.executing:  # _RunAfterExec takes it once the code ran
            _finder.pending.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    spec = getattr(module, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        # Another thread is importing it without our loader: its import lock makes this wait for
        # the module to finish (in the importing thread itself, a circular import, it returns at once).
        module = importlib.import_module(name)
    callback(module)
