"""Reading files through the storage layer: whole files, streamed files, and JSON lines.

Public through `schooner.cluster.storage`. `read_json_lines` is the shared JSON-lines reader for input files
(prompts, task files, samples, sweep results), so a bad row is named the same way everywhere: `path:line`,
what is wrong, and the fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import IO, Any

from ._paths import is_local, local_path, url_to_fs


def exists(path: str) -> bool:
    """Whether a file or folder exists at `path`."""
    if is_local(path):
        return os.path.exists(local_path(path))
    fs, p = url_to_fs(path)
    return bool(fs.exists(p))


def isdir(path: str) -> bool:
    """Whether `path` is a folder (on object stores: a prefix holding objects)."""
    if is_local(path):
        return os.path.isdir(local_path(path))
    fs, p = url_to_fs(path)
    return bool(fs.isdir(p))


def file_size(path: str) -> int:
    """The size of a file in bytes (`FileNotFoundError` when it is missing)."""
    if is_local(path):
        return os.path.getsize(local_path(path))
    fs, p = url_to_fs(path)
    return int(fs.size(p))


def open_file(path: str, mode: str = "rb") -> IO[Any]:
    """A file open for reading (`"rb"` or `"r"`, UTF-8): plain `open` locally, fsspec otherwise.

    Writes go through `atomic_open` or the `write_*` functions, so no reader ever sees a part.
    """
    if mode not in ("r", "rb"):
        raise ValueError(
            f"open_file reads only (mode 'r' or 'rb'); got mode={mode!r}: write with atomic_open"
        )
    encoding = "utf-8" if mode == "r" else None
    if is_local(path):
        return open(local_path(path), mode, encoding=encoding)
    fs, p = url_to_fs(path)
    opened: IO[Any] = fs.open(p, mode, encoding=encoding) if encoding else fs.open(p, mode)
    return opened


def read_bytes(path: str) -> bytes:
    """The content of a file (`FileNotFoundError` when it is missing)."""
    if is_local(path):
        with open(local_path(path), "rb") as f:
            return f.read()
    fs, p = url_to_fs(path)
    return bytes(fs.cat_file(p))


def read_text(path: str) -> str:
    """The UTF-8 text of a file (`FileNotFoundError` when it is missing)."""
    return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
    """The JSON value of a file (integers of any size exact), read strictly (`loads_json`).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is not JSON (NaN, Infinity and -Infinity too, which Python's `json` reads and
            RFC 8259, jq and JavaScript's `JSON.parse` refuse); the message names the file, line and column.
    """
    return loads_json(read_text(path), path)


def loads_json(text: str, where: str) -> Any:
    """The JSON value of `text`, read strictly: the one parser of the platform's own JSON records.

    Python's `json.loads` also reads `NaN`, `Infinity` and `-Infinity`, and reads a number too large for a
    float (`1e999`) as infinity; none of them is JSON, so other readers (jq, JavaScript's `JSON.parse`) refuse
    a file holding one. Every writer here refuses them (`storage.dumps_json`), so one met here came from
    elsewhere: it is refused with the file (`where`), line and column, and the fix.

    Raises:
        NotStandardJSON: (a ValueError) `text` holds NaN, Infinity, -Infinity or a number too large for a
            float; the command line prints its message alone (no traceback) and exits with status 2.
        ValueError: `text` is not JSON otherwise.

    Example:
        >>> from schooner.cluster import storage
        >>> storage.loads_json('{"loss": 2.5}', "run.json")
        {'loss': 2.5}
        >>> storage.loads_json('{\\n "loss": NaN\\n}', "run.json")
        Traceback (most recent call last):
        schooner.cluster.storage.NotStandardJSON: run.json: line 2, column 10 holds NaN, which is not JSON (jq and JavaScript's JSON.parse refuse it); write null for a number that does not exist (or a string such as "nan"), or the number itself
    """
    import json

    try:
        return strict_loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except NotStandardJSON as e:
        token = e.args[0]
        at = _outside_strings(text, token)
        line = text.count("\n", 0, at) + 1
        column = at - (text.rfind("\n", 0, at) + 1) + 1
        what = (
            f"{token[:40]}, too large for a float (Python reads it as infinity)"
            if isinstance(e, _TooLargeForFloat)
            else f"{token}, which is not JSON (jq and JavaScript's JSON.parse refuse it)"
        )
        raise NotStandardJSON(
            f"{where}: line {line}, column {column} holds {what}; write null for a number that does not "
            'exist (or a string such as "nan"), or the number itself'
        ) from None


def _outside_strings(text: str, token: str) -> int:
    """Where `token` first stands outside a JSON string in `text` (0 when it does not)."""
    in_string = escaped = False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif text.startswith(token, i) and not (i and (text[i - 1].isalnum() or text[i - 1] in ".-+")):
            return i
    return 0


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_NEWLINE = b"\n"
BOM = b"\xef\xbb\xbf"
"""UTF-8's byte-order mark, as Windows tools write it first: read past at the start of a JSON-lines file."""
_ONE_PER_LINE = "write one JSON object per line"


def read_json_lines(path: str, *, what: str = "") -> Iterator[tuple[int, dict[str, Any]]]:
    """`(line number, row)` for each JSON object of a JSON-lines file, in file order, streamed.

    Reads every path `open_file` reads (local paths, `file://` and fsspec URLs); a name ending in `.gz` is
    gunzipped. Lines end at `\\n` only (a raw U+2028 inside a JSON string stays in its row), blank lines are
    skipped (line numbers count them), and a UTF-8 byte-order mark at the start of the file is read past.

    It streams: the call reads nothing and raises nothing; the file is opened when the first row is asked
    for, and every error below (a missing file too) is raised while iterating, after the rows before it have
    been yielded. Catch errors around the loop (or `list(...)`), not around the call.

    Args:
        path: the file.
        what: who reads, put before every message (`"grpo"` gives `grpo: rows.jsonl:3 is not valid JSON ...`).

    Raises (while iterating):
        FileNotFoundError: no file at `path`; the message names it.
        ValueError: a line that is not UTF-8, not JSON (NaN, Infinity and -Infinity too, which Python's `json`
            reads and RFC 8259 lacks: a fit fed a NaN loss fails far from the file; and a number too large
            for a float, `1e999`, which it reads as inf) or not a JSON object (named in JSON's words: an array,
            a string, null), named `path:line` with the fix; a `.gz` file that is not gzip data, or is cut short
            (a 0-byte one too: an empty gzip stream is 20 bytes) or corrupt (the message names the last line
            read whole); a `.zst` file (not decoded here). An empty file (or empty gzip stream) is no rows
            and no error: a caller that needs rows says so.

    Example:
        >>> from schooner.cluster import storage
        >>> storage.write_text("memory://demo-json-lines/rows.jsonl", '{"a": 1}\\n\\n{"a": 2}\\n')
        >>> list(storage.read_json_lines("memory://demo-json-lines/rows.jsonl"))
        [(1, {'a': 1}), (3, {'a': 2})]
        >>> rows = storage.read_json_lines("memory://demo-json-lines/missing.jsonl")  # nothing read yet
        >>> next(rows)
        Traceback (most recent call last):
        FileNotFoundError: no JSON-lines file at 'memory://demo-json-lines/missing.jsonl'
    """
    import json

    who = f"{what}: " if what else ""
    if path.endswith((".zst", ".zstd")):
        raise ValueError(
            f"{who}{path}: zstd-compressed JSON lines are not decoded here; decompress it (`zstd -d {path}`) "
            "or write it plain or gzip-compressed (.gz)"
        )
    offset = 0
    for n, raw in _raw_lines(path, who):
        text = decode_utf8(raw, path, what=what, line=n, offset=offset)
        offset += len(raw)
        if not text.strip():
            continue
        try:
            # with its line end, an unclosed object was "at column 1"
            row = json.loads(
                text.rstrip("\r\n"), parse_constant=_not_json_constant, parse_float=_finite_float
            )
        except _NotJSONConstant as e:
            raise ValueError(
                f"{who}{path}:{n} holds {e.args[0]}, which is not JSON (the line starts {text.rstrip()[:80]!r}); "
                "write null for a missing number, or the number itself; every writer here refuses these "
                "(`json.dumps(..., allow_nan=False)`)"
            ) from None
        except _TooLargeForFloat as e:
            raise ValueError(
                f"{who}{path}:{n} holds {e.args[0][:40]}, too large for a float (it would be read as infinity; "
                f"the line starts {text.rstrip()[:80]!r}); write null for a missing number, or a finite one"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{who}{path}:{n} is not valid JSON ({e.msg} at column {e.colno}; the line starts "
                f"{text.rstrip()[:80]!r}); {_ONE_PER_LINE}"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{who}{path}:{n} is {json_kind(row)}, not a JSON object ({text.rstrip()[:80]!r}); "
                f"{_ONE_PER_LINE}"
            )
        yield n, row


class NotStandardJSON(ValueError):
    """A number Python's `json` reads and JSON lacks (NaN, Infinity, -Infinity, `1e999`) in a file read as
    JSON (`loads_json`, `read_json`, the readers of `schooner.cluster.records`); the message names the file,
    line and column, and the fix."""


def strict_loads(text: str) -> Any:
    """`json.loads(text)` refusing what JSON lacks: `NotStandardJSON` for NaN, Infinity, -Infinity and a
    number too large for a float (`loads_json` names where), `json.JSONDecodeError` for text not JSON."""
    import json

    return json.loads(text, parse_constant=_not_json_constant, parse_float=_finite_float)


class _NotJSONConstant(NotStandardJSON):
    """NaN, Infinity or -Infinity met while parsing: Python's `json` reads them, RFC 8259 has no such values."""


def _not_json_constant(name: str) -> Any:
    raise _NotJSONConstant(name)


class _TooLargeForFloat(NotStandardJSON):
    """A JSON number beyond a float's range (`1e999`): Python's `json` reads it as inf, the value refused above."""


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise _TooLargeForFloat(text)
    return value


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words: "an object", "an array", "a string", "a number", "null",
    "true" or "false".

    The user wrote JSON, not Python: a reader of JSON input names a value of the wrong kind this way ("is an
    array, not a JSON object"), not by its Python type (list, dict, NoneType). `read_json_lines`, eval's
    `.json` task files and `records.read_metrics` do.

    Raises:
        TypeError: a value `json.loads` never returns (a tuple, a set, ...).

    Example:
        >>> from schooner.cluster import storage
        >>> [storage.json_kind(v) for v in ({"a": 1}, [1], "x", 2.5, None, True)]
        ['an object', 'an array', 'a string', 'a number', 'null', 'true']
    """
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"), (int | float, "a number"))
    for kind, name in kinds:
        if isinstance(value, kind):
            return name
    raise TypeError(f"json_kind: {value!r} is a {type(value).__name__}, no parsed JSON value")


def json_value(value: Any, limit: int = 60) -> str:
    """A value of the wrong kind as an input error names it: its kind in JSON's words, then the value as JSON,
    cut to `limit` characters ("a number: 5", "an array: [1, 2]", "null"). A value no JSON reader returns (a
    parquet or `datasets` row's bytes, datetime or numpy scalar) is named by its Python type ("a bytes value:
    b'x'"). lib/data's records and eval's task rows word their "got ..." this way.

    Example:
        >>> from schooner.cluster import storage
        >>> [storage.json_value(v) for v in ("1", 5, [1, 2], None, b"x")]
        ['a string: "1"', 'a number: 5', 'an array: [1, 2]', 'null', "a bytes value: b'x'"]
    """
    import json

    def clip(text: str) -> str:
        return text if len(text) <= limit else text[: limit - 3] + "..."

    try:
        kind = json_kind(value)
    except TypeError:
        kind = type(value).__name__
        return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} value: {clip(repr(value))}"
    if value is None or isinstance(value, bool):
        return kind  # null, true, false: the kind is the value
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # a parquet struct or list holding a non-JSON value
        shown = repr(value)
    return f"{kind}: {clip(shown)}"


def _raw_lines(path: str, who: str) -> Iterator[tuple[int, bytes]]:
    """`(line number, bytes)` of a file, gunzipped when its name ends in `.gz`; gzip errors named."""
    import contextlib
    import gzip
    import zlib

    n = 0
    try:
        f = open_file(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{who}no JSON-lines file at {path!r}") from None
    try:
        gz = path.endswith(".gz")
        with f, gzip.GzipFile(fileobj=f, mode="rb") if gz else contextlib.nullcontext(f) as lines:
            for n, raw in enumerate(lines, 1):
                yield n, raw
            if gz and n == 0 and f.tell() == 0:  # gzip reads 0 bytes as no members: no error of its own
                raise _broken_gzip(
                    f"{who}{path}",
                    "truncated (the file is empty: 0 bytes, where an empty gzip stream is 20)",
                    0,
                )
    except gzip.BadGzipFile as e:
        with open_file(path, "rb") as g:
            head = g.read(8)
        if not head.startswith(GZIP_MAGIC):
            raise ValueError(
                f"{who}{path}: the name ends in .gz but the file is not gzip data (it starts with {head!r}); "
                "compress it with gzip, or rename it without .gz"
            ) from None
        cause = str(e)
        if cause.startswith("Not a gzipped file"):  # gzip data, then bytes that start no further gzip member
            cause = f"bytes after the end of the compressed stream: {cause}"
        raise _broken_gzip(f"{who}{path}", f"corrupt ({cause})", n) from None
    except EOFError:
        raise _broken_gzip(
            f"{who}{path}", "truncated (the compressed stream stops before its end)", n
        ) from None
    except zlib.error as e:
        raise _broken_gzip(f"{who}{path}", f"corrupt ({e})", n) from None


def _broken_gzip(where: str, what: str, lines: int) -> ValueError:
    """A ValueError for gzip data that is cut short or corrupt: the file, the last line read whole, the fix."""
    last = f"the last line read whole is line {lines}" if lines else "it ends before line 1 was read whole"
    return ValueError(
        f"{where}: the gzip data is {what}; {last}: the file was cut short or damaged (e.g. an interrupted "
        "copy or write); re-create it (or copy it again)"
    )


def decode_utf8(data: bytes, path: str, *, what: str = "", line: int = 1, offset: int = 0) -> str:
    """The UTF-8 text of `data`: the bytes of the file `path` from its byte `offset` on, where line `line`
    starts (the defaults: the whole file). A UTF-8 byte-order mark at the file's start is read past.

    The one decoder of Schooner's input files (task files, task YAML, JSON lines), so a file that is not UTF-8
    is named the same way everywhere: `path:line`, the byte, its column and offset, and the fix.

    Args:
        data: the bytes (of a `.gz` file: decompressed).
        path: the file, named in the error.
        what: who reads, put before the message (as `read_json_lines`'s `what`).
        line, offset: where `data` starts in the file (1 and 0: its start).

    Raises:
        ValueError: bytes that are not UTF-8, e.g. `rows.jsonl:2 is not UTF-8 text (byte 0xe9 at column 11,
            offset 40 in the file: invalid continuation byte); re-encode it as UTF-8, e.g. iconv ...`;
            gzip or zstd data under a plain name, and UTF-16 text (a byte-order mark `ff fe` or `fe ff`), are
            said so.

    Example:
        >>> from schooner.cluster import storage
        >>> storage.decode_utf8(b"\\xef\\xbb\\xbfname: t\\n", "task.yaml")
        'name: t\\n'
        >>> storage.decode_utf8(b"ok\\nd\\xe9j\\xe0\\n", "notes.txt")
        Traceback (most recent call last):
        ValueError: notes.txt:2 is not UTF-8 text (byte 0xe9 at column 2, offset 4 in the file: invalid continuation byte); re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`
    """
    start = 0
    if offset == 0 and data.startswith(BOM):
        start = len(BOM)
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = start + e.start
        line_start = data.rfind(_NEWLINE, 0, at) + 1
        bad = data[at : at + 1]
        if data.startswith(GZIP_MAGIC) and offset == 0:
            hint = "it is gzip-compressed: name it *.gz (e.g. rows.jsonl.gz), or decompress it"
        elif data.startswith(ZSTD_MAGIC) and offset == 0:
            hint = "it is zstd-compressed: decompress it (`zstd -d`), or recompress it with gzip as *.gz"
        elif data.startswith((b"\xff\xfe", b"\xfe\xff")) and offset == 0:
            hint = "it is UTF-16: `iconv -f utf-16 -t utf-8 in > out`"
        else:
            hint = "re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`"
        where = f"{what + ': ' if what else ''}{path}:{line + data.count(_NEWLINE, 0, at)}"
        file = "the decompressed file" if path.endswith(".gz") else "the file"
        raise ValueError(
            f"{where} is not UTF-8 text (byte 0x{bad.hex()} at column {at - line_start + 1}, offset "
            f"{offset + at} in {file}: {e.reason}); {hint}"
        ) from None
