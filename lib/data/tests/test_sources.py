"""The embedded corpus: deterministic, real, without excluded packages; and its step."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig

import orjson
import pytest

from schooner.data import list_shards, read_manifest, read_records
from schooner.data.sources import EXCLUDED, SOURCES, iter_source, source_report

_DIGEST = (
    "import hashlib, orjson\n"
    "from schooner.data.sources import iter_source\n"
    "h = hashlib.sha256()\n"
    "for name in ('python-docs', 'python-code'):\n"
    "    for r in iter_source(name):\n"
    "        h.update(orjson.dumps(r, option=orjson.OPT_SORT_KEYS))\n"
    "print(h.hexdigest())\n"
)


def _digest() -> str:
    h = hashlib.sha256()
    for name in ("python-docs", "python-code"):
        for r in iter_source(name):
            h.update(orjson.dumps(r, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


def test_same_python_same_records_in_a_fresh_process() -> None:
    # A build from scratch (disk cache off) in another process equals what this process got.
    env = {**os.environ, "SCHOONER_SOURCE_CACHE": "0"}
    out = subprocess.run(
        [sys.executable, "-c", _DIGEST], capture_output=True, text=True, timeout=300, check=True, env=env
    )
    assert out.stdout.strip() == _digest()


def test_python_docs_is_real_prose() -> None:
    recs = list(iter_source("python-docs"))
    report = source_report("python-docs")
    assert report["records"] == len(recs)
    assert 1_000_000 < report["bytes"] < 4_000_000
    assert len({r["id"] for r in recs}) == len(recs)
    assert all(r["source"] == "python-docs" and r["text"].strip() for r in recs)
    from pydoc_data.topics import topics

    by_name = {r["metadata"].get("name"): r for r in recs if r["metadata"]["kind"] == "topic"}
    assert by_name["assert"]["text"] == topics["assert"].strip()
    mods = {r["metadata"]["module"]: r for r in recs if r["metadata"]["kind"] == "module-docs"}
    import json

    assert json.__doc__.strip().splitlines()[0] in mods["json"]["text"]
    assert "dumps(obj, *, skipkeys=False" in mods["json"]["text"]
    assert [m for m in mods if m.split(".")[0] in EXCLUDED or ".test" in m] == []
    assert list(mods) == sorted(mods)


def test_python_code_is_the_stdlib_source() -> None:
    recs = {r["metadata"]["module"]: r for r in iter_source("python-code")}
    path = os.path.join(sysconfig.get_path("stdlib"), "json", "decoder.py")
    with open(path, encoding="utf-8") as f:
        assert recs["json.decoder"]["text"] == f.read()
    assert recs["json.decoder"]["metadata"]["path"] == "json/decoder.py"
    assert not [m for m in recs if m.split(".")[0] in EXCLUDED]
    assert not [m for m in recs if "site-packages" in recs[m]["metadata"]["path"]]
    assert (
        sum(report for report in source_report("python-code")["skipped"].values()) + len(recs)
        == source_report("python-code")["files"]
    )


def test_records_are_copies_and_unknown_names_fail() -> None:
    r = next(iter_source("python-docs"))
    r["metadata"]["kind"] = "changed"
    assert next(iter_source("python-docs"))["metadata"]["kind"] == "topic"
    assert sorted(SOURCES) == ["python-code", "python-docs"]
    with pytest.raises(
        ValueError,
        match=r"unknown source 'python-doc'; the embedded sources are \['python-code', 'python-docs'\]",
    ):
        next(iter_source("python-doc"))


def test_source_records_step(tmp_path) -> None:
    from schooner.cluster import StepRunner
    from schooner.data.steps import source_records

    handle = source_records("python-docs", num_shards=3)
    result = StepRunner(prefix=str(tmp_path)).run([handle])
    assert [s.state for s in result.steps] == ["succeeded"]
    out = handle.output_path(str(tmp_path))
    recs = [r for s in list_shards(out) for r in read_records(s)]
    assert recs == list(iter_source("python-docs"))
    m = read_manifest(out)
    assert m["num_shards"] == 3 and m["source_report"] == source_report("python-docs")
    again = StepRunner(prefix=str(tmp_path)).run([handle])
    assert [s.state for s in again.steps] == ["cached"]


def test_transform_and_import_steps(tmp_path) -> None:
    from schooner.cluster import StepRunner
    from schooner.data.pipelines import drop_exact_duplicates, length_filter
    from schooner.data.steps import import_files, source_records, transform

    docs = source_records("python-docs", num_shards=2)
    long_docs = transform("data/long", docs, length_filter, params={"min_chars": 5000}, format="parquet")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text('{"body": "x"}\n{"body": "x"}\n{"body": "y"}\n')
    raw = import_files("data/raw", str(tmp_path / "raw" / "*.jsonl"), text_field="body", source="raw")
    deduped = transform("data/raw-dedup", raw, drop_exact_duplicates)
    result = StepRunner(prefix=str(tmp_path / "runs")).run([long_docs, deduped])
    assert {s.name: s.state for s in result.steps} == {
        "data/python-docs": "succeeded", "data/long": "succeeded", "data/raw": "succeeded", "data/raw-dedup": "succeeded",
    }  # fmt: skip
    out = long_docs.output_path(str(tmp_path / "runs"))
    got = [r for s in list_shards(out) for r in read_records(s)]
    assert got == [r for r in iter_source("python-docs") if len(r["text"]) >= 5000]
    assert read_manifest(out)["counters"]["dropped.length"] == source_report("python-docs")["records"] - len(
        got
    )
    texts = [
        r["text"] for s in list_shards(deduped.output_path(str(tmp_path / "runs"))) for r in read_records(s)
    ]
    assert sorted(texts) == ["x", "y"]
    with pytest.raises(ValueError, match="must be a module-level function of an importable module"):
        transform("bad", docs, lambda ds: ds)
