"""Fingerprints of pipeline plans: what decides whether a finished shard or map output may be reused.

A plan's fingerprint covers its inputs (file sizes and modification times, in-memory records, Hugging Face
fingerprints), every operation and the code and values behind it: a function's bytecode, constants,
default arguments, closure values and the module-level values and functions it uses; a callable object's
fields. Change any of them and the fingerprint changes, so `skip_existing` rewrites instead of reusing.

What cannot be fingerprinted (an object without a stable value, such as an open file or a lock) makes
the plan unfingerprintable: nothing is reused then (`fingerprint` returns None and the caller says so).
An object can define `__schooner_fingerprint__()` returning a JSON-able value to take part explicitly.

`token` (how code and values are described) is `schooner.cluster.fingerprint_token`, shared with the step
runner, whose step keys note the code of a step's function and of the callables in its config the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

from schooner.cluster import Unfingerprintable as Unfingerprintable
from schooner.cluster import fingerprint_token as token

from ._json import dumps_json


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
