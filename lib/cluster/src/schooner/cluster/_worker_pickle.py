"""Ship functions to workers: by reference when a worker can import them, by value when it cannot.

cloudpickle pickles a module-level function by reference (module name + qualified name) whenever its module
is in `sys.modules`. A fresh worker can only resolve that reference if the module is importable *by that
name* from `sys.path`. Modules loaded another way (pytest's `--import-mode=importlib` names test files
`lib.cluster.tests.test_x`; notebooks; `runpy`; files loaded with `importlib.util.spec_from_file_location`)
are not, so their functions would fail to unpickle remotely. For those we register the module for pickling
by value — once per module, checked on the file system without importing anything.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any


@functools.cache
def _importable_by_name(name: str, file: str) -> bool:
    parts = name.split(".")
    real = os.path.realpath(file)
    for entry in sys.path:
        if not entry or not os.path.isabs(entry):
            # '' and relative entries mean "the current directory", which a warm worker started earlier (or
            # elsewhere) may not share: such modules travel by value, which always works.
            continue
        base = os.path.join(entry, *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.exists(candidate) and os.path.realpath(candidate) == real:
                return True
    return False


def needs_by_value(module: types.ModuleType) -> bool:
    """True when `module` is a source module that a worker with this `sys.path` could not import by name."""
    name = getattr(module, "__name__", "__main__")
    file = getattr(module, "__file__", None)
    if name == "__main__" or not file or not file.endswith(".py"):
        return False  # cloudpickle already ships __main__ by value; extensions must be importable anyway
    return not _importable_by_name(name, file)


def _spy_dump(obj: Any, pickler_cls: type) -> tuple[bytes, set[str]]:
    """Pickle `obj` with `pickler_cls`, noting the module of every class and function it holds."""
    seen: set[str] = set()

    class Spy(pickler_cls):
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, type | types.FunctionType):
                seen.add(getattr(o, "__module__", None) or "")
            return super().reducer_override(o)

    buf = io.BytesIO()
    Spy(buf, protocol=5).dump(obj)
    return buf.getvalue(), seen


_registered: set[tuple[int, str]] = set()
_lock = threading.Lock()
_generation = 0  # bumped on every registration: a dump taken before one may hold a stale by-reference pickle


def _register_needed(modules: set[str], register: Callable[[types.ModuleType], None]) -> None:
    """Register the modules workers cannot import by name. Atomic, so a concurrent caller that finds a module
    already claimed returns only once that module really is registered."""
    global _generation
    with _lock:
        for name in modules:
            key = (id(register), name)
            mod = sys.modules.get(name)
            if key in _registered or mod is None:
                continue
            _registered.add(key)
            if needs_by_value(mod):
                register(mod)
                _generation += 1


def dumps(obj: Any) -> bytes:
    """cloudpickle `obj` (a function and its arguments, or map items) so a LocalClient worker can load it:
    functions and classes from modules the worker cannot import by name travel by value."""
    import cloudpickle

    before = _generation
    blob, modules = _spy_dump(obj, cloudpickle.Pickler)
    _register_needed(modules, cloudpickle.register_pickle_by_value)
    if _generation != before:  # some module (ours or another thread's) became by-value since we pickled
        blob, _ = _spy_dump(obj, cloudpickle.Pickler)
    return blob


def register_for(obj: Any, pickler_cls: type, register: Callable[[types.ModuleType], None]) -> None:
    """Register (with `register`, e.g. Ray's vendored cloudpickle) every module behind `obj` that a worker
    could not import by name, so the caller's own pickling of `obj` ships them by value."""
    _, modules = _spy_dump(obj, pickler_cls)
    _register_needed(modules, register)
