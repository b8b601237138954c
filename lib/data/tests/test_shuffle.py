"""The disk shuffle under stress: concurrent reducers, memory measured as the worker's peak RSS, reuse of
finished map outputs, data-format spill files, hashed keys with collisions, bytes keys."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from schooner.cluster import JobError, LocalClient
from schooner.data import Dataset, read_shards, write_records

from .conftest import make_records

MiB = 2**20


# ------------------------------------------------------------------------------------ shared helpers


def _status(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _worker_rss(_: int) -> tuple[int, int]:
    """(pid, resident bytes now) of the worker process running this function; it also resets the process's
    peak (VmHWM), so `_worker_peak` afterwards measures only what follows. getrusage's ru_maxrss would not
    do: it keeps the peak of the process the worker was forked from, before its exec."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return os.getpid(), _status("VmRSS")


def _worker_peak(_: int) -> tuple[int, int]:
    """(pid, peak resident bytes since the last `_worker_rss`) of the worker process running this."""
    return os.getpid(), _status("VmHWM")


def _corpus(target_bytes: int, *, copies: int = 2) -> list[dict]:
    """Real text (the stdlib's source), ~40 KB documents, each `copies` times, ~target_bytes in all. The
    copies come a whole pass apart, so no map task still remembers a key when its repeat arrives."""
    from schooner.data.sources import iter_source

    code = [r["text"] for r in iter_source("python-code")]
    texts, size, k = [], 0, 0
    while size < target_bytes:
        text = f"# doc {k}\n" + "\n".join(code[(k * 7 + j) % len(code)] for j in range(3))[:40_000]
        texts.append(text)
        size += copies * len(text)
        k += 1
    return [
        {"id": f"d{k}-{c}", "text": t, "source": "code", "metadata": {"k": k, "copy": c}}
        for c in range(copies)
        for k, t in enumerate(texts)
    ]


def _pretend_pid_4242(rec: dict) -> dict:
    """Make this worker report pid 4242, as processes on different hosts (or containers) do."""
    if os.getpid() != 4242:
        os.getpid = lambda: 4242  # noqa: E731 (patched for the rest of this worker's life)
    return rec


def _first_line(rec: dict) -> str:
    return rec["text"].split("\n", 1)[0]


def _ids_of(key, records: list[dict]) -> dict:
    return {"id": key, "text": ",".join(r["id"] for r in records), "source": "g", "metadata": {}}


# ----------------------------------------------------------------------------------------------- tests


def test_concurrent_reducers_reporting_the_same_pid_keep_their_own_runs(tmp_path) -> None:
    # Two reduce tasks of one shuffle spill runs into one scratch folder at the same time, from two real
    # processes that report the same pid. Run names that are only unique per pid mix their data.
    recs = _corpus(6 * MiB, copies=3)
    write_records(recs, str(tmp_path / "in"), num_shards=2)
    expected = collections.defaultdict(list)
    for r in recs:
        expected[_first_line(r)].append(r["id"])
    with LocalClient(max_workers=2) as client:
        out = (
            Dataset.from_files(str(tmp_path / "in"))
            .map(_pretend_pid_4242)
            .group_by(_first_line, _ids_of, num_partitions=2, memory_budget=256 << 10, name="g")
            .write_jsonl(str(tmp_path / "out"), client=client, progress=False, retries=0)
        )
    got = {r["id"]: r["text"].split(",") for r in read_shards(str(tmp_path / "out"))}
    assert got == dict(expected)
    assert out["counters"]["g.spilled_runs"] >= 2 * 4  # both reducers really spilled runs


def test_a_reducer_detects_foreign_and_missing_spill_files(tmp_path, monkeypatch) -> None:
    from schooner.data import storage
    from schooner.data._shuffle import PartitionWriter, sorted_items
    from schooner.data._spill import SpillError

    def map_output(name: str, recs: list[dict]):
        w = PartitionWriter(str(tmp_path / name), 1, 1 << 20, 0, _first_line, "g")
        return w.write(iter(recs))

    info = map_output("t-00000.spill", make_records(300))
    assert len(list(sorted_items([info], 0, 1 << 30, str(tmp_path), {}))) == 300
    os.replace(tmp_path / "t-00000.spill", tmp_path / "kept.spill")
    map_output("t-00000.spill", make_records(300, start=300))  # another writer takes the name
    with pytest.raises(SpillError, match=r"t-00000\.spill: (written by|\d+ bytes, but)"):
        list(sorted_items([info], 0, 1 << 30, str(tmp_path), {}))
    os.remove(tmp_path / "t-00000.spill")
    with pytest.raises(SpillError, match=r"t-00000\.spill: missing"):
        list(sorted_items([info], 0, 1 << 30, str(tmp_path), {}))

    # Two reducers whose run names collide (as if host, pid and random part were all equal): when the other
    # one's runs replace this one's between spilling and merging, this one notices instead of merging them.
    import schooner.data._shuffle as shuffle

    os.replace(tmp_path / "kept.spill", tmp_path / "t-00000.spill")
    other = map_output("t-00001.spill", make_records(300, start=300))
    monkeypatch.setattr(storage, "unique_tag", lambda: "same-host-4242-0000000000")
    runs = tmp_path / "runs"
    runs.mkdir()
    a = sorted_items([info], 0, 20_000, str(runs), {})
    b = sorted_items([other], 0, 20_000, str(runs), {})
    read_run, pending = shuffle._read_run, [b]

    def read_run_after_b(run_info):
        if pending:
            next(pending.pop())  # b spills its runs under a's names, then starts merging its own
        return read_run(run_info)

    monkeypatch.setattr(shuffle, "_read_run", read_run_after_b)
    with pytest.raises(
        SpillError, match=r"r-00000-same-host-4242-0000000000-00000\.spill: (written by|\d+ bytes, but)"
    ):
        list(a)
    assert len(list(b)) == 299  # b's own runs are intact


def test_map_and_reduce_memory_stay_within_the_budget(tmp_path) -> None:
    budget = 16 * MiB
    recs = _corpus(40 * MiB)
    write_records(recs, str(tmp_path / "in"), num_shards=1)
    write_records(recs[:20], str(tmp_path / "warm"), num_shards=1)
    with LocalClient(max_workers=1) as client:
        kw = {"client": client, "progress": False}
        # Warm the worker (imports, first allocations) on the same pipeline, then read its peak so far.
        Dataset.from_files(str(tmp_path / "warm")).deduplicate("text", memory_budget=budget).count(**kw)
        pid, base = next(client.map(_worker_rss, [0]))
        m = (
            Dataset.from_files(str(tmp_path / "in"))
            .deduplicate("text", num_partitions=2, memory_budget=budget)
            .write_jsonl(str(tmp_path / "out"), **kw)
        )
        pid2, peak = next(client.map(_worker_peak, [0]))
    assert pid2 == pid, "the measurement must come from the worker that ran the shuffle"
    assert m["records"] == len(recs) // 2 and m["counters"]["dropped.duplicate"] == len(recs) // 2
    assert m["counters"]["deduplicate:text.in"] > len(recs) * 0.9  # nearly every record was shuffled
    grew = peak - base
    # The input (40 MB of text) is 2.5x the budget; a worker that held it would grow by far more.
    assert grew <= 1.5 * budget + 32 * MiB, (
        f"worker grew by {grew / MiB:.0f} MiB for a {budget / MiB:.0f} MiB budget"
    )


class _CountCalls:
    """Appends one line per record it sees to a log file (shared by every worker)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, rec: dict) -> dict:
        with open(self.log, "a") as f:
            f.write(rec["id"] + "\n")
        return rec


class _FailFirstTime:
    """A reducer that fails the first run (a marker file says it already failed once)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, key, records: list[dict]) -> dict:
        if not os.path.exists(self.marker):
            Path(self.marker).touch()
            raise ValueError("reducer failed on purpose")
        return records[0]


def test_a_rerun_reuses_the_finished_map_side(tmp_path, local_client) -> None:
    recs = make_records(400)
    log = str(tmp_path / "calls.log")
    ds = (
        Dataset.from_records(recs, num_shards=4)
        .map(_CountCalls(log))
        .group_by("id", _FailFirstTime(str(tmp_path / "failed-once")), num_partitions=3, name="g")
    )
    with pytest.raises((JobError, ValueError), match="reducer failed on purpose"):
        ds.write_jsonl(str(tmp_path / "out"), client=local_client, retries=0, progress=False)
    assert len(Path(log).read_text().splitlines()) == 400
    m = ds.write_jsonl(str(tmp_path / "out"), client=local_client, retries=0, progress=False)
    assert m["records"] == 400
    assert len(Path(log).read_text().splitlines()) == 400  # the map side ran once in all
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".work")]  # cleaned once done


class _SpillProbe:
    """A reducer that records, while the shuffle runs, the first bytes and sizes of its spill files."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir

    def __call__(self, key, records: list[dict]) -> dict:
        files = [
            os.path.join(d, f) for d, _, fs in os.walk(self.work_dir) for f in fs if not f.endswith(".json")
        ]
        heads = sorted({Path(f).read_bytes()[:8].hex() for f in files})
        size = sum(os.path.getsize(f) for f in files)
        return {"id": str(key), "text": "", "source": "probe", "metadata": {"heads": heads, "bytes": size}}


def test_spill_files_are_compressed_data_not_pickles(tmp_path) -> None:
    recs = _corpus(4 * MiB, copies=1)
    work = str(tmp_path / "work")
    os.mkdir(work)
    out = (
        Dataset.from_records(recs, num_shards=2)
        .group_by(lambda r: 0, _SpillProbe(work), num_partitions=1)
        .collect(client="inline", work_dir=work)
    )
    (probe,) = out
    raw = sum(len(r["text"]) for r in recs)
    assert probe["metadata"]["heads"], "the probe saw no spill files"
    for head in probe["metadata"]["heads"]:
        assert not head.startswith("80"), f"a spill file starts like a pickle: {head}"
    assert probe["metadata"]["bytes"] < raw / 2  # compressed: this text compresses more than 2x


def test_a_planted_pickle_is_never_unpickled(tmp_path) -> None:
    from schooner.data._spill import SpillError, SpillInfo, read_spill_records

    marker = tmp_path / "pwned"
    planted = tmp_path / "t-00000.spill"
    planted.write_bytes(
        b"\x80\x04\x95" + b"\x00" * 8 + b"cbuiltins\nopen\n(" + f"V{marker}\nVw\ntR.".encode()
    )
    info = SpillInfo(str(planted), "h-1-x", {0: [[0, 10, 1, 0, 10]]}, 0, planted.stat().st_size)
    with pytest.raises(SpillError, match="not a schooner spill file"):
        list(read_spill_records(info))
    assert not marker.exists()


def _text_bytes(rec: dict) -> bytes:
    return rec["text"].encode()


def test_bytes_keys_and_bad_keys(tmp_path) -> None:
    recs = make_records(60)
    for r in recs:
        r["text"] = f"text {r['metadata']['i'] % 20}"
    out = Dataset.from_records(recs, num_shards=3).deduplicate(_text_bytes).collect(client="inline")
    assert sorted(r["id"] for r in out) == [r["id"] for r in recs[:20]]
    bad = Dataset.from_records(recs).deduplicate(lambda r: {1, 2}, name="dd")
    with pytest.raises(TypeError, match=r"dd: the key of record id='r00000' is set .* cannot be a group key"):
        bad.count(client="inline")


def test_keys_sharing_a_hash_stay_separate_groups(monkeypatch) -> None:
    import schooner.data._shuffle as shuffle

    monkeypatch.setattr(shuffle, "key_hash", lambda kb: 7)  # every key collides
    recs = make_records(300)
    groups = Dataset.from_records(recs, num_shards=3).group_by(
        lambda r: r["metadata"]["mod7"], _ids_of, num_partitions=2, memory_budget=4000, name="g"
    )
    got = {r["id"]: r["text"].split(",") for r in groups.collect(client="inline")}
    want = collections.defaultdict(list)
    for r in recs:
        want[r["metadata"]["mod7"]].append(r["id"])
    assert got == dict(want)
    dedup = Dataset.from_records(recs, num_shards=2).deduplicate(lambda r: r["metadata"]["mod7"])
    assert [r["id"] for r in dedup.collect(client="inline")] == [r["id"] for r in recs[:7]]


@pytest.mark.slow
def test_dedup_of_200_megabytes_within_a_64_mib_budget(tmp_path) -> None:
    budget = 64 * MiB
    recs = _corpus(200 * MiB)
    write_records(recs, str(tmp_path / "in"), num_shards=4)
    n = len(recs)
    del recs
    with LocalClient(max_workers=1) as client:
        kw = {"client": client, "progress": False}
        pid, base = next(client.map(_worker_rss, [0]))
        m = (
            Dataset.from_files(str(tmp_path / "in"))
            .deduplicate("text", memory_budget=budget)
            .write_jsonl(str(tmp_path / "out"), **kw)
        )
        pid2, peak = next(client.map(_worker_peak, [0]))
    assert pid2 == pid and m["records"] == n // 2
    assert peak <= 1.5 * budget + 200 * MiB, (
        f"peak RSS {peak / MiB:.0f} MiB for a {budget / MiB:.0f} MiB budget"
    )
