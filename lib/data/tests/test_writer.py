"""Atomic shard writes, manifests, resumable writes, and a real SIGKILL in the middle of a write."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schooner.data import ShardWriter, list_shards, read_manifest, read_records, write_records

from .conftest import make_records

_SCRIPT = str(Path(__file__).with_name("_kill_writer.py"))


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_failed_shard_leaves_nothing(tmp_path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShardWriter(str(tmp_path / "part-00000-of-00001.jsonl.zst")) as w,
    ):
        w.write_many(make_records(5000))
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_manifest_layout(tmp_path) -> None:
    recs = make_records(100)
    m = write_records(recs, str(tmp_path / "o"), format="jsonl.zst", num_shards=4, counters={"made": 100})
    assert m["records"] == 100 and m["num_shards"] == 4 and m["format"] == "jsonl.zst"
    assert [s["records"] for s in m["shards"]] == [25, 25, 25, 25]
    assert [s["bytes"] for s in m["shards"]] == [os.path.getsize(p) for p in list_shards(str(tmp_path / "o"))]
    assert m["counters"] == {"made": 100}
    assert m["errors"] == {"skipped": 0, "examples": [], "reasons": {}}
    assert sorted(os.listdir(tmp_path / "o"))[0] == ".shard-stats"


def test_skip_existing_redoes_only_missing_shards(tmp_path) -> None:
    recs = make_records(400)
    out = tmp_path / "o"
    write_records(recs, str(out), format="parquet", num_shards=4)
    before = _tree(out)
    os.remove(out / "part-00002-of-00004.parquet")
    os.remove(out / "manifest.json")
    mtimes = {n: os.stat(out / n).st_mtime_ns for n in before if n.startswith("part-") and (out / n).exists()}
    write_records(recs, str(out), format="parquet", num_shards=4, skip_existing=True)
    assert _tree(out) == before
    assert all(os.stat(out / n).st_mtime_ns == t for n, t in mtimes.items())  # untouched, not rewritten


def test_fresh_write_removes_stale_manifest_first(tmp_path) -> None:
    out = tmp_path / "o"
    write_records(make_records(10), str(out), format="jsonl")

    def failing():
        yield from make_records(3)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_records(failing(), str(out), format="jsonl")
    assert read_manifest(str(out)) is None  # the folder no longer claims to be complete


def _run(out: Path, mode: str, pause: float) -> str:
    p = subprocess.run(
        [sys.executable, _SCRIPT, str(out), mode, str(pause)], capture_output=True, timeout=300
    )
    assert p.returncode == 0, p.stderr.decode()
    return p.stderr.decode()


def _signal_family(pid: int, sig: int) -> None:
    """Send `sig` to a process and every process it started (the client's workers), all at once."""
    import psutil

    family = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    for p in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def _kill_family(pid: int) -> None:
    _signal_family(pid, signal.SIGKILL)


def test_sigkill_mid_write_then_resume_is_identical(tmp_path) -> None:
    ref, out = tmp_path / "ref", tmp_path / "out"
    _run(ref, "fresh", 0.0)
    cmd = [sys.executable, _SCRIPT, str(out), "fresh", "0.6"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            names = os.listdir(out) if out.exists() else []
            done = [n for n in names if n.startswith("part-")]
            temps = [n for n in names if ".tmp-" in n]
            if len(done) >= 3 and temps:
                # Freeze the family, then look again: a shard may have been renamed since the listing. Kill
                # only while a temp file is really there, so the kill lands mid-shard on a loaded machine too.
                _signal_family(proc.pid, signal.SIGSTOP)
                if [n for n in os.listdir(out) if ".tmp-" in n]:
                    break
                _signal_family(proc.pid, signal.SIGCONT)
            time.sleep(0.02)
        else:
            raise AssertionError(f"the writer never got 3 shards in: {names}")
        _kill_family(proc.pid)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    left = os.listdir(out)
    assert "manifest.json" not in left
    assert [n for n in left if ".tmp-" in n], "the kill should land mid-shard"
    assert [n for n in left if n.startswith(".work-")], (
        "the shuffle's finished map side is kept for the rerun"
    )
    # Every shard under its final name is complete: it reads without error.
    for n in sorted(n for n in left if n.startswith("part-")):
        assert sum(1 for _ in read_records(str(out / n))) > 0
    log = _run(out, "resume", 0.0)
    assert "stage 0 (shuffle): reused 6 of 6 finished tasks" in log  # the map side is not redone
    assert _tree(out) == _tree(ref)
    assert _tree(out / ".shard-stats") == _tree(ref / ".shard-stats")
    assert not [n for n in os.listdir(out) if ".tmp-" in n or n.startswith(".work-")]


def test_finished_write_clears_leftovers_of_killed_runs(tmp_path) -> None:
    out = tmp_path / "o"
    (out / ".work-0123abcd" / "stage-00").mkdir(parents=True)
    (out / ".work-0123abcd" / "stage-00" / "t-00000.spill").write_bytes(b"x")
    (out / ".part-00000-of-00001.jsonl.tmp-1-deadbeef").write_bytes(b"partial")
    write_records(make_records(5), str(out), format="jsonl")
    assert sorted(os.listdir(out)) == [".shard-stats", "manifest.json", "part-00000-of-00001.jsonl"]
