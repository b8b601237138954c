"""Step identity: the canonical JSON form of a config and the version key hashed from it.

A step's key is the SHA-256 of the canonical JSON of `{"name", "config", "version", "code"}`, where every
input handle in the config is replaced by the input's own key and `code` is the fingerprint of the step
function's code (`schooner.cluster._fingerprint.code_fingerprint`: its body, the helpers it calls and the
module-level constants they read, followed transitively; None for a library function such as a step
builder's, whose `version` string stands for its code). Editing the body of a helper the step calls gives
the step (and every step downstream) a new key; reformatting, comments, or an unchanged file do not. Nothing physical (prefix, absolute output path,
host, region, resources) can enter the key, so moving a prefix or failing over to another region reuses
every finished step.

Canonical form, by type (deterministic, independent of dict insertion order):

- `None`, `bool`, `int`, `str`: themselves (a string that is not valid Unicode, such as a lone
  surrogate, is refused); finite `float`: itself (shortest round-trip repr), or the equal `int` when it is
  integral (`1.0` and `1` are one value; `-0.0` stays `-0.0`); non-finite floats:
  `{"__float__": "nan" | "inf" | "-inf"}`.
- dataclass instance: `{"__class__": QualName, field: value, ...}` (plus `"__code__"`, its class's code
  fingerprint, when it is a user-defined callable: a transform object) without fields marked runtime-only
  (see `runtime_field`), without fields declared `added_field(default)` while they hold that default (a
  field added later: existing steps keep their keys) and without fields marked `secret_field()` (or `metadata={"secret": True}`),
  which are runtime-only too, so rotating a token never reruns a step. Secrets are marked, never guessed from a field's name (`num_experts_per_token`
  is a setting). The class name (not its module) is kept so that two config classes with the same field
  names (say `AdamConfig` and `MuonConfig`) never share a key.
- mapping with only `str` keys: a JSON object; any other mapping (keys that are handles, ints, tuples,
  or strings shaped like the tags here, `__x__`, so a user's `{"__float__": "nan"}` is no NaN):
  `{"__dict__": [[key, value], ...]}` sorted by the key's canonical JSON.
- a `Secret` (in a field, a dict, a list): `None`, whatever its value, so giving or rotating a credential
  never changes the key.
- list: a JSON list; tuple: `{"__tuple__": [...]}` (a namedtuple adds `"__class__"`); set / frozenset:
  `{"__set__": [...]}` sorted.
- enum member: `{"__enum__": "Class.NAME"}`; `pathlib` path: its string; numpy scalar: its Python value.
- module-level function or class: `{"__callable__": "module:qualname"}`, where a function of the file run
  as `__main__` is named as that file is imported (see `stable_module_name`), plus `"__code__"`: the
  fingerprint of its code for user code (a `transform` edited changes the key); a bound method:
  `{"__method__": function, "__self__": its object}`; a `functools.partial`:
  `{"__partial__": function, "args": [...], "kwargs": {...}}`.
- an input (a `StepHandle` or `InputPath`): `{"__step__": key}` or `{"__step__": key, "__path__": "sub"}`.
- any object with a `__schooner_canonical__()` method: the canonical form of what it returns
  (e.g. a tokenizer object returning its fingerprint).

Anything else raises `ConfigError` naming the step, the field path and the fix, as does nesting deeper
than `MAX_DEPTH` levels.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import logging
import math
import pathlib
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, cast

from schooner.cluster._fingerprint import code_fingerprint as code_fingerprint
from schooner.cluster._fingerprint import stable_module_name as stable_module_name
from schooner.cluster._secrets import (
    Secret,
    check_secret_length,
    is_secret_field,
    is_secret_name,
    marked_field,
    register_secret,
)

RUNTIME_META = "schooner_runtime"
"""Dataclass field metadata flag: the field is runtime-only and not part of the step's identity."""


class ConfigError(ValueError):
    """A bad experiment: a config with no canonical form, a cycle, a mutated config, clashing output paths,
    a selection that matches nothing. The message names the step and the field (and the fix)."""


def runtime_field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that does not change the step's identity (worker counts, batch sizes of I/O...).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Cfg:
        ...     vocab_size: int
        ...     num_workers: int = runtime_field(4)
    """
    return marked_field(RUNTIME_META, default, default_factory)


ADDED_META = "schooner_added"
"""Dataclass field metadata flag: a field added after steps were keyed without it (see `added_field`)."""


def added_field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field added to a config after steps were keyed without it: left out of the step's key
    while it holds its default, keyed like any field once set to anything else. So a new option whose default
    does what the config did before it existed reruns nothing. "Holds its default" compares canonical forms
    (`1.0` is `1`).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Cfg:
        ...     vocab_size: int
        ...     new_option: bool = added_field(False)
        >>> canonicalize(Cfg(8)) == {"__class__": "Cfg", "vocab_size": 8}
        True
        >>> canonicalize(Cfg(8, new_option=True))["new_option"]
        True
    """
    if default is dataclasses.MISSING and default_factory is dataclasses.MISSING:
        raise TypeError(
            "added_field needs a default (or default_factory): the value that does what the config did before "
            "the field existed, left out of the step's key"
        )
    return marked_field(ADDED_META, default, default_factory)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return cast(Callable[[], Any], f.default_factory)()


def dumps(obj: Any) -> str:
    """Canonical JSON text of an already canonical object: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def version_key(name: str, canonical_config: Any, version: str | None, code: str | None = None) -> str:
    """The 64-hex-digit SHA-256 key of a step, from its name, canonical config, version string and the
    fingerprint of its function's code (`code_fingerprint`; None for a library function)."""
    text = dumps({"name": name, "config": canonical_config, "version": version, "code": code})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_numpy_scalar(value: Any) -> bool:
    mod = type(value).__module__
    return mod == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0


def canonicalize(config: Any, *, step_name: str = "?", field: str = "config") -> Any:
    """The canonical JSON-able form of `config` (see the module docstring for the rules).

    Args:
        config: a frozen dataclass, mapping, list, scalar... possibly holding step handles.
        step_name: used in error messages only.
        field: the path of `config` itself in error messages (e.g. `config`).

    Raises:
        ConfigError: a value has no canonical form; the message names the step, the field path and the fix.
    """
    return _canon(config, step_name, field, set())


MAX_DEPTH = 100
"""Deepest nesting of containers a config may have (deeper is refused with the field path, not a crash)."""


def _short_path(path: str) -> str:
    return path if len(path) <= 160 else f"{path[:70]}...{path[-70:]}"


def _check_text(text: str, step: str, path: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError(
                f"step {step!r}: config field {_short_path(path)!r} holds a string that is not valid Unicode "
                f"(a lone surrogate {text[e.start]!r} at position {e.start}: {_describe(text)}); such text "
                "cannot be written as UTF-8, so fix the string (e.g. decode its bytes with "
                "errors='replace') before putting it in a config"
            ) from None


_WARNED: set[tuple[str, str]] = set()
_CREDENTIAL_TOKENS = re.compile(
    r"^(hf|huggingface|gh|github|gitlab|wandb|api|access|auth|bearer|refresh|id)_token$", re.I
)


def _looks_like_credential(name: str) -> bool:
    """A field name worth a warning when unmarked: the environment's secret names, less `*_token` names
    other than known credentials (`eot_token`, `pad_token` name vocabulary items)."""
    if not is_secret_name(name):
        return False
    return not name.lower().endswith("_token") or bool(_CREDENTIAL_TOKENS.match(name))


def _warn_unmarked(step: str, path: str, cls: str, name: str) -> None:
    """Say once per class and field that a field named like a credential is keyed and recorded as it is:
    secrets are never guessed from names (that dropped `num_experts_per_token` from keys), so the user marks
    them, and this warning is the only thing the name decides."""
    if (cls, name) in _WARNED:
        return
    _WARNED.add((cls, name))
    logging.getLogger("schooner.cluster").warning(
        f"step {step!r}: config field {_short_path(path)!r} is named like a credential but not marked "
        "secret, so its value is part of the step's key and recorded in plain text; if it is one, declare it "
        "with schooner.cluster.secret_field() or pass Secret(value)"
    )


def _canon(value: Any, step: str, path: str, active: set[int], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ConfigError(
            f"step {step!r}: config field {_short_path(path)!r} is nested more than {MAX_DEPTH} levels deep; "
            "configs are small trees of values: keep large or recursive data in files and pass their path "
            "(or `InputFiles`) instead"
        )
    if isinstance(value, str) and not isinstance(value, enum.Enum):
        _check_text(value, step, path)
        return value
    if value is None or isinstance(value, bool | int) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, Secret):
        return None  # present or not, rotated or not: one key
    if isinstance(value, float):
        if math.isfinite(value):
            if value == 0 and math.copysign(1.0, value) < 0:
                return value  # -0.0 stays a float ("-0.0"): it is not 0 (its sign shows in 1/x, copysign)
            # Equal values give equal keys: `lr=1` and `lr=1.0` are one config.
            return int(value) if value.is_integer() and abs(value) < 2**63 else value
        return {"__float__": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    nxt = depth + 1
    ref = getattr(type(value), "__schooner_ref__", None)
    if ref is not None:
        return ref(value)
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    hook = getattr(value, "__schooner_canonical__", None)
    if hook is not None and not isinstance(value, type):
        return _canon(hook(), step, path + ".__schooner_canonical__()", active, nxt)
    if isinstance(value, pathlib.PurePath):
        return _canon(str(value), step, path, active, nxt)
    if _is_numpy_scalar(value):
        return _canon(value.item(), step, path, active, nxt)
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if id(value) in active:
        raise ConfigError(
            f"step {step!r}: config field {_short_path(path)!r} contains itself (a reference cycle); "
            "configs must be trees of values"
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        active.add(id(value))
        out: dict[str, Any] = {"__class__": type(value).__qualname__}
        if callable(value):  # a callable config object (a transform): what its class's code does counts
            _add_code(out, type(value))
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if is_secret_field(f):
                if isinstance(v, str):
                    try:
                        check_secret_length(
                            v, f"step {step!r}: secret field {_short_path(f'{path}.{f.name}')!r}"
                        )
                    except ValueError as e:
                        raise ConfigError(str(e)) from None
                register_secret(v)  # scrubbed from logs and records of this run
                continue
            if f.metadata.get(RUNTIME_META):
                continue
            if isinstance(v, str) and v and _looks_like_credential(f.name):
                _warn_unmarked(step, f"{path}.{f.name}", type(value).__qualname__, f.name)
            canon = _canon(v, step, f"{path}.{f.name}", active, nxt)
            if f.metadata.get(ADDED_META) and canon == _canon(_default_of(f), step, path, set(), nxt):
                continue  # an added field at its default: the key it had before the field existed
            out[f.name] = canon
        active.discard(id(value))
        return out
    if isinstance(value, Mapping):
        active.add(id(value))
        try:
            if all(isinstance(k, str) and not _is_tag(k) for k in value):
                out = {}
                for k, v in value.items():
                    _check_text(k, step, f"{path}<key {_describe(k)}>")
                    out[k] = _canon(v, step, f"{path}[{k!r}]", active, nxt)
                return out
            # Keys that are handles, ints, tuples... or strings like our tags (`{"__float__": "nan"}` is a
            # user's dict, not a NaN): sorted [key, value] pairs.
            items = []
            for k, v in value.items():
                ck = _canon(k, step, f"{path}<key {_describe(k)}>", active, nxt)
                items.append((dumps(ck), [ck, _canon(v, step, f"{path}[{_describe(k)}]", active, nxt)]))
            items.sort(key=lambda kv: kv[0])
            return {"__dict__": [kv for _, kv in items]}
        finally:
            active.discard(id(value))
    if isinstance(value, list | tuple):
        active.add(id(value))
        out_list = [_canon(v, step, f"{path}[{i}]", active, nxt) for i, v in enumerate(value)]
        active.discard(id(value))
        if isinstance(value, list):
            return out_list
        if hasattr(value, "_fields"):  # a namedtuple: its class, like a dataclass
            return {"__tuple__": out_list, "__class__": type(value).__qualname__}
        return {"__tuple__": out_list}  # (1, 2) and [1, 2] are different values (and types) to a step
    if isinstance(value, set | frozenset):
        members = [_canon(v, step, f"{path}<member>", active, nxt) for v in value]
        return {"__set__": sorted(members, key=dumps)}
    if isinstance(value, types.MethodType):
        # A bound method is its function and its object: Threshold(10).keep is not Threshold(1000).keep.
        return {
            "__method__": _canon(value.__func__, step, path, active, nxt),
            "__self__": _canon(value.__self__, step, f"{path}.__self__", active, nxt),
        }
    if isinstance(value, functools.partial):
        return {
            "__partial__": _canon(value.func, step, f"{path}.func", active, nxt),
            "args": _canon(list(value.args), step, f"{path}.args", active, nxt),
            "kwargs": _canon(dict(value.keywords), step, f"{path}.keywords", active, nxt),
        }
    if callable(value):
        mod = getattr(value, "__module__", None)
        qual = getattr(value, "__qualname__", None)
        if mod and qual and "<" not in qual:
            return _add_code({"__callable__": f"{stable_module_name(mod)}:{qual}"}, value)
        raise ConfigError(
            f"step {step!r}: config field {_short_path(path)!r} holds {_describe(value)}, a lambda or local "
            "function with no stable name; use a module-level function instead"
        )
    raise ConfigError(
        f"step {step!r}: config field {_short_path(path)!r} holds {_describe(value)} of type "
        f"{type(value).__module__}.{type(value).__qualname__}, which has no canonical JSON form; use plain "
        "values (str, int, float, bool, None), dataclasses, lists, tuples or dicts, or give the class a "
        "`__schooner_canonical__()` method returning such values"
    )


def _add_code(out: dict[str, Any], value: Any) -> dict[str, Any]:
    """Note the code fingerprint of a user function or class (library code is named only)."""
    fp = code_fingerprint(value)
    if fp is not None:
        out["__code__"] = fp
    return out


def _is_tag(key: str) -> bool:
    """Keys shaped like the tags of the canonical form (`__float__`, `__step__`, `__class__`...)."""
    return len(key) > 4 and key.startswith("__") and key.endswith("__")


def to_jsonable(value: Any, non_finite: list[str] | None = None, _path: str = "result") -> Any:
    """Best-effort JSON-able copy of a step's return value for its record (never raises).

    Arrays (numpy, jax: anything with `tolist`, `ndim` and `dtype`) become nested lists of their values;
    NaN and infinities become None (JSON has no such numbers; the path of each, like `result['loss']`, is
    appended to `non_finite`); other unknown objects become their `repr`.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if non_finite is not None:
            non_finite.append(f"{_path} = {value}")
        return None
    if _is_numpy_scalar(value):
        return to_jsonable(value.item(), non_finite, _path)
    if all(hasattr(value, a) for a in ("tolist", "ndim", "dtype")) and not isinstance(value, type):
        # numpy/jax arrays: their values (repr() abbreviates past 1,000 elements: values were lost).
        try:
            return to_jsonable(value.tolist(), non_finite, _path)
        except Exception:  # noqa: BLE001 - never raises: an odd array-like records its repr below
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name), non_finite, f"{_path}.{f.name}")
            for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, non_finite, f"{_path}[{str(k)!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v, non_finite, f"{_path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, pathlib.PurePath):
        return str(value)
    return repr(value)
