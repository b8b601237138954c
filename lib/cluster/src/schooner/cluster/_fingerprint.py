"""Fingerprints of code and values: what a step's key and a data pipeline's reuse notice of the code they run.

`token(obj)` is a JSON-able value that is equal for equal code and values and changes when either changes:
a function's bytecode, constants, default arguments, closure values and the module-level values,
functions and classes it uses (and the attributes it reads from user modules), followed through the helpers
it calls; a class's methods; an object's fields. Functions and classes of installed libraries (the standard
library, site-packages, `schooner` itself) are named, not read: their code is the library's version.

Tokens are stable across interpreter runs (no `id()`, addresses or hash-seed order; functions of a script
run as `__main__` are named as that file is imported), so a fingerprint computed in one process matches the
one computed in the next. Bytecode holds no line numbers or comments: reformatting a file, or moving a
function down it, changes nothing; a different Python minor version compiles different bytecode.

Two uses:

- `code_fingerprint(fn)`, for step keys (`schooner.cluster.runner`): code is followed as above, but a
  module-level value that is not code enters by the source of the statement assigning it (`SCALE = 2`,
  `DELAY = float(os.environ["DELAY"])`), not by what it holds: editing the assignment changes the key,
  while the environment, a path, or what a cache or counter holds while the program runs does not (keys
  never depend on where or how a run happens). Without such a statement (a value set at run time),
  immutable values (numbers, strings, tuples, frozensets, enums, frozen dataclasses of such) count by
  value, others by their type. A value that cannot be described is named by its type, with a warning.
- `token(obj)`, for data pipeline plans (`schooner.data`): everything by value, and what cannot be
  described raises `Unfingerprintable` (nothing is reused then).

An object can define `__schooner_fingerprint__()` returning a JSON-able value to take part explicitly.

Beside it: `_bytecode` (what a code object reads and imports), `_libraries` (user code or an installed
library's) and `_assignments` (the statements that assign a module-level name).
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import functools
import hashlib
import json
import logging
import os
import re
import sys
import types
from typing import Any

from ._assignments import assignment_source
from ._bytecode import code_names, local_imports, of_code
from ._libraries import is_library, library_module, user_module

_logger = logging.getLogger("schooner.cluster")


class Unfingerprintable(Exception):
    """Raised inside `token` for a value that has no stable description."""


_SCALARS = (type(None), bool, int, float, str)
_MAX_DEPTH = 12
_KEY_MAX_DEPTH = 48
_INSIDE_MAX_ITEMS = 1000
# Set while computing a step key's code fingerprint: the value policy of `code_fingerprint`.
_KEY_MODE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "schooner_fingerprint_key_mode", default=False
)
_warned: set[tuple[str, str]] = set()
# The user source files a step key's code fingerprint read (collected while it is computed).
_FILES: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "schooner_fingerprint_files", default=None
)
_files_of: dict[str, dict[str, str]] = {}


def code_files(fingerprint: str | None) -> dict[str, str]:
    """The user source files whose code went into `fingerprint` (a `code_fingerprint` of this process), each
    with the SHA-256 of its text when the fingerprint was computed."""
    return dict(_files_of.get(fingerprint or "", {}))


def changed_files(files: dict[str, str]) -> list[str]:
    """The files of `files` (path -> SHA-256) whose text differs now; a file missing here (another machine)
    is not counted."""
    changed = []
    for path, digest in sorted(files.items()):
        now = _file_digest(path)
        if now is not None and now != digest:
            changed.append(path)
    return changed


def _file_digest(path: str) -> str | None:
    try:
        st = os.stat(path)
        return _digest(path, st.st_mtime_ns, st.st_size)
    except OSError:
        return None


@functools.lru_cache(maxsize=1024)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _note_file(path: str | None) -> None:
    files = _FILES.get()
    if files is not None and path and path.endswith(".py") and os.path.isfile(path):
        files.add(os.path.abspath(path))


def code_fingerprint(obj: Any) -> str | None:
    """SHA-256 of the code behind a user function or class (and the helpers it calls), for a step's key.

    None for functions and classes of installed libraries and `schooner` itself, which are named (by
    their module and qualified name) wherever they appear instead: their code changes with their version.

    Example:
        >>> code_fingerprint(json.dumps) is None
        True
    """
    target = _unwrap(obj)
    if is_library(target):
        return None
    reset = _KEY_MODE.set(True)
    files: set[str] = set()
    reset_files = _FILES.set(files)
    try:
        tok = _value(target, frozenset(), 0, _qualname(target))
    finally:
        _KEY_MODE.reset(reset)
        _FILES.reset(reset_files)
    text = json.dumps(tok, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(text.encode("ascii")).hexdigest()
    if digest not in _files_of:
        _files_of[digest] = {f: d for f in files if (d := _file_digest(f)) is not None}
    return digest


def _unwrap(obj: Any) -> Any:
    """What a decorator object (`functools.cache`, ...) wraps. A wrapper *function* stays itself: its
    closure holds what it wraps, and its own code counts too."""
    for _ in range(16):
        inner = getattr(obj, "__wrapped__", None)
        if inner is None or isinstance(obj, types.FunctionType | type):
            break
        obj = inner
    return obj


def token(obj: Any, _seen: frozenset[int] = frozenset(), _depth: int = 0) -> Any:
    """A JSON-able value that is equal for equal code and values and changes when either changes."""
    limit = _KEY_MAX_DEPTH if _KEY_MODE.get() else _MAX_DEPTH
    if _depth > limit:
        raise Unfingerprintable(f"nesting deeper than {limit} levels at {type(obj).__name__}")
    t = type(obj)
    if t in _SCALARS:
        return [t.__name__, repr(obj) if t is float else obj if t is not int else str(obj)]
    nxt = _depth + 1
    if t in (bytes, bytearray, memoryview):
        return ["bytes", hashlib.sha256(bytes(obj)).hexdigest()]
    custom = getattr(obj, "__schooner_fingerprint__", None)
    if custom is not None and not isinstance(obj, type):
        return ["custom", _qualname(t), token(custom(), _seen, nxt)]
    if isinstance(obj, enum.Enum):
        return ["enum", _qualname(t), obj.name]
    if isinstance(obj, re.Pattern):
        return ["re", token(obj.pattern, _seen, nxt), obj.flags]
    if isinstance(obj, logging.Logger):
        return ["logger", obj.name]  # its handlers and levels are how it prints, not what code computes
    if id(obj) in _seen:
        return ["cycle", _qualname(t)]
    seen = _seen | {id(obj)}
    if t in (list, tuple):
        return [t.__name__, [token(x, seen, nxt) for x in obj]]
    if t in (set, frozenset):
        return [t.__name__, sorted((token(x, seen, nxt) for x in obj), key=_sort_key)]
    if t is dict:
        items = [[token(k, seen, nxt), token(v, seen, nxt)] for k, v in obj.items()]
        return ["dict", sorted(items, key=_sort_key)]
    if isinstance(obj, types.FunctionType):
        return _function(obj, seen, nxt)
    if isinstance(obj, types.MethodType):
        return ["method", token(obj.__func__, seen, nxt), _value(obj.__self__, seen, nxt, "__self__")]
    if isinstance(obj, functools.partial):
        return [
            "partial",
            token(obj.func, seen, nxt),
            _value(obj.args, seen, nxt, "args"),
            _value(obj.keywords, seen, nxt, "keywords"),
        ]
    wrapped = _wrapped_callable(obj)
    if wrapped is not None:  # functools.lru_cache/cache and other wrapper objects: what they wrap
        return ["wrapped", _qualname(t), token(wrapped, seen, nxt)]
    if isinstance(obj, types.BuiltinFunctionType | types.ModuleType):
        return [
            t.__name__,
            getattr(obj, "__module__", None) or "",
            getattr(obj, "__qualname__", obj.__name__),
        ]
    if isinstance(obj, type):
        return _class(obj, seen, nxt)
    if isinstance(obj, types.CodeType):
        return _code(obj, seen, nxt)
    return _instance(obj, seen, nxt)


fingerprint_token = token
"""`token` under its public name (`schooner.cluster.fingerprint_token`, used by `schooner.data`)."""


def _wrapped_callable(obj: Any) -> Any:
    """The user function or class a wrapper *object* wraps (`functools.lru_cache`, `functools.cache`, ...), or
    None. Wrapper functions are functions: their closure holds what they wrap."""
    if isinstance(obj, types.FunctionType | type | types.MethodType | functools.partial) or not callable(obj):
        return None
    inner = getattr(obj, "__wrapped__", None)
    if inner is None or not isinstance(inner, types.FunctionType | type) or is_library(inner):
        return None
    return inner


def _sort_key(tok: Any) -> str:
    return json.dumps(tok, sort_keys=True, ensure_ascii=True)


def _qualname(obj: Any) -> str:
    module = stable_module_name(getattr(obj, "__module__", None) or "?")
    return f"{module}:{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _code(code: types.CodeType, seen: frozenset[int], depth: int) -> Any:
    # Constants hold no user objects (numbers, strings, tuples, frozensets, code): `seen` cannot matter, the
    # depth (a nesting limit) and the mode can.
    return of_code("code", code, (depth, _KEY_MODE.get()), lambda: _code_token(code, seen, depth))


def _code_token(code: types.CodeType, seen: frozenset[int], depth: int) -> Any:
    consts = [_code(c, seen, depth + 1) if isinstance(c, types.CodeType) else token(c, seen, depth + 1)
              for c in code.co_consts]  # fmt: skip
    return ["code", code.co_code.hex(), consts, list(code.co_names), list(code.co_freevars)]


def _function(fn: types.FunctionType, seen: frozenset[int], depth: int) -> Any:
    """A function by what it does: its code, defaults, closure and the globals it reads (not its name, so
    renaming or moving it changes nothing; callers name it by the global they read)."""
    where = _qualname(fn)
    _note_file(fn.__code__.co_filename)
    closure = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
        try:
            closure.append(_value(cell.cell_contents, seen, depth, f"{where} (closure {name})"))
        except ValueError:  # an empty cell: a variable of the enclosing function not assigned yet
            closure.append(["empty"])
    global_names, attr_names = code_names(fn.__code__)
    names = sorted(global_names)
    used = {}
    for name in names:
        if name not in fn.__globals__:
            continue
        value = fn.__globals__[name]
        if isinstance(value, types.ModuleType):
            used[name] = _module(value, sorted(attr_names), seen, depth, where)
        elif is_library(value):
            used[name] = ["library", _qualname(value)]
        else:
            used[name] = _global(value, fn.__module__, name, seen, depth, f"{where} (global {name})")
    for module_name, names_read in sorted(local_imports(fn).items()):
        mod = user_module(module_name)
        if mod is not None:  # an import inside the function of a user module: what it reads there counts
            used[f"import {module_name}"] = _module(mod, sorted(names_read | attr_names), seen, depth, where)
    return [
        "function", _code(fn.__code__, seen, depth), _value(fn.__defaults__, seen, depth, f"{where} (defaults)"),
        _value(fn.__kwdefaults__, seen, depth, f"{where} (defaults)"), closure, used,
    ]  # fmt: skip


def _module(mod: types.ModuleType, names: list[str], seen: frozenset[int], depth: int, where: str) -> Any:
    """A module a function uses: a library by name; a user module (`import helpers; helpers.clean(x)`) with
    the attributes of it the function may read (the names its code uses)."""
    if library_module(mod.__name__) or id(mod) in seen:
        return ["module", mod.__name__]
    _note_file(getattr(mod, "__file__", None))
    seen = seen | {id(mod)}
    attrs = {}
    for name in names:
        value = vars(mod).get(name, _MISSING)
        if value is _MISSING or isinstance(value, types.ModuleType):
            continue
        if is_library(value):
            attrs[name] = ["library", _qualname(value)]
        else:
            attrs[name] = _global(
                value, mod.__name__, name, seen, depth + 1, f"{where} ({mod.__name__}.{name})"
            )
    return ["module", stable_module_name(mod.__name__), attrs]


_MISSING: Any = object()


def _value(value: Any, seen: frozenset[int], depth: int, where: str) -> Any:
    """A value a function reads (global, closure, default): all of it for data plans; for step keys code and
    immutable values, and mutable ones by type (see the module docstring)."""
    if not _KEY_MODE.get():
        return token(value, seen, depth)
    if not (_is_code(value) or _is_constant(value, 0)):
        if callable(value) and not isinstance(value, type):
            return ["instance", _guarded(type(value), seen, depth, where)]  # a callable object: its class
        return ["value", _qualname(type(value))]
    return _guarded(value, seen, depth, where)


def _global(value: Any, module: str, name: str, seen: frozenset[int], depth: int, where: str) -> Any:
    """A module-level value a function reads. For step keys, a value that is not code is described by the
    source of the statement that assigns it (`SCALE = 2`, `DELAY = float(os.environ["DELAY"])`), not by
    what it holds now: editing the assignment changes the key, while the environment, a path or what a
    cache or counter holds at run time does not. Without such a statement, immutable values count by value
    and others by their type."""
    if not _KEY_MODE.get() or _is_code(value):
        return _value(value, seen, depth, where)
    source = assignment_source(module, name)
    if source is not None:
        # The statement says which helpers it holds (`HANDLERS = {"add": add}`), not what their bodies do:
        # the code inside the value (functions in a dict, the class of an instance) counts too.
        inside = _code_inside(value, seen, depth, where)
        return ["assigned", source, inside] if inside else ["assigned", source]
    return _value(value, seen, depth, where)


def _code_inside(
    value: Any, seen: frozenset[int], depth: int, where: str, level: int = 0, budget: list[int] | None = None
) -> list[Any]:
    """For step keys: tokens of the user code a module-level value holds: functions and classes in dicts,
    lists, tuples and sets (a few levels deep, a few thousand items at most), and the class of an instance
    of a user class (its methods)."""
    budget = [_INSIDE_MAX_ITEMS * 5] if budget is None else budget
    budget[0] -= 1
    if level > 4 or budget[0] < 0:
        return []
    if _is_code(value):
        return [] if is_library(value) else [_guarded(value, seen, depth, where)]
    t = type(value)
    if t in (dict, list, tuple, set, frozenset):
        if len(value) > _INSIDE_MAX_ITEMS:  # a table of data, not a registry of helpers
            return []
        items = list(value.items()) if t is dict else [(None, v) for v in value]
        found = []
        for k, v in items:
            for tok in _code_inside(v, seen, depth, where, level + 1, budget):
                found.append([repr(k) if isinstance(k, _SCALARS) else None, tok])
        return sorted(found, key=_sort_key) if t in (set, frozenset) else found
    if t.__module__ and not library_module(t.__module__) and not isinstance(value, types.ModuleType):
        return [["instance of", _guarded(t, seen, depth, where)]]
    return []


def _guarded(value: Any, seen: frozenset[int], depth: int, where: str) -> Any:
    try:
        return token(value, seen, depth)
    except (Unfingerprintable, RecursionError) as e:
        warned = (where, type(value).__qualname__)
        if warned not in _warned:
            _warned.add(warned)
            _logger.warning(
                "%s: a %s it uses has no stable description (%s), so only its type is part of the step's key; "
                "give it a __schooner_fingerprint__() method, or pass it in the config",
                where,
                _qualname(type(value)),
                e,
            )
        return ["opaque", _qualname(type(value))]


def _is_code(value: Any) -> bool:
    return (
        isinstance(
            value,
            types.FunctionType
            | types.MethodType
            | types.BuiltinFunctionType
            | functools.partial
            | type
            | staticmethod
            | classmethod
            | property,
        )
        or hasattr(value, "__schooner_fingerprint__")
        or _wrapped_callable(value) is not None
    )


def _is_constant(value: Any, depth: int) -> bool:
    """Immutable values: scalars, bytes, enums, compiled patterns, tuples and frozensets of such, frozen
    dataclasses of such (or of functions)."""
    if depth > 20:
        return False
    t = type(value)
    if t in _SCALARS or t is bytes or isinstance(value, enum.Enum | re.Pattern | logging.Logger):
        return True
    if t in (tuple, frozenset):
        return all(_is_constant(v, depth + 1) or _is_code(v) for v in value)
    params = getattr(t, "__dataclass_params__", None)
    if params is not None and params.frozen and not isinstance(value, type):
        return all(
            _is_constant(getattr(value, f.name), depth + 1) or _is_code(getattr(value, f.name))
            for f in dataclasses.fields(value)
        )
    return False


def _class(cls: type, seen: frozenset[int], depth: int) -> Any:
    if is_library(cls):
        return ["class", _qualname(cls)]
    methods = {}
    for k, v in sorted(vars(cls).items()):
        dunder = k.startswith("__") and k not in ("__call__", "__init__", "__iter__", "__next__")
        if not dunder and isinstance(v, types.FunctionType | staticmethod | classmethod | property):
            if _KEY_MODE.get() and _generated(v):
                continue  # made by @dataclass from the fields: the fields are keyed where they are used
            methods[k] = token(v, seen, depth)
    bases = [_qualname(b) for b in cls.__mro__[1:]]
    return ["class", _qualname(cls), bases, methods]


def _generated(v: Any) -> bool:
    """A method written by `dataclasses` (its `__init__`): its code is a function of the field list."""
    code = getattr(v, "__code__", None)
    return code is not None and code.co_filename == "<string>"


def _instance(obj: Any, seen: frozenset[int], depth: int) -> Any:
    cls = type(obj)
    if isinstance(obj, staticmethod | classmethod):
        return [cls.__name__, token(obj.__func__, seen, depth)]
    if isinstance(obj, property):
        return ["property", token(obj.fget, seen, depth)]
    if cls.__module__ == "numpy" or cls.__name__ == "ndarray":
        import numpy as np

        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise Unfingerprintable(f"numpy array of Python objects {arr.shape}")
        return ["ndarray", str(arr.dtype), list(arr.shape), hashlib.sha256(arr.tobytes()).hexdigest()]
    if dataclasses.is_dataclass(obj):
        fields = {f.name: token(getattr(obj, f.name), seen, depth) for f in dataclasses.fields(obj)}
        return ["dataclass", token(cls, seen, depth), fields]
    state = getattr(obj, "__dict__", None)
    if state is None and hasattr(cls, "__slots__"):
        state = {k: getattr(obj, k) for k in cls.__slots__ if hasattr(obj, k)}
    if state is None:
        raise Unfingerprintable(f"{_qualname(cls)} object {_short(obj)} has no fields to describe it")
    return ["object", token(cls, seen, depth), {k: token(v, seen, depth) for k, v in sorted(state.items())}]


def _short(obj: Any) -> str:
    r = repr(obj)
    return r if len(r) <= 60 else r[:57] + "..."


def stable_module_name(module: str) -> str:
    """The name a module has whichever way its file was started.

    A function defined in an experiment file run as a script (`python exp.py`, `schooner run exp.py`)
    lives in `__main__`; imported from another experiment it lives in `exp` or `experiments.exp`. For
    `__main__`, this returns the name the file is imported under: its stem, prefixed by the regular
    packages (folders with `__init__.py`) that hold it, as Python resolves `import experiments.exp`.
    Other modules keep their name.

    Example:
        >>> stable_module_name("schooner.cluster.runner._version")
        'schooner.cluster.runner._version'
    """
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return module  # an interactive session: no file to name it by
    return _importable_name(os.path.abspath(path))


def _importable_name(path: str) -> str:
    folder, stem = os.path.split(os.path.splitext(path)[0])
    parts = [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, pkg = os.path.split(folder)
        parts.insert(0, pkg)
    return ".".join(parts)
