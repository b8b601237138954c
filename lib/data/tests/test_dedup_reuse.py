"""Exact and paragraph dedup called again with the same `work=` folder in one process (the docs' own
example uses a fixed folder; a `--force` rerun does the same) mark what the new input holds. The marks of
the first call were served again (an `lru_cache` on the marks path): run 2 marked unique records and kept a
real copy. Expected marks come from the texts (Python sets), not from the code under test."""

from __future__ import annotations

import pytest

from schooner.data import make_record, write_records
from schooner.data.curation import exact_dedup_attributes, iter_attributes, paragraph_dedup_attributes


def _write(folder: str, texts: list[str], num_shards: int) -> None:
    write_records(
        [make_record(t, source="t", id=f"r{i}") for i, t in enumerate(texts)], folder, num_shards=num_shards
    )


def _expected_exact(texts: list[str]) -> list[bool]:
    seen: set[str] = set()
    out = []
    for t in texts:
        out.append(t in seen)
        seen.add(t)
    return out


@pytest.mark.parametrize("client", ["inline", None])
def test_exact_dedup_twice_with_one_work_folder_marks_the_second_input(tmp_path, client) -> None:
    execution = {"progress": False} if client is None else {"progress": False, "client": client}
    work = str(tmp_path / "work")
    first = ["a", "b", "a", "c"]  # r2 copies r0
    second = ["x", "y", "z", "y"]  # r3 copies r1: run 1's marks would flag r2 and keep r3
    third = ["p", "p", "q", "q", "r", "r"]  # another shard count
    for i, (texts, shards) in enumerate([(first, 2), (second, 2), (third, 3)]):
        src, out = str(tmp_path / f"src{i}"), str(tmp_path / f"out{i}")
        _write(src, texts, shards)
        exact_dedup_attributes(src, out, work=work, **execution)
        got = [a["exact_dup"] for a in iter_attributes(out)]
        assert got == _expected_exact(texts), f"call {i + 1}: {texts}"


@pytest.mark.parametrize("client", ["inline", None])
def test_paragraph_dedup_twice_with_one_work_folder_marks_the_second_input(tmp_path, client) -> None:
    execution = {"progress": False} if client is None else {"progress": False, "client": client}
    work = str(tmp_path / "work")
    first = ["shared line here\nonly in one", "shared line here\nonly in two"]
    second = ["nothing repeats\nat all", "in this\nsecond corpus"]
    for i, texts in enumerate([first, second]):
        src, out = str(tmp_path / f"src{i}"), str(tmp_path / f"out{i}")
        _write(src, texts, 1)
        paragraph_dedup_attributes(src, out, work=work, **execution)
        got = [a["paragraph_dups"] for a in iter_attributes(out)]
        want = [[], [[0, len("shared line here\n")]]] if i == 0 else [[], []]
        assert got == want, f"call {i + 1}: {texts}"
