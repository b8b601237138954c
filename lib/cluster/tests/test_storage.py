"""The one atomic write of Schooner's packages (`atomic_write`, `atomic_open`): readers see the old file or
the new one, never a part, even when the writer is SIGKILLed mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec

from schooner.cluster import atomic_open, atomic_write, is_temp_name

_WRITER = """
import sys, time
from schooner.cluster import atomic_open
with atomic_open(sys.argv[1]) as f:
    for i in range(10_000):
        f.write(b"x" * 65536)
        f.flush()
        if i == 20:
            open(sys.argv[1] + ".started", "w").close()
        time.sleep(0.01)
"""


def test_a_writer_killed_mid_stream_leaves_the_old_file_and_only_a_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "shard.bin"
    atomic_write(str(target), b"old content")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)])
    deadline = time.monotonic() + 60
    while not Path(f"{target}.started").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert target.read_bytes() == b"old content"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("shard.bin", "shard.bin.started")]
    assert len(leftovers) == 1 and is_temp_name(leftovers[0]) and not is_temp_name("shard.bin")


def test_streamed_and_whole_writes_appear_complete_locally_and_on_object_stores(tmp_path: Path) -> None:
    for root in (str(tmp_path / "local"), f"memory://atomic-{uuid.uuid4().hex}"):
        with atomic_open(f"{root}/a/b.bin") as f:
            f.write(b"part one, ")
            f.write(b"part two")
        atomic_write(f"{root}/c.txt", "whole")
        with fsspec.open(f"{root}/a/b.bin", "rb") as f:
            assert f.read() == b"part one, part two"
        with fsspec.open(f"{root}/c.txt") as f:
            assert f.read() == b"whole"
    try:
        with atomic_open(str(tmp_path / "failed.bin")) as f:
            f.write(b"half")
            raise RuntimeError("the writer fails")
    except RuntimeError:
        pass
    assert not (tmp_path / "failed.bin").exists() and not any(
        is_temp_name(p.name) for p in tmp_path.iterdir()
    )
