"""Run a callback right after a module is imported, in any process.

SGLang starts its scheduler ranks as spawned processes, which import everything afresh: a patch applied in
the launcher's process does not reach them. So the launcher exports what to patch, every Python process of the
engine runs `pdfleet`'s sitecustomize, and patches are applied the moment the module they target is imported:
not earlier (importing SGLang at interpreter start would slow every helper process and disturb CUDA
initialisation order), and not later (the scheduler loop must never run unpatched).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callback) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        self._callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot, and no recursion while the real finders look
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.callback)
        return spec


def after_import(name: str, callback: Callback) -> None:
    """Calls `callback(module)` once `name` is imported; at once if it already is."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, _Finder(name, callback))
