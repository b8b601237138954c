"""User files as step inputs: keyed by content (names relative to the pattern's root, sizes, hashes)."""

from __future__ import annotations

import hashlib
import pickle
import shutil
import uuid
from pathlib import Path

import fsspec
import pytest

from schooner.cluster import InputFiles, StepRunner, step


def fn(config: dict, out: str) -> dict:
    return {"files": len(config["files"].paths)}


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_text('{"text": "a"}\n')
    (root / "sub" / "b.jsonl").write_text('{"text": "b"}\n')
    (root / ".hidden").write_text("editor state")
    return root


def _key(pattern: str, **kw) -> str:
    return step("import", fn, {"files": InputFiles(pattern, **kw)}).key


def test_moving_files_keeps_the_key_and_editing_them_changes_it(tmp_path: Path) -> None:
    src = _tree(tmp_path / "crawl")
    key = _key(str(src))
    moved = tmp_path / "elsewhere" / "renamed-root"
    shutil.copytree(src, moved)
    assert _key(str(moved)) == key
    assert _key(str(moved / "**" / "*.jsonl")) == key  # the same files under the same names
    assert _key(str(moved / "*.jsonl")) != key  # fewer files
    (moved / ".hidden").write_text("changed editor state")  # hidden files are not inputs
    assert _key(str(moved)) == key
    (moved / "sub" / "b.jsonl").write_text('{"text": "B"}\n')  # same size, new content
    assert _key(str(moved)) != key
    shutil.copytree(src, tmp_path / "third")
    (tmp_path / "third" / "sub" / "b.jsonl").rename(tmp_path / "third" / "sub" / "c.jsonl")
    assert _key(str(tmp_path / "third")) != key
    (tmp_path / "fourth").mkdir()
    shutil.copytree(src, tmp_path / "fourth" / "x")
    (tmp_path / "fourth" / "x" / "new.jsonl").write_text("{}\n")
    assert _key(str(tmp_path / "fourth" / "x")) != key


def test_entries_hold_relative_names_sizes_and_blake2b_of_the_bytes(tmp_path: Path) -> None:
    src = _tree(tmp_path / "d")
    files = InputFiles([str(src / "*.jsonl"), str(src / "sub")])
    expect = [
        ("a.jsonl", 14, hashlib.blake2b(b'{"text": "a"}\n', digest_size=16).hexdigest()),
        ("b.jsonl", 14, hashlib.blake2b(b'{"text": "b"}\n', digest_size=16).hexdigest()),
    ]
    assert [(e.name, e.size, e.digest) for e in files.entries] == expect
    assert files.paths == [str(src / "a.jsonl"), str(src / "sub" / "b.jsonl")]


def test_large_files_are_hashed_by_size_head_and_tail_unless_asked_for_every_byte(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    data = bytearray(b"x" * (20 * 2**20))
    big.write_bytes(data)
    edges, whole = _key(str(big), full_hash_bytes=2**20), _key(str(big), full_hash_bytes=None)
    data[10 * 2**20] = ord("y")  # the middle: outside the first and last 8 MiB
    big.write_bytes(data)
    assert _key(str(big), full_hash_bytes=2**20) == edges  # the documented trade-off
    assert _key(str(big), full_hash_bytes=None) != whole
    data[-1] = ord("z")
    big.write_bytes(data)
    assert _key(str(big), full_hash_bytes=2**20) != edges


def test_urls_are_fingerprinted_through_fsspec() -> None:
    root = f"memory://files-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{root}/p/one.txt", b"1")
    fs.pipe(f"{root}/p/two.txt", b"22")
    files = InputFiles(f"{root}/p/*.txt")
    assert [(e.name, e.size) for e in files.entries] == [("one.txt", 1), ("two.txt", 2)]
    assert files.paths == [f"{root}/p/one.txt", f"{root}/p/two.txt"]
    other = f"memory://files-{uuid.uuid4().hex}"
    fs.pipe(f"{other}/q/one.txt", b"1")
    fs.pipe(f"{other}/q/two.txt", b"22")
    assert _key(f"{other}/q") == _key(f"{root}/p")


def test_a_pattern_that_matches_nothing_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing-\*\.jsonl' matches no file"):
        InputFiles(str(tmp_path / "nothing-*.jsonl"))


def test_pickled_input_files_are_not_rehashed_and_stay_immutable(tmp_path: Path) -> None:
    src = _tree(tmp_path / "d")
    files = InputFiles(str(src))
    (src / "a.jsonl").write_text("edited after the experiment was built\n")
    back = pickle.loads(pickle.dumps(files))
    assert back == files and back.paths == files.paths
    with pytest.raises(AttributeError):
        files.paths = []


def test_an_edited_input_file_reruns_its_step_and_a_moved_one_does_not(tmp_path: Path) -> None:
    src = _tree(tmp_path / "in")
    prefix = str(tmp_path / "out")
    h = step("import", fn, {"files": InputFiles(str(src))})
    assert StepRunner(prefix=prefix, quiet=True).run([h])[h].state == "succeeded"
    moved = tmp_path / "moved"
    src.rename(moved)
    again = step("import", fn, {"files": InputFiles(str(moved))})
    assert StepRunner(prefix=prefix, quiet=True).run([again])[again].state == "cached"
    (moved / "a.jsonl").write_text('{"text": "edited"}\n')
    edited = step("import", fn, {"files": InputFiles(str(moved))})
    assert StepRunner(prefix=prefix, quiet=True).run([edited])[edited].state == "succeeded"


def test_a_hidden_file_named_on_purpose_is_an_input(tmp_path: Path) -> None:
    # `.env`-style inputs, or a glob that asks for dot files: they exist, yet InputFiles said "matches no
    # file". Hidden files met while walking a folder or a wildcard stay out, as before.
    src = _tree(tmp_path / "crawl")
    (src / ".hidden2").write_text("x")
    named = InputFiles(str(src / ".hidden"))
    assert [(e.name, e.size) for e in named.entries] == [(".hidden", len("editor state"))]
    assert named.paths == [str(src / ".hidden")]
    assert [e.name for e in InputFiles(str(src / ".h*")).entries] == [".hidden", ".hidden2"]
    assert [e.name for e in InputFiles(str(src)).entries] == ["a.jsonl", "sub/b.jsonl"]
    assert [e.name for e in InputFiles(str(src / "*")).entries] == ["a.jsonl"]


def test_a_file_named_by_two_patterns_is_listed_once(tmp_path: Path) -> None:
    # ["data/a.jsonl", "data/*.jsonl"]: the step read a.jsonl twice (a training mix with one file doubled).
    src = _tree(tmp_path / "crawl")
    files = InputFiles([str(src / "a.jsonl"), str(src / "**" / "*.jsonl"), str(src)])
    assert files.paths == [str(src / "a.jsonl"), str(src / "sub" / "b.jsonl")]
    assert [e.name for e in files.entries] == ["a.jsonl", "sub/b.jsonl"]
    assert _key(str(src / "**" / "*.jsonl")) == step("import", fn, {"files": files}).key


def test_a_file_name_that_is_not_utf8_is_keyed(tmp_path: Path) -> None:
    # Linux names are bytes: a crawl dump with a Latin-1 name (b"caf\xe9.txt") made the step's key a
    # ConfigError about a lone surrogate inside InputFiles' own fingerprint.
    import os

    root = tmp_path / "dump"
    root.mkdir()
    with open(os.path.join(os.fsencode(root), b"caf\xe9.txt"), "wb") as f:
        f.write(b"bytes")
    key = _key(str(root))
    assert [e.size for e in InputFiles(str(root)).entries] == [5]
    os.rename(
        os.path.join(os.fsencode(root), b"caf\xe9.txt"), os.path.join(os.fsencode(root), b"caf\xe8.txt")
    )
    assert _key(str(root)) != key  # another name, another key
    assert InputFiles(str(root)).paths == [os.fsdecode(os.path.join(os.fsencode(root), b"caf\xe8.txt"))]


def test_an_empty_folder_is_named_as_such(tmp_path: Path) -> None:
    # An existing folder holding no files (or only hidden ones) was reported as "matches no file; check the
    # path": the path was right.
    (tmp_path / "shards" / "sub").mkdir(parents=True)
    (tmp_path / "shards" / ".lock").write_text("")
    with pytest.raises(FileNotFoundError, match=r"shards' is a folder with no files in it \(hidden files"):
        InputFiles(str(tmp_path / "shards"))


def test_a_file_whose_name_holds_brackets_is_named_by_its_path(tmp_path: Path) -> None:
    # 'scores [final].jsonl' (or 'shard[1].jsonl') exists, but '[...]' was read as a glob character class:
    # "matches no file" (or another file: 'shard1.jsonl').
    (tmp_path / "scores [final].jsonl").write_text("1\n")
    (tmp_path / "shard[1].jsonl").write_text("22\n")
    (tmp_path / "shard1.jsonl").write_text("333\n")
    files = InputFiles(str(tmp_path / "scores [final].jsonl"))
    assert [(e.name, e.size) for e in files.entries] == [("scores [final].jsonl", 2)]
    files = InputFiles(str(tmp_path / "shard[1].jsonl"))
    assert files.paths == [str(tmp_path / "shard[1].jsonl")] and files.entries[0].size == 3
    assert InputFiles(str(tmp_path / "shard[0-9].jsonl")).paths == [str(tmp_path / "shard1.jsonl")]  # a glob
