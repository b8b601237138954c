"""JSON encoding: orjson for speed, the standard library for what orjson refuses (ints beyond 64 bits)."""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTS = orjson.OPT_APPEND_NEWLINE


def dumps_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON of `obj` (no trailing newline).

    Raises:
        TypeError: `obj` holds something JSON cannot represent (bytes, sets, objects, NaN).
    """
    try:
        return orjson.dumps(obj)
    except TypeError:
        return _fallback(obj)


def dumps_line(obj: Any) -> bytes:
    """`dumps_json(obj) + b"\\n"`, the fast path of jsonl writers."""
    try:
        return orjson.dumps(obj, option=_OPTS)
    except TypeError:
        return _fallback(obj) + b"\n"


def _fallback(obj: Any) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise TypeError(f"not JSON-serialisable: {e}") from None
