"""Every kind of bad input: the exact error names the file, the line (or row group) and the reason."""

from __future__ import annotations

import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from schooner.data import DataError, Dataset, SkipLog, read_records

SKIP_HINT = "; pass on_error='skip' to skip bad records (they are counted in the manifest)"
TRUNC_FIX = "; the file is incomplete (an interrupted write or copy); rewrite or re-download it"


def _write(path, lines: list[bytes]) -> str:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def _error(path: str, **kw) -> DataError:
    with pytest.raises(DataError) as info:
        list(read_records(path, **kw))
    return info.value


def test_malformed_json_line(tmp_path) -> None:
    path = _write(tmp_path / "a.jsonl", [b'{"text": "ok"}', b'{"text": "cut', b'{"text": "ok"}'])
    err = _error(path)
    assert (err.path, err.line) == (path, 2)
    assert str(err).startswith(f"{path}, line 2: malformed JSON (")
    assert str(err).endswith(SKIP_HINT)


def test_invalid_utf8(tmp_path) -> None:
    path = _write(tmp_path / "a.jsonl", [b'{"text": "ok"}', b'{"text": "ok"}', b'{"text": "\xff"}'])
    assert (
        str(_error(path))
        == f"{path}, line 3: invalid UTF-8 at byte 10 of the line (invalid start byte){SKIP_HINT}"
    )


def test_missing_text_field(tmp_path) -> None:
    path = _write(tmp_path / "a.jsonl", [b'{"body": "x", "id": "1"}'])
    assert str(_error(path)) == (
        f"{path}, line 1: no 'text' field (fields: body, id); pass text_field=... naming the field that holds "
        f"the text{SKIP_HINT}"
    )


def test_non_string_text_and_bad_fields(tmp_path) -> None:
    # A value of the wrong kind is named in JSON's words (the user wrote JSON, not Python: no int, list, NoneType).
    path = _write(tmp_path / "a.jsonl", [b'{"text": "fine"}', b'{"text": 5}'])
    assert str(_error(path)) == f"{path}, line 2: field 'text' must be a string, got a number: 5{SKIP_HINT}"
    path = _write(tmp_path / "b.jsonl", [b'{"text": "x", "metadata": [1]}'])
    assert (
        str(_error(path))
        == f"{path}, line 1: field 'metadata' must be an object, got an array: [1]{SKIP_HINT}"
    )
    path = _write(tmp_path / "c.jsonl", [b"[1, 2]"])
    assert (
        str(_error(path))
        == f"{path}, line 1: expected a JSON object (a record), got an array: [1, 2]{SKIP_HINT}"
    )
    path = _write(tmp_path / "d.jsonl", [b'{"text": "x", "id": 1.5}'])
    assert (
        str(_error(path))
        == f"{path}, line 1: field 'id' (the id) must be a string or an integer, got a number: 1.5{SKIP_HINT}"
    )


@pytest.mark.parametrize(
    ("line", "got"),
    [
        (b'"just text"', 'a string: "just text"'),
        (b"null", "null"),
        (b"true", "true"),
        (b"7", "a number: 7"),
        (b'{"text": null}', "null"),
        (b'{"text": false}', "false"),
        ('{"text": {"a": "\u00e9"}}'.encode(), 'an object: {"a": "\u00e9"}'),
        (b'{"text": "x", "source": ["w"]}', 'an array: ["w"]'),
        (b'{"text": "x", "id": true}', "true"),
        (b'{"text": "x", "metadata": "m"}', 'a string: "m"'),
    ],
)
def test_wrong_kind_named_in_json_words(tmp_path, line: bytes, got: str) -> None:
    path = _write(tmp_path / "k.jsonl", [line])
    message = str(_error(path))
    assert message.startswith(f"{path}, line 1: ")
    assert message.endswith(f", got {got}{SKIP_HINT}")


def test_wrong_kind_not_from_json_named_by_type() -> None:
    # A row from Python (a datasets split, a caller's dict) can hold a value no JSON reader returns: its type.
    from schooner.data import normalize

    with pytest.raises(Exception, match=r"^field 'text' must be a string, got a bytes value: b'x'$"):
        normalize({"text": b"x"})
    with pytest.raises(Exception, match=r"^field 'source' must be a string, got an array: \[1, 2\]$"):
        normalize({"text": "x", "source": [1, 2]})
    with pytest.raises(Exception, match=r"^field 'metadata' must be an object, got a tuple value: \(1,\)$"):
        normalize({"text": "x", "metadata": (1,)})


def _complete_lines(prefix: bytes) -> int:
    return prefix.count(b"\n")


@pytest.mark.parametrize("comp", ["zstd", "gzip"])
def test_truncated_stream(tmp_path, comp: str) -> None:
    data = b"".join(json.dumps({"text": f"line {i} " * 20}).encode() + b"\n" for i in range(5000))
    packed = zstandard.ZstdCompressor().compress(data) if comp == "zstd" else gzip.compress(data, mtime=0)
    path = tmp_path / ("t.jsonl.zst" if comp == "zstd" else "t.jsonl.gz")
    cut = packed[: len(packed) // 2]
    path.write_bytes(cut)
    # How many whole lines the cut stream still holds, decoded independently of the reader under test.
    if comp == "zstd":
        prefix = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(cut), read_across_frames=True).read()
    else:
        d = __import__("zlib").decompressobj(wbits=31)
        prefix = d.decompress(cut)
    n = _complete_lines(prefix)
    assert 0 < n < 5000
    got = []
    with pytest.raises(DataError) as info:
        for r in read_records(str(path)):
            got.append(r)
    assert len(got) == n
    assert str(info.value) == (
        f"{path}, line {n + 1}: truncated {comp} stream (the file ends inside a compressed frame) after line {n}{TRUNC_FIX}"
    )


@pytest.mark.parametrize("comp", ["zstd", "gzip"])
def test_compressed_file_cut_before_its_first_line(tmp_path, comp: str) -> None:
    # 0 bytes is no gzip/zstd stream (an empty stream still has a header): cut short, not an empty shard; the
    # message said "... after line 0" (no line was read at all).
    ext = ".zst" if comp == "zstd" else ".gz"
    zero = tmp_path / f"zero.jsonl{ext}"
    zero.write_bytes(b"")
    assert str(_error(str(zero))) == (
        f"{zero}, line 1: empty file (0 bytes), not a {comp} stream (an empty stream still has a header){TRUNC_FIX}"
    )
    data = b'{"text": "' + b"one long first line " * 500 + b'"}\n'
    packed = zstandard.ZstdCompressor().compress(data) if comp == "zstd" else gzip.compress(data, mtime=0)
    cut = tmp_path / f"cut.jsonl{ext}"
    cut.write_bytes(packed[: len(packed) // 2])
    assert str(_error(str(cut))) == (
        f"{cut}, line 1: truncated {comp} stream (the file ends inside a compressed frame){TRUNC_FIX}"
    )
    skips = SkipLog()  # skipped, the skip counted: never read as an empty shard
    assert list(read_records(str(zero), on_error="skip", skips=skips)) == [] and skips.skipped == 1


def test_corrupt_zstd(tmp_path) -> None:
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"garbage that is not a frame" * 10)
    err = _error(str(path))
    assert str(err).startswith(f"{path}, line 1: corrupt zstd data (")


def test_unreadable_parquet(tmp_path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet at all" * 100)
    err = _error(str(path))
    assert str(err).startswith(f"{path}: not a readable parquet file (")
    assert str(err).endswith("; check that it is a complete parquet file (not a partial copy) and rewrite it")


def test_parquet_corrupt_row_group(tmp_path) -> None:
    path = tmp_path / "rg.parquet"
    table = pa.table({"text": [os.urandom(64).hex() for _ in range(3000)]})
    pq.write_table(table, path, row_group_size=1000, compression="zstd")
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(path.read_bytes())
    for i in range(start + 40, start + col.total_compressed_size - 40):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    got = []
    with pytest.raises(DataError) as info:
        for r in read_records(str(path)):
            got.append(r)
    assert len(got) == 1000  # row group 0 is intact
    assert str(info.value).startswith(f"{path}, row group 1: cannot read (")


def test_parquet_text_column_problems(tmp_path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), path)
    assert (
        str(_error(str(path)))
        == f"{path}: no column 'text' (columns: body, n); pass text_field=... naming the text column"
    )
    assert str(_error(str(path), text_field="n")) == f"{path}: column 'n' has type int64, expected string"
    nul = tmp_path / "nul.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), nul)
    assert (
        str(_error(str(nul)))
        == f"{nul}, row group 0, row 1: field 'text' must be a string, got null{SKIP_HINT}"
    )


def test_skip_counts_and_keeps_examples(tmp_path) -> None:
    lines = [b'{"text": "ok 0"}', b"{broken", b'{"text": 1}', b'{"text": "ok 3"}', b'{"text": "\xfe"}']
    path = _write(tmp_path / "a.jsonl", lines)
    skips = SkipLog()
    recs = list(read_records(path, on_error="skip", skips=skips))
    assert [r["text"] for r in recs] == ["ok 0", "ok 3"]
    assert skips.skipped == 3
    assert [e.split(":")[0] for e in skips.examples] == [
        f"{path}, line 2",
        f"{path}, line 3",
        f"{path}, line 5",
    ]
    # what a skip records does not advise the skip the caller already asked for
    assert not any("on_error" in e for e in skips.examples), skips.examples


def test_pipeline_skips_end_in_manifest(tmp_path, local_client) -> None:
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "a.jsonl", [b'{"text": "x"}'] * 3)
    bad = _write(tmp_path / "in" / "b.jsonl", [b'{"text": "y"}', b"nope", b'{"text": "z"}'])
    manifest = Dataset.from_files(str(tmp_path / "in" / "*.jsonl"), on_error="skip").write_jsonl(
        str(tmp_path / "out"), client=local_client
    )
    assert manifest["records"] == 5
    assert manifest["counters"]["read.skipped"] == 1
    assert manifest["errors"]["skipped"] == 1
    assert manifest["errors"]["examples"][0].startswith(f"{bad}, line 2: malformed JSON")


def test_pipeline_raises_the_data_error_and_leaves_nothing(tmp_path, local_client) -> None:
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "a.jsonl", [b'{"text": "x"}'] * 3)
    bad = _write(tmp_path / "in" / "b.jsonl", [b'{"text": "y"}', b'{"text": "y"}', b'{"txt": "z"}'])
    out = tmp_path / "out"
    with pytest.raises(DataError) as info:
        Dataset.from_files(str(tmp_path / "in")).write_jsonl(str(out), client=local_client)
    assert str(info.value) == (
        f"{bad}, line 3: no 'text' field (fields: txt); pass text_field=... naming the field that holds the text{SKIP_HINT}"
    )
    left = sorted(os.listdir(out))
    assert "manifest.json" not in left
    assert "part-00001-of-00002.jsonl.zst" not in left
    assert not [n for n in left if ".tmp-" in n]
