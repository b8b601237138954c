"""`collect`/`iter_records` without durable staging: streamed in process (`client="inline"`), passed back in
memory from LocalClient workers, or (Ray, `work_dir=`) through spill files; the first two must give exactly
what the spill files give: same records in the same order, same errors, same skipped input."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.data import DataError, Dataset
from schooner.data._collect import iter_plan, records_of
from schooner.data._execute import Execution, MemorySink, Task, run_task
from schooner.data._json import copy_json, dumps_json, loads_json
from schooner.data._splits import RecordsSplit

from .conftest import make_records


def _write_inputs(tmp: Path) -> str:
    """Three jsonl shards; the second has a broken line (line 4)."""
    folder = tmp / "in"
    folder.mkdir()
    recs = make_records(90)
    for k in range(3):
        text = [json.dumps(r, ensure_ascii=False) for r in recs[k::3]]
        if k == 1:
            text.insert(3, '{"id": "broken", "text": ')
        (folder / f"part-{k}.jsonl").write_text("\n".join(text) + "\n")
    return str(folder / "*.jsonl")


def _bad_map(r: dict) -> dict:
    if r["metadata"]["i"] == 58:
        raise ValueError(f"cannot use record {r['id']}: its text is {r['text'][:12]!r}")
    return {**r, "text": r["text"].upper(), "metadata": {**r["metadata"], "pair": (r["metadata"]["i"], 1)}}


def _pipeline(pattern: str, *, bad_map: bool = False, on_error: str = "skip") -> Dataset:
    ds = (
        Dataset.from_files(pattern, on_error=on_error)
        .filter(lambda r: r["metadata"]["mod7"] != 3, reason="mod7")
        .map(lambda r: {**r, "metadata": {**r["metadata"], "len": len(r["text"])}})
        .filter(lambda r: not r["metadata"]["nested"]["even"] or r["metadata"]["i"] % 5, reason="even5")
    )
    return ds.map(_bad_map) if bad_map else ds


def _both(ds: Dataset, **execution) -> tuple[list[dict], list[dict]]:
    """(the default path's records, the spill-file path's records) of the same run settings."""
    exe = Execution(progress=False, **execution)
    fast = ds.collect(progress=False, **execution)
    files = list(iter_plan(ds._splits(), ds._nodes, exe, None, via_files=True))
    return fast, files


@pytest.mark.parametrize("where", ["inline", "local"])
def test_same_records_in_the_same_order_as_through_files(tmp_path, local_client, where) -> None:
    ds = _pipeline(_write_inputs(tmp_path))
    fast, files = _both(ds, client="inline" if where == "inline" else local_client)
    assert [r["id"] for r in fast] == [r["id"] for r in files]
    assert fast == files
    # an independent reference: the three shards in order, filtered by the same rules by hand
    want = [
        r["id"]
        for k in range(3)
        for r in make_records(90)[k::3]
        if r["metadata"]["mod7"] != 3 and (not r["metadata"]["nested"]["even"] or r["metadata"]["i"] % 5)
    ]
    assert [r["id"] for r in fast] == want
    assert all(r["metadata"]["len"] == len(r["text"]) for r in fast)


@pytest.mark.parametrize("where", ["inline", pytest.param("local", marks=pytest.mark.slow)])  # local: ~5 s
def test_a_map_error_is_the_same_error(tmp_path, local_client, where) -> None:
    ds = _pipeline(_write_inputs(tmp_path), bad_map=True)
    client = "inline" if where == "inline" else local_client
    with pytest.raises(Exception) as fast:
        ds.collect(client=client, progress=False)
    with pytest.raises(Exception) as files:
        list(
            iter_plan(ds._splits(), ds._nodes, Execution(client=client, progress=False), None, via_files=True)
        )
    assert type(fast.value) is type(files.value)
    # the message, and the error line of a worker's traceback (whose frames name the sink the task fed)
    first, last = str(fast.value).split("\n")[0], str(fast.value).splitlines()[-1]
    assert (first, last) == (str(files.value).split("\n")[0], str(files.value).splitlines()[-1])
    assert "cannot use record r00058: its text is 'record 58 ün'" in first


def test_bad_input_names_its_file_and_line_and_skips_are_counted(tmp_path, local_client, caplog) -> None:
    pattern = _write_inputs(tmp_path)
    with pytest.raises(DataError) as fast:
        _pipeline(pattern, on_error="raise").collect(client="inline", progress=False)
    ds = _pipeline(pattern, on_error="raise")
    with pytest.raises(DataError) as files:
        list(
            iter_plan(
                ds._splits(), ds._nodes, Execution(client="inline", progress=False), None, via_files=True
            )
        )
    assert str(fast.value) == str(files.value)
    assert fast.value.path.endswith("part-1.jsonl") and fast.value.line == 4
    for client in ("inline", local_client):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="schooner.data"):
            _pipeline(pattern).collect(client=client, progress=False)
        summary = [r.getMessage() for r in caplog.records if "skipped 1 bad input record" in r.getMessage()]
        assert len(summary) == 1 and "part-1.jsonl, line 4" in summary[0]


def test_inline_collect_writes_nothing(tmp_path, monkeypatch) -> None:
    """A one-stage inline collect makes no work folder and syncs nothing to disk."""
    import schooner.data._plan as plan

    def refuse(*a, **k):
        raise AssertionError("a collect in process must not touch the disk")

    pattern = _write_inputs(tmp_path)
    want = _pipeline(pattern).collect(client="inline", progress=False)
    monkeypatch.setattr(plan.tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(os, "fsync", refuse)
    assert _pipeline(pattern).collect(client="inline", progress=False) == want
    assert Dataset.from_files(pattern, on_error="skip").count(client="inline", progress=False) == 90


def test_stages_before_the_last_still_agree(tmp_path, local_client) -> None:
    """take, reshard and group_by end in spill files; what follows them streams."""
    recs = make_records(200)
    ds = (
        Dataset.from_records(recs, num_shards=5)
        .filter(lambda r: r["metadata"]["mod7"] != 0, reason="mod7")
        .reshard(3)
        .group_by(lambda r: r["metadata"]["i"] % 13, lambda k, rs: {"id": f"g{k}", "text": str(len(rs))})
        .map(lambda r: {**r, "source": "grouped"})
        .take(9)
    )
    for client in ("inline", local_client):
        fast, files = _both(ds, client=client)
        assert fast == files and len(fast) == 9


def test_a_temporary_collect_syncs_no_stage_to_disk(monkeypatch) -> None:
    """take, reshard and group_by spill into a temporary folder, removed at the end: a collect or count
    fsyncs nothing, and the records are those of a collect whose stages are durable (work_dir=)."""
    import tempfile

    ds = (
        Dataset.from_records(make_records(120), num_shards=4)
        .reshard(3)
        .group_by(lambda r: r["metadata"]["i"] % 7, lambda k, rs: {"id": f"g{k}", "text": str(len(rs))})
        .take(5)
    )
    with tempfile.TemporaryDirectory() as kept:
        want = ds.collect(client="inline", progress=False, work_dir=kept)

    def refuse(*a, **k):
        raise AssertionError("a temporary collect must not sync its stages to disk")

    monkeypatch.setattr(os, "fsync", refuse)
    assert ds.collect(client="inline", progress=False) == want and len(want) == 5
    assert ds.count(client="inline", progress=False) == 5
    # work_dir= keeps durable stages
    with pytest.raises(AssertionError, match="must not sync"), tempfile.TemporaryDirectory() as kept:
        ds.collect(client="inline", progress=False, work_dir=kept)


@pytest.mark.parametrize("where", ["inline", "local"])
def test_values_come_back_as_json_gives_them(local_client, where) -> None:
    client = "inline" if where == "inline" else local_client
    recs = [
        {"id": "a", "text": "x", "metadata": {"t": (1, 2), "f": float("nan"), "g": -0.0}},
        {"id": "b", "text": "é", "metadata": {"big": 2**70 + 1, 3: "k"}},
    ]
    ds = Dataset.from_records(recs, num_shards=2)
    fast, files = _both(ds, client=client)
    assert fast == files
    assert fast[0]["metadata"] == {"t": [1, 2], "f": None, "g": -0.0}
    assert fast[1]["metadata"] == {"big": 2**70 + 1, "3": "k"}
    # fresh objects: changing what collect returned does not change the dataset
    fast[0]["metadata"]["t"].append(3)
    assert ds.collect(client=client, progress=False) == files
    for meta in ({"tags": {"a"}}, {"wide": "Ā ok", "lone": "x\ud800"}):
        bad = Dataset.from_records([{"id": "s", "text": "é", "metadata": meta}])
        exe = Execution(client=client, progress=False)
        with pytest.raises(Exception, match="record id='s' cannot be passed between pipeline stages"):
            bad.collect(client=client, progress=False)
        with pytest.raises(Exception, match="record id='s' cannot be passed between pipeline stages"):
            list(iter_plan(bad._splits(), bad._nodes, exe, None, via_files=True))


def test_memory_results_spill_past_their_budget(tmp_path) -> None:
    recs = make_records(40)
    small = run_task(Task(0, RecordsSplit(tuple(recs)), (), MemorySink(str(tmp_path / "out"), None)))
    assert "lines" in small and list(records_of(small)) == recs
    big = run_task(Task(0, RecordsSplit(tuple(recs)), (), MemorySink(str(tmp_path / "out"), None, 1000)))
    assert "lines" not in big and big["records"] == 40
    assert list(records_of(big)) == recs


def test_a_local_collect_spills_past_its_budget_into_a_private_folder(
    tmp_path, local_client, monkeypatch
) -> None:
    import functools
    import stat
    import tempfile

    from schooner.data import _collect

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(temp))
    monkeypatch.setattr(_collect, "MemorySink", functools.partial(MemorySink, max_bytes=1000))
    recs = make_records(40)
    it = Dataset.from_records(recs, num_shards=2).iter_records(client=local_client, progress=False)
    got = [next(it)]
    (work,) = temp.iterdir()  # the collect's work folder, a task's spill file in it
    assert list(work.glob("out/*.spill")) and stat.S_IMODE(work.stat().st_mode) == 0o700
    got += list(it)
    assert got == recs and not list(temp.iterdir())


_calls = {"n": 0}


def _flaky(r: dict) -> dict:
    _calls["n"] += 1
    if _calls["n"] == 1:
        raise OSError("disk hiccup before the first record")
    if _calls["n"] == 5:
        raise OSError("disk hiccup after three records")
    return r


def test_inline_retries_a_task_only_before_its_records_reach_the_caller(caplog) -> None:
    ds = Dataset.from_records(make_records(3)).map(_flaky)
    _calls["n"] = 0
    with caplog.at_level(logging.WARNING, logger="schooner.data"):
        assert [r["id"] for r in ds.collect(client="inline", progress=False)] == [
            "r00000",
            "r00001",
            "r00002",
        ]
    assert any("retry 1 of 2" in r.getMessage() for r in caplog.records)
    ds = Dataset.from_records(make_records(10)).map(_flaky)
    _calls["n"] = 1  # the next failure comes after three records were handed out
    got = []
    with pytest.raises(OSError, match="after three records"):
        for r in ds.iter_records(client="inline", progress=False):
            got.append(r["id"])
    assert got == ["r00000", "r00001", "r00002"]


_text = st.one_of(  # and strings with a lone surrogate, which JSON (UTF-8) cannot hold
    st.text(max_size=8), st.tuples(st.text(max_size=3), st.sampled_from("\ud800\udfff\ud83d")).map("".join)
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    _text,
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(_text, st.integers(0, 9)), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_copy_json_is_the_json_round_trip(value) -> None:
    """The in-process copy against the encoder and decoder it stands for: equal results, or both refuse."""
    try:
        want = loads_json(dumps_json(value))
    except TypeError:
        with pytest.raises(TypeError):
            copy_json(value)
        return
    got = copy_json(value)
    assert repr(got) == repr(want)  # equal, and the same types (lists, not tuples; None, not NaN)


def _fail_on_demand(r: dict) -> dict:
    if os.environ.get("SCHOONER_TEST_FAIL_ID") == r["id"]:
        raise ValueError(f"failing on {r['id']} on purpose")
    return r


def test_work_dir_keeps_the_files_path_and_a_rerun_reuses_finished_tasks(
    tmp_path, monkeypatch, caplog
) -> None:
    ds = Dataset.from_records(make_records(30), num_shards=3).map(_fail_on_demand)
    want = ds.collect(client="inline", progress=False)
    work = str(tmp_path / "work")
    monkeypatch.setenv("SCHOONER_TEST_FAIL_ID", "r00025")
    with pytest.raises(ValueError, match="on purpose"):
        ds.collect(client="inline", progress=False, work_dir=work)
    assert any(f.endswith(".spill") for _, _, fs in os.walk(work) for f in fs)  # staged for the rerun
    monkeypatch.delenv("SCHOONER_TEST_FAIL_ID")
    with caplog.at_level(logging.INFO, logger="schooner.data"):
        assert ds.collect(client="inline", progress=False, work_dir=work) == want
    assert any("reused 2 of 3 finished tasks" in r.getMessage() for r in caplog.records)
    assert os.listdir(work) == []  # removed once the plan succeeded
