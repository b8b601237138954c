"""`schooner.cluster.storage`, the one storage layer of the packages: the same behaviour for local folders
and fsspec URLs (`memory://` here; S3 in test_s3_prefix.py)."""

from __future__ import annotations

import doctest
import json
import math
import os
import uuid
from pathlib import Path

import fsspec
import pytest

from schooner.cluster import storage


def test_round_trips_of_text_bytes_and_json(root: str) -> None:
    storage.write_text(storage.join(root, "a/b.txt"), "héllo\n")
    storage.write_bytes(storage.join(root, "a/c.bin"), b"\x00\x01")
    storage.write_json(storage.join(root, "d.json"), {"b": 1, "a": [2**70 + 1, "✓"]})
    assert storage.read_text(storage.join(root, "a/b.txt")) == "héllo\n"
    assert storage.read_bytes(storage.join(root, "a/c.bin")) == b"\x00\x01"
    assert storage.read_json(storage.join(root, "d.json")) == {"a": [2**70 + 1, "✓"], "b": 1}
    assert storage.listdir(root) == ["a", "d.json"]
    assert storage.listdir(storage.join(root, "a")) == ["b.txt", "c.bin"]
    assert storage.exists(storage.join(root, "a/b.txt")) and storage.isdir(storage.join(root, "a"))
    assert storage.file_size(storage.join(root, "a/c.bin")) == 2
    with storage.open_file(storage.join(root, "a/b.txt"), "r") as f:
        assert f.read() == "héllo\n"
    found = storage.glob(storage.join(root, "**/*.txt"))
    assert [p.rsplit("/", 2)[-2:] for p in found] == [["a", "b.txt"]]


def test_json_is_deterministic_sorted_and_unescaped(root: str) -> None:
    path = storage.join(root, "x.json")
    storage.write_json(path, {"z": 1, "a": {"y": "✓", "b": None}})
    text = storage.read_text(path)
    assert text == json.dumps({"a": {"b": None, "y": "✓"}, "z": 1}, indent=1, ensure_ascii=False) + "\n"
    storage.write_json(path, {"z": 1, "a": 2}, indent=None, sort_keys=False)
    assert storage.read_text(path) == '{"z": 1, "a": 2}\n'


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_json_refuses_nan_and_infinity_naming_file_and_place(root: str, bad: float) -> None:
    path = storage.join(root, "results.json")
    with pytest.raises(ValueError, match=r"results\.json: \$\.scores\[1\]\.loss is (nan|inf|-inf)") as e:
        storage.write_json(path, {"scores": [{"loss": 1.0}, {"loss": bad}]})
    assert "null" in str(e.value)
    assert not storage.exists(path)  # nothing half-written


def test_missing_files_raise_file_not_found(root: str) -> None:
    for read in (storage.read_text, storage.read_bytes, storage.read_json):
        with pytest.raises(FileNotFoundError):
            read(storage.join(root, "nope.json"))
    assert storage.listdir(storage.join(root, "nope")) == []
    assert not storage.exists(storage.join(root, "nope"))
    storage.remove(storage.join(root, "nope"))  # a missing file is already removed
    storage.remove_tree(storage.join(root, "nope"))


def test_invalid_json_names_the_file_and_line(root: str) -> None:
    path = storage.join(root, "bad.json")
    storage.write_text(path, '{\n "a": 1,\n}\n')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON at line 3"):
        storage.read_json(path)


def test_remove_and_remove_tree(root: str) -> None:
    storage.write_text(storage.join(root, "t/a/b.txt"), "x")
    storage.write_text(storage.join(root, "t/c.txt"), "y")
    storage.remove(storage.join(root, "t/c.txt"))
    assert storage.listdir(storage.join(root, "t")) == ["a"]
    storage.remove_tree(storage.join(root, "t"))
    assert not storage.exists(storage.join(root, "t/a/b.txt"))


@pytest.mark.parametrize("mode", ["wb", "w"])
def test_atomic_open_publishes_only_a_complete_file(root: str, mode: str) -> None:
    path = storage.join(root, "big.txt")
    data = "line\n" * 1000
    with storage.atomic_open(path, mode) as f:
        f.write(data if mode == "w" else data.encode())
        assert not storage.exists(path)  # not under its final name before the block ends
    assert storage.read_text(path) == data
    with pytest.raises(RuntimeError, match="writer failed"), storage.atomic_open(path, mode) as f:
        f.write("partial" if mode == "w" else b"partial")
        raise RuntimeError("writer failed")
    assert storage.read_text(path) == data  # the old file stays
    assert not [n for n in storage.listdir(root) if storage.is_temp_name(n)]


def test_atomic_open_refuses_read_modes(root: str) -> None:
    with (
        pytest.raises(ValueError, match="mode 'wb' or 'w'"),
        storage.atomic_open(storage.join(root, "x"), "a"),
    ):
        pass
    with pytest.raises(ValueError, match="write with atomic_open"):
        storage.open_file(storage.join(root, "x"), "w")


def test_local_writes_leave_no_temporary_file(tmp_path: Path) -> None:
    path = str(tmp_path / "f" / "x.json")
    storage.write_json(path, [1, 2])
    storage.write_json(path, [3])
    assert os.listdir(tmp_path / "f") == ["x.json"]


def test_paths() -> None:
    assert storage.join("gs://b/p/", "/a/", "b") == "gs://b/p/a/b"
    assert storage.join("/x", "") == "/x"
    assert storage.is_local("/x") and storage.is_local("file:///x") and not storage.is_local("s3://b/x")
    assert storage.local_path("file:///x/y") == "/x/y"
    assert storage.normalize_prefix("s3://b/p/") == "s3://b/p"
    assert storage.normalize_prefix("file:///tmp/p") == "/tmp/p"
    assert storage.is_temp_name(storage.temp_name("x.json").rsplit("/", 1)[-1])
    assert storage.unique_tag() != storage.unique_tag()


def test_memory_store_holds_what_was_written() -> None:
    """An independent look through fsspec itself at what the layer wrote."""
    path = f"memory://storage-api/{uuid.uuid4().hex}/r.json"
    storage.write_json(path, {"a": 1})
    assert json.loads(fsspec.open(path, "r").open().read()) == {"a": 1}


def test_docstring_examples_run() -> None:
    from schooner.cluster import records

    for module in (storage, records):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_the_old_private_module_still_serves() -> None:
    from schooner.cluster import _storage

    assert _storage.storage_for is storage.storage_for and _storage.atomic_write is storage.atomic_write
