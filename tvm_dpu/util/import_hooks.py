"""Run code right after a module is first imported (a post-import hook), so that tvm-dpu registers itself with
TVM only in processes that use TVM: `import tvm_dpu` (and the `tvm-dpu` CLI's `--help`) stays free of TVM's
seconds-long import, while `import tvm_dpu; import tvm` still finds the "dpu" target, pipeline and runtime."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once module `name` is imported: now if it already is, else right after its
    first import finishes (exceptions from `callback` propagate to that import)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            _callbacks.setdefault(name, []).append(callback)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    callback(module)


def _fire_loaded() -> None:
    """Callbacks of watched modules that finished importing without our loader (being imported already when
    `when_imported` was called): run at the next import anywhere."""
    ready = []
    with _lock:
        for name in list(_callbacks):
            module = sys.modules.get(name)
            if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
                ready += [(cb, module) for cb in _callbacks.pop(name)]
    for cb, module in ready:
        cb(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the other finders and wraps the loader they give."""

    _busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if _callbacks:
            _fire_loaded()
        if fullname not in _callbacks or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner  # importlib.reload and pkgutil see the real loader
        self._inner.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(self._name, [])
        for cb in callbacks:
            cb(module)

    def __getattr__(self, attr):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._inner, attr)
