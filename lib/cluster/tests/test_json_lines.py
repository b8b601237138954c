"""`storage.read_json_lines`, the shared JSON-lines reader for input files: rows with their line numbers, on every
path storage reads, and every bad line named as `path:line` with what is wrong and the fix."""

from __future__ import annotations

import doctest
import gzip
import json
import sys
from pathlib import Path

import pytest

from schooner.cluster import storage

ROWS = [{"id": "a", "text": "héllo"}, {"id": "b", "n": 2**70 + 1, "nested": {"x": [1, None, True]}}]


def _put(root: str, name: str, data: bytes) -> str:
    path = storage.join(root, name)
    storage.write_bytes(path, data)
    return path


def _lines(rows: list, sep: str = "\n") -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + sep for r in rows).encode()


def _error(path: str, what: str = "") -> str:
    with pytest.raises(ValueError) as info:
        list(storage.read_json_lines(path, what=what))
    return str(info.value)


def test_rows_come_with_their_line_numbers_and_blank_lines_are_skipped(root: str) -> None:
    data = b"\n" + _lines(ROWS[:1]) + b"   \n\t\n" + _lines(ROWS[1:])
    path = _put(root, "rows.jsonl", data)
    assert list(storage.read_json_lines(path)) == [(2, ROWS[0]), (5, ROWS[1])]


def test_a_last_line_without_newline_and_windows_line_ends_are_read(root: str) -> None:
    path = _put(root, "crlf.jsonl", _lines(ROWS, sep="\r\n").removesuffix(b"\r\n"))
    assert list(storage.read_json_lines(path)) == [(1, ROWS[0]), (2, ROWS[1])]


def test_a_line_separator_inside_a_string_does_not_split_the_row(root: str) -> None:
    # JSON allows U+2028/U+2029 (and U+0085) raw inside strings, and json.dumps writes them so; str.splitlines
    # split such a row in two, and the halves failed as bad JSON
    rows = [{"text": "one\u2028two\u2029three\x85four\x0bfive\x1cend"}, ROWS[0]]
    path = _put(root, "separators.jsonl", _lines(rows))
    assert list(storage.read_json_lines(path)) == [(1, rows[0]), (2, rows[1])]


def test_bad_json_names_path_line_error_text_and_fix(root: str) -> None:
    path = _put(root, "bad.jsonl", _lines(ROWS[:1]) + b"\n" + b'{"id": "c", text: 1}\n')
    message = _error(path, what="grpo")
    assert message.startswith(f"grpo: {path}:3 is not valid JSON (Expecting property name"), message
    assert "column 13" in message and "text: 1" in message and "one JSON object per line" in message, message


@pytest.mark.parametrize("sep", ["\n", "\r\n"])
def test_an_unclosed_object_before_another_line_is_named_at_its_lines_end(root: str, sep: str) -> None:
    # the line was parsed with its line end, so json saw the object cut at "line 2 column 1" and said column 1
    line = '{"id": "c", "text": "x"'
    path = _put(root, "unclosed.jsonl", (line + sep + json.dumps(ROWS[0]) + sep).encode())
    message = _error(path)
    assert message.startswith(
        f"{path}:1 is not valid JSON (Expecting ',' delimiter at column {len(line) + 1};"
    )
    assert repr(line) in message, message


def test_rows_before_a_bad_line_stream_out_first(root: str) -> None:
    path = _put(root, "late.jsonl", _lines(ROWS) + b"not json\n")
    rows = storage.read_json_lines(path)
    assert next(rows) == (1, ROWS[0]) and next(rows) == (2, ROWS[1])
    with pytest.raises(ValueError, match=r"late\.jsonl:3 is not valid JSON"):
        next(rows)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b"[1, 2]", "an array"),
        (b'"text"', "a string"),
        (b"3", "a number"),
        (b"-2.5e3", "a number"),
        (b"null", "null"),
        (b"true", "true"),
        (b"false", "false"),
    ],
)
def test_a_row_that_is_not_an_object_names_path_line_and_its_json_type(
    root: str, line: bytes, kind: str
) -> None:
    """The user wrote JSON: the message names JSON's types (array, string, null), not Python's (list, str,
    NoneType)."""
    path = _put(root, "scalar.jsonl", _lines(ROWS[:1]) + line + b"\n")
    message = _error(path, what="task 'arc'")
    assert message.startswith(f"task 'arc': {path}:2 is {kind}, not a JSON object"), message
    assert "one JSON object per line" in message, message
    assert not any(name in message for name in ("list", "str ", "int", "float", "NoneType", "bool")), message


@pytest.mark.parametrize(
    ("value", "kind"),
    [({}, "an object"), ([1], "an array"), ("x", "a string"), (3, "a number"), (2.5, "a number")]
    + [(None, "null"), (True, "true"), (False, "false")],
)
def test_json_kind_names_a_parsed_value_in_jsons_words(value, kind: str) -> None:
    """One namer of a JSON value's kind for every reader of JSON input (JSON lines, eval's .json task files,
    metrics.jsonl), so each says "an array" where the user wrote one."""
    assert storage.json_kind(value) == kind
    assert storage.json_kind(json.loads(json.dumps(value))) == kind


def test_json_kind_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(TypeError, match=r"json_kind: \(1, 2\) is a tuple, no parsed JSON value"):
        storage.json_kind((1, 2))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("1", 'a string: "1"'),
        (5, "a number: 5"),
        ({"a": [1]}, 'an object: {"a": [1]}'),
        (None, "null"),
        (False, "false"),
        (b"x", "a bytes value: b'x'"),  # no JSON reader returns bytes: named by its type
        (bytearray(b"x"), "a bytearray value: bytearray(b'x')"),
        (Ellipsis, "an ellipsis value: Ellipsis"),  # "an" before a vowel
        pytest.param("é" * 70, 'a string: "' + "é" * 56 + "...", id="long"),  # the JSON cut to 60 characters
    ],
)
def test_json_value_names_the_kind_and_shows_the_value_as_json(value, shown: str) -> None:
    """lib/data's records and eval's task rows say "got a number: 5"; the value is shown as the user wrote it."""
    assert storage.json_value(value) == shown


def test_gzip_by_name_reads_the_same_rows(root: str) -> None:
    data = b"\n" + _lines(ROWS)
    plain, packed = _put(root, "rows.jsonl", data), _put(root, "rows.jsonl.gz", gzip.compress(data))
    assert (
        list(storage.read_json_lines(packed))
        == list(storage.read_json_lines(plain))
        == [(2, ROWS[0]), (3, ROWS[1])]
    )


def test_a_gz_name_on_plain_text_names_path_and_fix(root: str) -> None:
    path = _put(root, "plain.jsonl.gz", _lines(ROWS))
    message = _error(path)
    assert path in message and "not gzip data" in message and "rename" in message, message


def _read_until_error(path: str) -> tuple[int, str]:
    """How many rows came out before the error, and its message."""
    rows = []
    with pytest.raises(ValueError) as info:
        for n, _ in storage.read_json_lines(path):
            rows.append(n)
    return (rows[-1] if rows else 0), str(info.value)


def test_truncated_gzip_names_path_and_the_last_line_read_whole(root: str) -> None:
    data = gzip.compress(_lines(ROWS * 200))
    path = _put(root, "cut.jsonl.gz", data[: len(data) // 2])
    last, message = _read_until_error(path)
    assert last > 0, message
    assert message.startswith(f"{path}: the gzip data is truncated"), message
    assert f"the last line read whole is line {last}" in message, message
    assert "re-create" in message, message


@pytest.mark.parametrize("keep", [5, 12, 30])
def test_gzip_cut_before_its_first_line_says_so_not_line_0(root: str, keep: int) -> None:
    """Cut inside the header (5 bytes) or inside the first line: no line was read whole ("line 0" said
    nothing)."""
    path = _put(root, "cut.jsonl.gz", gzip.compress(_lines(ROWS * 200))[:keep])
    message = _error(path)
    assert "line 0" not in message, message
    assert message.startswith(f"{path}: the gzip data is truncated"), message
    assert "before line 1 was read whole" in message and "re-create" in message, message


@pytest.mark.parametrize(("where", "cause"), [(-6, "CRC check failed"), (None, "after the end")])
def test_corrupt_gzip_is_called_corrupt_not_not_gzip(root: str, where: int | None, cause: str) -> None:
    """A bad checksum in the trailer, or bytes after the end of the stream: the file is gzip (it starts with
    gzip's magic bytes), so "not gzip data ... rename it" was the wrong fix."""
    data = bytearray(gzip.compress(_lines(ROWS * 3)))
    if where is None:
        data += b"junk"
    else:
        data[where] ^= 0xFF
    path = _put(root, "bad.jsonl.gz", bytes(data))
    last, message = _read_until_error(path)
    assert last == 6, message
    assert message.startswith(f"{path}: the gzip data is corrupt"), message
    assert "not gzip data" not in message and "rename" not in message, message
    assert cause in message and "the last line read whole is line 6" in message and "re-create" in message


def test_not_utf8_names_path_line_byte_and_fix(root: str) -> None:
    path = _put(
        root,
        "latin1.jsonl",
        _lines(ROWS[:1]) + json.dumps({"t": "café"}, ensure_ascii=False).encode("latin-1"),
    )
    message = _error(path)
    assert message.startswith(f"{path}:2 is not UTF-8 text (byte 0xe9"), message
    assert "iconv" in message, message


def test_not_utf8_names_the_byte_offset_in_the_file_plain_and_decompressed(root: str) -> None:
    first = _lines(ROWS[:1])
    data = first + b'{"t": "caf\xe9"}\n'
    offset = len(first) + len(b'{"t": "caf')
    plain, packed = _put(root, "latin1.jsonl", data), _put(root, "latin1.jsonl.gz", gzip.compress(data))
    for path, file in ((plain, "the file"), (packed, "the decompressed file")):
        message = _error(path)
        expected = f"{path}:2 is not UTF-8 text (byte 0xe9 at column 11, offset {offset} in {file}:"
        assert message.startswith(expected), message


# ------------------------------------------------------------------ decode_utf8: a whole file's text


def test_decode_utf8_reads_text_past_a_leading_byte_order_mark_only() -> None:
    bom = b"\xef\xbb\xbf"
    assert storage.decode_utf8(bom + "héllo\n".encode(), "a.yaml") == "héllo\n"
    assert storage.decode_utf8(bom + b"x", "a.yaml", line=3, offset=40) == "\ufeffx"  # not the file's start


def test_decode_utf8_names_path_line_column_offset_byte_and_fix() -> None:
    data = "name: t\npath: x\nlayout: café\n".encode("latin-1")
    with pytest.raises(ValueError) as info:
        storage.decode_utf8(data, "task.yaml", what="task 't'")
    assert str(info.value) == (
        "task 't': task.yaml:3 is not UTF-8 text (byte 0xe9 at column 12, offset 27 in the file: invalid "
        "continuation byte); re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`"
    )
    with pytest.raises(ValueError, match=r"^rows.jsonl:1 .*offset 1 in the file.*name it \*\.gz"):
        storage.decode_utf8(gzip.compress(b"{}"), "rows.jsonl")


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_decode_utf8_says_a_utf16_file_is_utf16(root: str, codec: str) -> None:
    bom = b"\xff\xfe" if codec == "utf-16-le" else b"\xfe\xff"
    data = bom + "name: t\nlayout: café\n".encode(codec)
    with pytest.raises(ValueError) as info:
        storage.decode_utf8(data, "task.yaml")
    message = str(info.value)
    assert message.startswith("task.yaml:1 is not UTF-8 text (byte 0x"), message
    assert "it is UTF-16: `iconv -f utf-16 -t utf-8 in > out`" in message and "latin1" not in message, message
    path = _put(root, "wide.jsonl", bom + _lines(ROWS).decode().encode(codec))
    assert "it is UTF-16" in _error(path)


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (gzip.compress(_lines(ROWS)), "gzip-compressed: name it *.gz"),
        (b"\x28\xb5\x2f\xfd\x00\x58" + b"\xff" * 8, "zstd"),
    ],
)
def test_compressed_data_under_a_plain_name_says_so(root: str, data: bytes, hint: str) -> None:
    path = _put(root, "packed.jsonl", data)
    message = _error(path)
    assert f"{path}:1" in message and hint in message, message


def test_a_zstd_name_is_refused_with_the_fix(root: str) -> None:
    path = _put(root, "rows.jsonl.zst", _lines(ROWS))
    message = _error(path, what="grpo")
    assert message.startswith(f"grpo: {path}: "), message
    assert "zstd" in message and "decompress" in message, message


def test_a_byte_order_mark_is_read_past_at_the_start_only(root: str) -> None:
    bom = b"\xef\xbb\xbf"
    path = _put(root, "bom.jsonl", bom + _lines(ROWS))
    assert list(storage.read_json_lines(path)) == [(1, ROWS[0]), (2, ROWS[1])]
    packed = _put(root, "bom.jsonl.gz", gzip.compress(bom + _lines(ROWS)))
    assert list(storage.read_json_lines(packed)) == [(1, ROWS[0]), (2, ROWS[1])]
    later = _put(root, "later.jsonl", _lines(ROWS[:1]) + bom + _lines(ROWS[1:]))
    assert f"{later}:2 is not valid JSON" in _error(later)


def test_a_missing_file_names_its_path(root: str) -> None:
    path = storage.join(root, "nowhere", "rows.jsonl")
    with pytest.raises(FileNotFoundError) as info:
        list(storage.read_json_lines(path, what="samples"))
    assert str(info.value).startswith(f"samples: no JSON-lines file at {path!r}"), info.value


def test_an_empty_file_has_no_rows(root: str) -> None:
    assert list(storage.read_json_lines(_put(root, "empty.jsonl", b""))) == []
    assert list(storage.read_json_lines(_put(root, "empty.jsonl.gz", gzip.compress(b"\n \n")))) == []


def test_a_zero_byte_gz_file_is_cut_short_not_empty(root: str) -> None:
    """A 0-byte `.gz` is no gzip data at all (an empty gzip stream is 20 bytes: header and trailer): a copy
    or write cut before its first byte. It was read as no rows, with no error, where a `.gz` cut one byte
    later was "truncated"."""
    assert len(gzip.compress(b"")) == 20
    assert list(storage.read_json_lines(_put(root, "empty.jsonl.gz", gzip.compress(b"")))) == []
    path = _put(root, "zero.jsonl.gz", b"")
    message = _error(path, what="task 'arc'")
    assert message.startswith(f"task 'arc': {path}: the gzip data is truncated"), message
    assert "0 bytes" in message and "cut short" in message and "re-create it" in message, message


def test_the_docstring_example_runs() -> None:
    module = sys.modules[storage.read_json_lines.__module__]  # where the reader lives, behind storage
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0, module.__name__


# ------------------------------------------------------------------ its callers in this package


def test_a_step_card_shows_samples_jsonl_rows_and_names_a_bad_line(tmp_path: Path) -> None:
    from schooner.cluster.views._samples import samples_section

    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, data in (
        (good, _lines([{"prompt": "a\u2028b", "score": 1}, {"prompt": "c"}])),
        (bad, b'{"a": 1}\n[2]\n'),
    ):
        folder.mkdir()
        (folder / "samples.jsonl").write_bytes(data)
    shown = samples_section(str(good), [("samples.jsonl", None, False)])
    assert "(samples.jsonl, 2)" in shown and "a\u2028b" in shown, shown
    refused = samples_section(str(bad), [("samples.jsonl", None, False)])
    assert (
        "samples.jsonl is not a list of samples" in refused
        and f"{bad}/samples.jsonl:2 is an array" in refused
    )
    assert (
        samples_section(str(tmp_path), [("samples.jsonl", None, False)]) == ""
    )  # gone since listed: nothing


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'{"a": 1}', "it holds an object, not an array of objects"),
        (b'[{"a": 1}, null]', "item 1 is null, not an object"),
    ],
)
def test_a_step_card_names_a_bad_samples_json_in_jsons_words(tmp_path: Path, data: bytes, said: str) -> None:
    """A `.json` samples file named its values by Python's types ("a JSON dict", "item 1 is a NoneType")."""
    from schooner.cluster.views._samples import samples_section

    (tmp_path / "samples.json").write_bytes(data)
    refused = samples_section(str(tmp_path), [("samples.json", None, False)])
    assert said in refused and "dict" not in refused and "NoneType" not in refused, refused


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_and_are_refused_by_name(root: str, constant: str) -> None:
    # RFC 8259 has no NaN or Infinity; Python's json module reads them, and every writer here refuses them
    # (allow_nan=False), so a sweep-results row with `"loss": NaN` went into a fit as a float nan
    path = _put(root, "nan.jsonl", _lines(ROWS[:1]) + f'{{"id": "c", "loss": {constant}}}\n'.encode())
    message = _error(path, what="sweep results")
    assert message.startswith(f"sweep results: {path}:2 "), message
    assert constant.lstrip("-") in message and "null" in message, message


@pytest.mark.parametrize("number", ["1e999", "-1e400", "1" + "0" * 400 + ".5"])
def test_a_number_too_large_for_a_float_is_refused_not_read_as_infinity(root: str, number: str) -> None:
    # JSON has such numbers, but Python's json reads them as inf: the Infinity the reader refuses by name
    path = _put(root, "big.jsonl", _lines(ROWS[:1]) + f'{{"id": "c", "loss": {number}}}\n'.encode())
    message = _error(path, what="sweep results")
    assert message.startswith(f"sweep results: {path}:2 "), message
    assert number[:5] in message and "float" in message, message
