"""The record layout `{"id", "text", "source", "metadata"}` and normalising other layouts into it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schooner.cluster.storage import json_value

RECORD_FIELDS: tuple[str, ...] = ("id", "text", "source", "metadata")
"""The fields of a record, in the order writers store them."""

_MISSING = object()


def content_id(text: str, source: str = "", salt: str = "") -> str:
    """A deterministic id from the content: 20 hex chars of blake2b over (source, salt, text).

    Example:
        >>> content_id("hello", "web")
        '3fa37527e528d23d0931'
    """
    h = hashlib.blake2b(digest_size=10)
    h.update(source.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(salt.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def make_record(
    text: str, *, source: str, id: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Build a record; the id defaults to `content_id(text, source)`."""
    if not isinstance(text, str):
        raise TypeError(f"make_record: text must be a str, got {type(text).__name__}")
    return {
        "id": id if id is not None else content_id(text, source),
        "text": text,
        "source": source,
        "metadata": dict(metadata or {}),
    }


def _short(value: Any, limit: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


class BadRecord(Exception):
    """Raised by `normalize` with the reason only; readers add the file and line."""


def normalize(
    row: Any, text_field: str | None = "text", id_field: str = "id", default_source: str = ""
) -> dict:
    """Turn one input row into a record, or raise `BadRecord(reason)`.

    `text_field` names the text; `id_field` the id (an int id becomes its decimal string; a missing or
    null id becomes `content_id(text, source)`). A string `source` field is kept, else `default_source`.
    A dict `metadata` field is kept and every other field is merged into it.

    `text_field=None`: rows need no text (they hold other content, such as a chat file's `messages`): the
    text is the row's `text` when it has a string one, else "" (a missing or null `text`); a row without
    an id then gets the content id of the whole row (its fields as canonical JSON), so such rows stay apart.
    """
    if type(row) is not dict:
        raise BadRecord(f"expected a JSON object (a record), got {json_value(row)}")
    # Fast path: the row already is a record in the standard layout.
    if (
        text_field in ("text", None)
        and id_field == "id"
        and len(row) == 4
        and type(row.get("text")) is str
        and type(row.get("id")) is str
        and type(row.get("source")) is str
        and type(row.get("metadata")) is dict
    ):
        return row
    optional = text_field is None
    if optional:
        text_field = "text"
    text = row.get(text_field, _MISSING)
    if optional and (text is _MISSING or text is None):
        text = ""
    elif text is _MISSING:
        fields = ", ".join(sorted(map(str, row))) or "none"
        raise BadRecord(
            f"no {text_field!r} field (fields: {fields}); pass text_field=... naming the field that holds the text"
        )
    if type(text) is not str:
        raise BadRecord(f"field {text_field!r} must be a string, got {json_value(text)}")
    source = row.get("source", _MISSING)
    if source is _MISSING or source is None:
        source = default_source
    elif type(source) is not str:
        raise BadRecord(f"field 'source' must be a string, got {json_value(source)}")
    rid = row.get(id_field)
    if rid is None:
        rid = content_id(text if text or not optional else _row_content(row, id_field), source)
    elif type(rid) is int:
        rid = str(rid)
    elif type(rid) is not str:
        raise BadRecord(f"field {id_field!r} (the id) must be a string or an integer, got {json_value(rid)}")
    meta = row.get("metadata")
    if meta is None:
        meta = {}
    elif type(meta) is not dict:
        raise BadRecord(f"field 'metadata' must be an object, got {json_value(meta)}")
    skip = {text_field, id_field, "source", "metadata"}
    extra = {k: v for k, v in row.items() if k not in skip}
    if extra:
        meta = {**meta, **extra}
    return {"id": rid, "text": text, "source": source, "metadata": meta}


def _row_content(row: dict, id_field: str) -> str:
    """A row's fields but the id and source as canonical JSON (the content a text-less row's id is of)."""
    rest = {str(k): v for k, v in row.items() if k not in (id_field, "source")}
    return json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)


def check_record(rec: Any) -> str | None:
    """Why `rec` is not a record in the standard layout, or None when it is."""
    if type(rec) is not dict:
        return f"expected a dict record, got {type(rec).__name__} {_short(rec)}"
    if len(rec) != 4 or any(k not in rec for k in RECORD_FIELDS):
        have = sorted(map(str, rec))
        return f"a record has exactly the fields {list(RECORD_FIELDS)}, got {have}; move extra fields into 'metadata'"
    for k in ("id", "text", "source"):
        if type(rec[k]) is not str:
            return f"field {k!r} must be a string, got {type(rec[k]).__name__} {_short(rec[k])}"
    if type(rec["metadata"]) is not dict:
        return f"field 'metadata' must be a dict, got {type(rec['metadata']).__name__}"
    return None
