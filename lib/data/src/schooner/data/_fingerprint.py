"""Fingerprints of pipeline plans: what decides whether a finished shard or map output may be reused.

A plan's fingerprint covers its inputs (file sizes and modification times, in-memory records, Hugging Face
fingerprints), every operation and the code and values behind it: a function's bytecode, constants,
default arguments, closure values and the module-level values and functions it uses; a callable object's
fields. Change any of them and the fingerprint changes, so `skip_existing` rewrites instead of reusing.

What cannot be fingerprinted (an object without a stable value, such as an open file or a lock) makes
the plan unfingerprintable: nothing is reused then (`fingerprint` returns None and the caller says so).
An object can define `__schooner_fingerprint__()` returning a JSON-able value to take part explicitly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import Any

import orjson

from ._json import dumps_json


class Unfingerprintable(Exception):
    """Raised inside `token` for a value that has no stable description."""


_SCALARS = (type(None), bool, int, float, str)
_MAX_DEPTH = 12


def fingerprint(*parts: Any) -> str | None:
    """sha256 hex of the tokens of `parts`, or None when one of them cannot be fingerprinted."""
    try:
        tok = [token(p) for p in parts]
    except Unfingerprintable:
        return None
    data = orjson.dumps(tok, option=orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()


def records_digest(records: Iterable[Any]) -> str | None:
    """sha256 hex of records as JSON lines (None when one is not JSON): the token of in-memory data."""
    h = hashlib.sha256()
    for r in records:
        try:
            h.update(dumps_json(r))
        except TypeError:
            return None
        h.update(b"\n")
    return h.hexdigest()


def describe_unfingerprintable(*parts: Any) -> str:
    """Why `fingerprint(*parts)` is None (the first offending value), for messages."""
    try:
        for p in parts:
            token(p)
    except Unfingerprintable as e:
        return str(e)
    return ""


def token(obj: Any, _seen: frozenset[int] = frozenset(), _depth: int = 0) -> Any:
    """A JSON-able value that is equal for equal plans and changes when code or values change."""
    if _depth > _MAX_DEPTH:
        raise Unfingerprintable(f"nesting deeper than {_MAX_DEPTH} levels at {type(obj).__name__}")
    t = type(obj)
    if t in _SCALARS:
        return [t.__name__, repr(obj) if t is float else obj if t is not int else str(obj)]
    nxt = _depth + 1
    if t in (bytes, bytearray, memoryview):
        return ["bytes", hashlib.sha256(bytes(obj)).hexdigest()]
    custom = getattr(obj, "__schooner_fingerprint__", None)
    if custom is not None and not isinstance(obj, type):
        return ["custom", _qualname(t), token(custom(), _seen, nxt)]
    if id(obj) in _seen:
        return ["cycle", _qualname(t)]
    seen = _seen | {id(obj)}
    if t in (list, tuple):
        return [t.__name__, [token(x, seen, nxt) for x in obj]]
    if t in (set, frozenset):
        return [t.__name__, sorted((token(x, seen, nxt) for x in obj), key=orjson.dumps)]
    if t is dict:
        items = [[token(k, seen, nxt), token(v, seen, nxt)] for k, v in obj.items()]
        return ["dict", sorted(items, key=orjson.dumps)]
    if isinstance(obj, types.FunctionType):
        return _function(obj, seen, nxt)
    if isinstance(obj, types.MethodType):
        return ["method", token(obj.__func__, seen, nxt), token(obj.__self__, seen, nxt)]
    if isinstance(obj, functools.partial):
        return [
            "partial",
            token(obj.func, seen, nxt),
            token(obj.args, seen, nxt),
            token(obj.keywords, seen, nxt),
        ]
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


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _code(code: types.CodeType, seen: frozenset[int], depth: int) -> Any:
    consts = [_code(c, seen, depth + 1) if isinstance(c, types.CodeType) else token(c, seen, depth + 1)
              for c in code.co_consts]  # fmt: skip
    return ["code", code.co_code.hex(), consts, list(code.co_names), list(code.co_freevars)]


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _function(fn: types.FunctionType, seen: frozenset[int], depth: int) -> Any:
    closure = [token(c.cell_contents, seen, depth) for c in fn.__closure__ or ()]
    used = {}
    for name in sorted(_global_names(fn.__code__)):
        if name in fn.__globals__:
            value = fn.__globals__[name]
            if isinstance(value, types.ModuleType):
                used[name] = ["module", value.__name__]
            elif _is_library(value):
                used[name] = ["library", _qualname(value)]
            else:
                used[name] = token(value, seen, depth)
    return [
        "function", _qualname(fn), _code(fn.__code__, seen, depth), token(fn.__defaults__, seen, depth),
        token(fn.__kwdefaults__, seen, depth), closure, used,
    ]  # fmt: skip


def _is_library(value: Any) -> bool:
    """Functions and classes of installed libraries (site-packages, the standard library, schooner) are
    named, not read: their code is the library's version, and reading it would be slow and fragile."""
    module = getattr(value, "__module__", None) or ""
    if not (callable(value) and module):
        return False
    return _library_module(module)


@functools.cache
def _library_module(module: str) -> bool:
    if module.split(".")[0] in ("builtins", "schooner") or module in sys.builtin_module_names:
        return True
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) or ""
    if not path:
        return mod is not None  # a built-in or namespace module
    path = os.path.realpath(path)
    return "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)


_STDLIB = os.path.realpath(sysconfig.get_path("stdlib"))


def _class(cls: type, seen: frozenset[int], depth: int) -> Any:
    if _is_library(cls):
        return ["class", _qualname(cls)]
    methods = {}
    for k, v in sorted(vars(cls).items()):
        dunder = k.startswith("__") and k not in ("__call__", "__init__", "__iter__", "__next__")
        if not dunder and isinstance(v, types.FunctionType | staticmethod | classmethod | property):
            methods[k] = token(v, seen, depth)
    bases = [_qualname(b) for b in cls.__mro__[1:]]
    return ["class", _qualname(cls), bases, methods]


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
