"""Honest outputs: a shard is reused only by the plan that wrote it, unfinished or partial folders never read
as complete, rewrites leave only what the manifest lists, and Hugging Face folders are read as datasets."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from schooner.cluster import StepRunner
from schooner.data import DataError, Dataset, list_shards, read_shards, write_records

from .conftest import make_records


def _filtered(recs: list[dict], min_i: int) -> Dataset:
    return Dataset.from_records(recs, num_shards=4).filter(
        lambda r: r["metadata"]["i"] >= min_i, reason="small"
    )


def test_skip_existing_rewrites_shards_of_another_plan(tmp_path) -> None:
    recs = make_records(200)
    out = str(tmp_path / "out")
    assert _filtered(recs, 50).write_jsonl(out, skip_existing=True, client="inline")["records"] == 150
    # The same folder, a changed threshold, skip_existing as a resumed step passes it: nothing stale.
    m = _filtered(recs, 150).write_jsonl(out, skip_existing=True, client="inline")
    assert m["records"] == 50
    assert [r["id"] for r in read_shards(out)] == [r["id"] for r in recs[150:]]
    # The same plan again reuses every shard (their files are not rewritten).
    before = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in os.listdir(out) if n.startswith("part-")}
    _filtered(recs, 150).write_jsonl(out, skip_existing=True, client="inline")
    assert {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in before} == before


def test_transform_step_rerun_into_the_same_folder_with_other_params(tmp_path) -> None:
    from schooner.data._step_runs import run_transform
    from schooner.data.pipelines import length_filter
    from schooner.data.step_inputs import function_path
    from schooner.data.steps import TransformConfig

    write_records(make_records(300), str(tmp_path / "in"), num_shards=3)
    out = str(tmp_path / "out")  # one folder, as when a step is forced to rerun with changed code/params

    def run(min_chars: int) -> dict:
        cfg = TransformConfig(inputs=[str(tmp_path / "in")], pipeline=function_path(length_filter),
                              params={"min_chars": min_chars})  # fmt: skip
        return run_transform(cfg, out)

    loose, strict = run(10), run(30)
    expect = sum(1 for r in make_records(300) if len(r["text"]) >= 30)
    assert loose["records"] > strict["records"] == expect
    assert sum(1 for _ in read_shards(out)) == expect


def test_write_records_skip_existing_rewrites_other_records(tmp_path) -> None:
    out = str(tmp_path / "o")
    write_records(make_records(40), out, num_shards=2)
    other = make_records(40, source="other")
    write_records(other, out, num_shards=2, skip_existing=True)
    assert list(read_shards(out)) == other


def test_a_partial_record_folder_is_an_error(tmp_path) -> None:
    full = tmp_path / "full"
    write_records(make_records(100), str(full), num_shards=4)
    part = tmp_path / "part"
    part.mkdir()
    shutil.copy(full / "part-00000-of-00004.jsonl.zst", part)  # a copy that stopped after one file
    with pytest.raises(
        DataError, match=r"only 1 of the 4 parts .* missing 3 \(part-00001-of-00004\.jsonl\.zst, "
    ):
        list_shards(str(part))
    with pytest.raises(DataError, match="missing 3"):
        Dataset.from_files(str(part)).count(client="inline")
    # All four parts but no manifest (a foreign copy): complete, so it reads.
    for i in (1, 2, 3):
        shutil.copy(full / f"part-0000{i}-of-00004.jsonl.zst", part)
    assert sum(1 for _ in read_shards(str(part))) == 100


def test_an_unfinished_write_is_an_error(tmp_path) -> None:
    out = tmp_path / "o"
    write_records(make_records(100), str(out), num_shards=4)
    os.remove(out / "manifest.json")  # a write killed just before its last step
    with pytest.raises(DataError, match=r"has no manifest\.json: a write that never finished"):
        list_shards(str(out))
    write_records(make_records(100), str(out), num_shards=4)
    os.remove(out / "part-00002-of-00004.jsonl.zst")
    with pytest.raises(DataError, match=r"manifest lists 4 shards but 1 are missing \(part-00002-of-00004"):
        list_shards(str(out))


def test_rewriting_with_fewer_shards_leaves_only_the_new_ones(tmp_path) -> None:
    out = tmp_path / "o"
    write_records(make_records(60), str(out), num_shards=6)
    Dataset.from_records(make_records(10), num_shards=2).write_jsonl(str(out), client="inline")
    parts = sorted(n for n in os.listdir(out) if n.startswith("part-"))
    assert parts == ["part-00000-of-00002.jsonl.zst", "part-00001-of-00002.jsonl.zst"]
    assert sorted(os.listdir(out / ".shard-stats")) == [p + ".json" for p in parts]
    assert len(list_shards(str(out / "part-*"))) == 2


def _save_to_disk_layout(folder, rows: dict) -> None:
    """The files `datasets.Dataset.save_to_disk` writes, built with pyarrow alone."""
    folder.mkdir()
    table = pa.table(rows)
    with ipc.new_stream(str(folder / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=7)
    (folder / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
    state = {
        "_data_files": [{"filename": "data-00000-of-00001.arrow"}],
        "_fingerprint": "abc123",
        "_split": None,
    }
    (folder / "state.json").write_text(json.dumps(state))


def test_a_hugging_face_save_to_disk_folder_reads_as_a_dataset(tmp_path) -> None:
    rows = {"content": [f"row {i} ✓" for i in range(30)], "label": [i % 3 for i in range(30)]}
    _save_to_disk_layout(tmp_path / "hf", rows)
    assert list_shards(str(tmp_path / "hf")) == [str(tmp_path / "hf" / "data-00000-of-00001.arrow")]
    recs = Dataset.from_files(str(tmp_path / "hf"), text_field="content").collect(client="inline")
    assert [r["text"] for r in recs] == rows["content"]
    assert [r["metadata"] for r in recs] == [{"label": i % 3} for i in range(30)]
    with pytest.raises(DataError, match="no column 'text'"):
        list(read_shards(str(tmp_path / "hf")))
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(DataError, match=r"a Hugging Face DatasetDict .*\['train', 'test'\].*dd/train"):
        Dataset.from_files(str(tmp_path / "dd")).count(client="inline")


def test_a_real_datasets_folder_without_the_datasets_reader(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"text": [f"doc {i}" for i in range(50)], "score": [i / 2 for i in range(50)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "hf"))
    recs = list(read_shards(str(tmp_path / "hf"), on_error="skip"))
    assert [(r["text"], r["metadata"]["score"]) for r in recs] == list(zip(rows["text"], rows["score"]))


def test_import_files_keys_user_files_by_content(tmp_path) -> None:
    from schooner.data.steps import import_files

    src = tmp_path / "crawl"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": "1", "text": "alpha"}\n{"id": "2", "text": "beta"}\n')
    h = import_files("data/crawl", str(src / "*.jsonl"))
    moved = tmp_path / "elsewhere"
    shutil.copytree(src, moved)
    assert import_files("data/crawl", str(moved / "*.jsonl")).key == h.key
    (moved / "a.jsonl").write_text('{"id": "1", "text": "alpha"}\n{"id": "2", "text": "gamma"}\n')
    edited = import_files("data/crawl", str(moved / "*.jsonl"))
    assert edited.key != h.key
    out = StepRunner(prefix=str(tmp_path / "out"), quiet=True).run([edited])[edited].output_path
    assert sorted(r["text"] for r in read_shards(out)) == ["alpha", "gamma"]
