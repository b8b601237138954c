"""The checkpoint manager: marker last, atomic rename, keep policy, discovery, error propagation."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from schooner.train import CheckpointConfig, CheckpointManager, complete_checkpoints, latest_checkpoint


def write_arrays(folder: str, snapshot: dict) -> None:
    for name, arr in snapshot.items():
        np.save(os.path.join(folder, f"{name}.npy"), arr)


def test_keep_policy_and_discovery(tmp_path) -> None:
    m = CheckpointManager(str(tmp_path), CheckpointConfig(every=1, keep_last=2, keep_every=2))
    for step in range(1, 6):
        m.save(step, {"w": np.full(3, step)}, write_arrays, {"note": step})
    m.close()
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [2, 4, 5]
    step, path = latest_checkpoint(str(tmp_path))
    assert step == 5 and np.load(os.path.join(path, "w.npy")).tolist() == [5, 5, 5]
    with open(os.path.join(path, "checkpoint.json")) as f:
        marker = json.load(f)
    assert marker["step"] == 5 and marker["note"] == 5
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_incomplete_checkpoints_are_never_loaded_and_cleaned_up(tmp_path) -> None:
    m = CheckpointManager(str(tmp_path), CheckpointConfig(every=1))
    m.save(3, {"w": np.zeros(2)}, write_arrays, {})
    m.close()
    # A crash mid-write leaves a temporary folder; a folder without its marker is not complete either.
    os.makedirs(tmp_path / "step-000004.tmp-999")
    (tmp_path / "step-000004.tmp-999" / "w.npy").write_bytes(b"partial")
    os.makedirs(tmp_path / "step-000005")
    assert latest_checkpoint(str(tmp_path))[0] == 3
    CheckpointManager(str(tmp_path), CheckpointConfig(every=1))
    assert not os.path.exists(tmp_path / "step-000004.tmp-999")


def test_write_is_asynchronous_and_errors_surface(tmp_path) -> None:
    release = threading.Event()

    def slow(folder: str, snapshot: dict) -> None:
        release.wait(30)
        write_arrays(folder, snapshot)

    m = CheckpointManager(str(tmp_path), CheckpointConfig(every=1, asynchronous=True))
    m.save(1, {"w": np.ones(2)}, slow, {})
    assert latest_checkpoint(str(tmp_path)) is None  # save() returned while the write is pending
    release.set()
    m.wait()
    assert latest_checkpoint(str(tmp_path))[0] == 1

    def broken(folder: str, snapshot: dict) -> None:
        raise OSError("disk full")

    m.save(2, {}, broken, {})
    with pytest.raises(RuntimeError, match="writing a checkpoint under .* failed: disk full"):
        m.wait()
    assert latest_checkpoint(str(tmp_path))[0] == 1  # the failed one never became visible


def test_should_save() -> None:
    m = CheckpointManager("/nonexistent-dir-for-test", CheckpointConfig(every=5, save_final=True))
    assert [s for s in range(1, 13) if m.should_save(s, last_step=12)] == [5, 10, 12]
    m = CheckpointManager("/nonexistent-dir-for-test", CheckpointConfig(every=None, save_final=False))
    assert not any(m.should_save(s, last_step=12) for s in range(1, 13))
