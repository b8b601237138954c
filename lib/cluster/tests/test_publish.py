"""Fenced writers: every attempt writes into its own folder and a step's output is published whole.

Real driver processes (`schooner run`) and the appending step of `experiments_data/appender.py` (it appends
20 rows to `rows.txt`, one by one, slowly), in the two situations of issue 29:

- a driver reruns the step with `--force` while another reader reads the cached output: every read sees
  the complete old or the complete new file, never a partial or mixed one;
- a driver is stopped (SIGSTOP) past its lease, a second driver takes the step over and finishes it, then
  the first is resumed (SIGCONT): the published output holds exactly the taker's 20 rows, and the stale
  driver neither writes into it nor records SUCCESS; it says that it lost the lease and stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "experiments_data"
APPENDER = str(HERE / "appender.py")


def _driver(prefix: Path, *args: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "COLUMNS": "200", "APP_WHERE": "process", **env}
    full.pop("SCHOONER_PREFIX", None)
    return subprocess.Popen(
        [sys.executable, "-m", "schooner.cluster.cli", "run", APPENDER, "--prefix", str(prefix), *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _any_rows(prefix: Path) -> int:
    """The most rows in any `rows.txt` under the prefix: published, or an attempt's own folder."""
    counts = [len(p.read_text().splitlines()) for p in prefix.rglob("rows.txt")]
    return max(counts, default=0)


def _wait(cond, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver ended before {what}:\n{proc.communicate()[0]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no {what} after {timeout} s:\n{proc.communicate()[0]}")


def _published(prefix: Path) -> Path:
    (folder,) = prefix.glob("rows-*")
    return folder


def test_a_forced_rerun_never_shows_a_reader_a_partial_or_mixed_output(tmp_path: Path) -> None:
    prefix = tmp_path / "out"
    first = _driver(prefix, APP_DELAY="0", APP_TAG="old")
    text = first.communicate(timeout=120)[0]
    assert first.returncode == 0, text
    rows = _published(prefix) / "rows.txt"
    old = [f"old row {i}" for i in range(20)]
    new = [f"new row {i}" for i in range(20)]
    assert rows.read_text().splitlines() == old

    seen: list[str] = []  # one entry per read: "old", "new" or what was wrong with it
    stop = threading.Event()

    def read_forever() -> None:
        while not stop.is_set():
            try:
                lines = rows.read_text().splitlines()
            except FileNotFoundError:
                seen.append("missing")
                continue
            seen.append("old" if lines == old else "new" if lines == new else f"partial: {len(lines)} rows")

    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        forcer = _driver(prefix, "--force", "rows", APP_DELAY="0.05", APP_TAG="new")
        # Meanwhile a second driver plans the step as cached (or waits for the forced run) and reads it.
        second = subprocess.run(
            [sys.executable, "-c", _READER, str(prefix), APPENDER],
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = forcer.communicate(timeout=120)[0]
    finally:
        stop.set()
        reader.join()
    assert forcer.returncode == 0, text
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) in (old, new)
    bad = sorted({s for s in seen if s not in ("old", "new")})
    assert not bad, f"a reader saw {bad} while the step was forced ({len(seen)} reads)"
    assert seen.count("old") > 0 and seen[-1] == "new", (seen.count("old"), seen[-5:])
    assert rows.read_text().splitlines() == new
    # Nothing of the attempt is left beside the published folder once it is done.
    assert sorted(p.name for p in prefix.iterdir() if p.name != "experiments") == [rows.parent.name]


# A second driver: plans the appender's step (cached, or waits for the forced run) and reads its output
# through the runner's own result, the way a dependent step gets it.
_READER = """
import json, os, runpy, sys, time
prefix = sys.argv[1]
os.environ["APP_WHERE"] = "process"
os.environ["APP_DELAY"] = "0"
mod = runpy.run_path(sys.argv[2], run_name="appender")
from schooner.cluster import StepRunner
res = StepRunner(prefix=prefix, quiet=True).run([mod["rows"]])
path = os.path.join(res[mod["rows"]].output_path, "rows.txt")
lines = []
with open(path) as f:  # slowly, line by line: a rewrite in place would show up here
    for line in f:
        lines.append(line.rstrip("\\n"))
        time.sleep(0.01)
print(json.dumps(lines))
"""


@pytest.mark.slow  # about 15-20 s: a lease must expire while its driver is stopped
def test_a_driver_stopped_past_its_lease_never_writes_into_the_takers_output(tmp_path: Path) -> None:
    prefix = tmp_path / "out"
    env = {"SCHOONER_LEASE_TTL": "2"}  # heartbeat every ttl/12
    stale = _driver(prefix, APP_DELAY="0.2", APP_TAG="stale", **env)
    try:
        _wait(lambda: _any_rows(prefix) >= 4, stale, "4 rows")
        os.kill(stale.pid, signal.SIGSTOP)
        time.sleep(3.0)  # past the ttl: its lease is stale now
        taker = _driver(prefix, APP_DELAY="0.02", APP_TAG="taker", **env)
        text = taker.communicate(timeout=120)[0]
        assert taker.returncode == 0, text
        assert "took over a stale lease" in text, text
        folder = _published(prefix)
        taker_rows = [f"taker row {i}" for i in range(20)]
        assert (folder / "rows.txt").read_text().splitlines() == taker_rows
        done = json.loads((folder / ".schooner" / "status.json").read_text())
        assert done["status"] == "SUCCESS"
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    stale_text = stale.communicate(timeout=60)[0]
    time.sleep(1.0)  # anything still writing would be seen now
    assert (folder / "rows.txt").read_text().splitlines() == taker_rows, stale_text
    assert json.loads((folder / ".schooner" / "status.json").read_text()) == done
    assert stale.returncode == 1, stale_text
    assert "lost its lease" in stale_text, stale_text
    history = [json.loads(x) for x in (folder / ".schooner" / "history.jsonl").read_text().splitlines()]
    assert [h["state"] for h in history] == ["LOST", "SUCCESS"], history
    assert history[-1]["owner"] == done["owner"]
    # The stale attempt's own folder is gone, nothing but the published folder is left.
    assert sorted(p.name for p in prefix.iterdir() if p.name != "experiments") == [folder.name]


# -- publication in one process: the atomic exchange, its fallback, object stores ------------------------


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    from schooner.cluster.runner._publish import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("from a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "y").write_text("from b")
    exchange(str(tmp_path / "a"), str(tmp_path / "b"))
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["y"]
    assert (tmp_path / "b" / "x").read_text() == "from a"


def write_tagged(config: dict, out: str) -> dict:
    import fsspec

    with fsspec.open(f"{out}/rows.txt", "w") as f:  # a local folder or a memory:// one
        f.write(os.environ.get("PUBLISH_TEST_TAG", "none"))
    return {"n": config["n"]}


def _run_tagged(prefix: str, tag: str, **kw):
    import io

    from rich.console import Console

    from schooner.cluster import StepRunner, step

    os.environ["PUBLISH_TEST_TAG"] = tag
    try:
        h = step("tagged", write_tagged, {"n": 1})
        return h, StepRunner(prefix=prefix, console=Console(file=io.StringIO())).run([h], **kw)
    finally:
        del os.environ["PUBLISH_TEST_TAG"]


def test_without_renameat2_the_old_output_is_renamed_aside(tmp_path: Path, monkeypatch) -> None:
    from schooner.cluster.runner import _publish

    def no_exchange(a: str, b: str) -> None:
        raise OSError(38, "renameat2 is not available")

    monkeypatch.setattr(_publish, "exchange", no_exchange)
    h, first = _run_tagged(str(tmp_path), "old")
    h, again = _run_tagged(str(tmp_path), "new", force="tagged")
    assert again[h].state == "succeeded"
    folder = Path(again[h].output_path)
    assert (folder / "rows.txt").read_text() == "new"
    assert json.loads((folder / ".schooner" / "status.json").read_text())["status"] == "SUCCESS"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiments", folder.name]


def test_an_object_store_prefix_publishes_the_attempt_too() -> None:
    import fsspec

    prefix = f"memory://publish-{os.getpid()}-{time.time_ns()}"
    h, first = _run_tagged(prefix, "old")
    h, again = _run_tagged(prefix, "new", force="tagged")
    fs = fsspec.filesystem("memory")
    out = again[h].output_path
    assert fs.cat_file(out + "/rows.txt") == b"new"
    assert json.loads(fs.cat_file(out + "/.schooner/status.json"))["status"] == "SUCCESS"
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(prefix, detail=False))
    assert names == ["experiments", out.rsplit("/", 1)[-1]]
