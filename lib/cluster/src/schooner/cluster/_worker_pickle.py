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
import types
from collections.abc import Callable
from typing import Any


@functools.cache
def _importable_by_name(name: str, file: str) -> bool:
    parts = name.split(".")
    real = os.path.realpath(file)
    for entry in sys.path:
        base = os.path.join(entry or os.getcwd(), *parts)
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

    class Spy(pickler_cls):  # type: ignore[misc, valid-type]
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, type | types.FunctionType):
                seen.add(getattr(o, "__module__", None) or "")
            return super().reducer_override(o)

    buf = io.BytesIO()
    Spy(buf, protocol=5).dump(obj)
    return buf.getvalue(), seen


_registered: set[tuple[int, str]] = set()


def _register_needed(modules: set[str], register: Callable[[types.ModuleType], None]) -> bool:
    """Register the modules workers cannot import by name; True when something new was registered."""
    new = False
    for name in modules:
        key = (id(register), name)
        mod = sys.modules.get(name)
        if key in _registered or mod is None:
            continue
        _registered.add(key)
        if needs_by_value(mod):
            register(mod)
            new = True
    return new


def dumps(obj: Any) -> bytes:
    """cloudpickle `obj` (a function and its arguments, or map items) so a LocalClient worker can load it:
    functions and classes from modules the worker cannot import by name travel by value."""
    import cloudpickle

    blob, modules = _spy_dump(obj, cloudpickle.Pickler)
    if _register_needed(modules, cloudpickle.register_pickle_by_value):
        blob, _ = _spy_dump(obj, cloudpickle.Pickler)
    return blob


def register_for(obj: Any, pickler_cls: type, register: Callable[[types.ModuleType], None]) -> None:
    """Register (with `register`, e.g. Ray's vendored cloudpickle) every module behind `obj` that a worker
    could not import by name, so the caller's own pickling of `obj` ships them by value."""
    _, modules = _spy_dump(obj, pickler_cls)
    _register_needed(modules, register)
