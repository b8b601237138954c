"""Which code is the user's and which is an installed library's (for `_fingerprint`).

Functions and classes of installed libraries (the standard library, site-packages, `schooner` itself) are
named in a fingerprint, not read: their code is the library's version. A module a step's code imports in a
function body is followed only when it is the user's (`user_module`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import sysconfig
import types
from typing import Any

_library_names: set[tuple[str, tuple[str, ...]]] = set()
"""(module name, sys.path) of modules not imported yet that were found among installed libraries: not searched
for again (a `find_spec` per handle built was a third of building a 300-step experiment's handles)."""


def user_module(name: str) -> types.ModuleType | None:
    """The module `name` when it is the user's (not an installed library), imported if it is not yet."""
    if not name or name.split(".")[0] in ("schooner", "builtins", "__future__"):
        return None
    mod = sys.modules.get(name)
    if mod is None:
        searched = (name, tuple(sys.path))
        if searched in _library_names:
            return None
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
        if spec is not None and ("site-packages" in origin or origin.startswith(_STDLIB)):
            _library_names.add(searched)  # an installed library stays one while sys.path is the same
        if not origin.endswith(".py") or "site-packages" in origin or origin.startswith(_STDLIB):
            return None
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that fails to import: the step will say so when it runs
            return None
    return None if library_module(name) else mod


def is_library(value: Any) -> bool:
    """Functions and classes of installed libraries (site-packages, the standard library, schooner) are
    named, not read: their code is the library's version, and reading it would be slow and fragile."""
    module = getattr(value, "__module__", None) or ""
    if not (callable(value) and isinstance(module, str) and module):
        return False
    return library_module(module)


@functools.cache
def library_module(module: str) -> bool:
    if module.split(".")[0] in ("builtins", "schooner") or module in sys.builtin_module_names:
        return True
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) or ""
    if not path:
        return mod is not None and module != "__main__"  # a built-in or namespace module
    path = os.path.realpath(path)
    return "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)


_STDLIB = os.path.realpath(sysconfig.get_path("stdlib"))
