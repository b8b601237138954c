"""JSON encoding and decoding: orjson for speed, the standard library for integers beyond 64 bits.

orjson refuses to encode integers outside [-2**63, 2**64) and decodes such literals as floats
(`2**70 + 1` would come back as `1.1805916207174113e+21`). Writers fall back to the standard library for
what orjson refuses; readers re-parse, with the standard library, every value orjson turned into a float
that could have been such an integer (an integral float of magnitude >= 2**63), so big integers round-trip
exactly and ordinary data never leaves the fast path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import orjson

_OPTS = orjson.OPT_APPEND_NEWLINE
_BIG = 2.0**63


def dumps_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON of `obj` (no trailing newline); integers of any size are kept exact.

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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _suspect(obj: Any) -> bool:
    """Whether a decoded value holds a float that may stand for an integer orjson could not decode.

    A plain loop (no generators): it runs on every record read, so it must cost next to nothing for the
    usual records, whose numbers are small and whose bulk is strings."""
    t = type(obj)
    if t is dict:
        values: Any = obj.values()
    elif t is list:
        values = obj
    elif t is float:
        return abs(obj) >= _BIG and obj.is_integer()
    else:
        return False
    for v in values:
        tv = type(v)
        if tv is str or tv is int or tv is bool or v is None:
            continue
        if tv is float:
            if abs(v) >= _BIG and v.is_integer():
                return True
        elif _suspect(v):
            return True
    return False


def exact(obj: Any, raw: bytes | str) -> Any:
    """`obj` (orjson's decoding of `raw`), re-decoded exactly when it may hold integers beyond 64 bits."""
    if _suspect(obj):
        return json.loads(raw, parse_constant=_reject_constant)
    return obj


def loads_json(raw: bytes | str) -> Any:
    """Decode JSON like `orjson.loads`, but integers of any size come back as exact ints.

    Raises:
        orjson.JSONDecodeError: `raw` is not valid JSON.
    """
    return exact(orjson.loads(raw), raw)


class _NotPlain(Exception):
    """A value `copy_json`'s fast walk leaves to the encoder."""


def copy_json(obj: Any, encode: Callable[[Any], bytes] = dumps_json) -> Any:
    """`loads_json(dumps_json(obj))` without the encoding: fresh dicts and lists, the same strings and numbers.

    The walk takes the usual JSON values (dicts with string keys, lists, strings that UTF-8 can encode, ints,
    bools, None, finite floats); anything else (a tuple, a non-string key, NaN, another type) goes through
    `encode` (`dumps_json` or a wrapper naming the record in its error) and the decoder, so the result is
    what a file would give back, or the encoder's `TypeError`.
    ~4 us for a 6 KB page record, where the round trip costs 30-100 us.
    """
    try:
        return _copy(obj)
    except _NotPlain:
        return loads_json(encode(obj))


def _copy(obj: Any) -> Any:
    t = type(obj)
    if t is dict:
        out = {}
        for k, v in obj.items():
            if type(k) is not str:
                raise _NotPlain
            _check_str(k)
            out[k] = _copy(v)
        return out
    if t is str:
        _check_str(obj)
        return obj
    if t is int or t is bool or obj is None:
        return obj
    if t is list:
        return [_copy(v) for v in obj]
    if t is float and obj - obj == 0.0:  # finite (inf - inf and NaN - NaN are NaN)
        return obj
    raise _NotPlain


def _check_str(s: str) -> None:
    if not s.isascii() and not _one_byte(s):
        try:
            s.encode("utf-8")  # lone surrogates: the encoder refuses them
        except UnicodeEncodeError:
            raise _NotPlain from None


_BASE = sys.getsizeof("\xe9") - 2


def _one_byte(s: str) -> bool:
    """Whether CPython stores `s` one byte a character (all below U+0100: no surrogates), from its size in
    O(1), where encoding a page's text to find out costs ~7 us. A string of wider storage, or one carrying
    a cached UTF-8 copy, reads as not one-byte (then it is encoded): never a wrong yes."""
    return _SIZES_KNOWN and sys.getsizeof(s) - _BASE < 2 * (len(s) + 1)


_SIZES_KNOWN = True
# another string layout than CPython's: always encode
_SIZES_KNOWN = _one_byte("\xe9" * 9) and not _one_byte("\u0100" * 9) and not _one_byte("\ud800")
