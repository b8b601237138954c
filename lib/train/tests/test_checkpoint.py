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


_PRUNING_RUN = """
import sys, jax
from schooner.model import init, save_model
from schooner.train import CheckpointConfig, CheckpointManager
sys.path.insert(0, sys.argv[2])
from conftest import _nano

cfg = _nano()
model = init(cfg, key=jax.random.PRNGKey(0))
m = CheckpointManager(sys.argv[1], CheckpointConfig(every=1, keep_last=1, asynchronous=False))
for step in (1, 2):  # step 2's commit prunes step 1: paused (then killed) halfway through its files
    m.save(step, model, lambda folder, snap: save_model(folder, snap, cfg), {})
"""


def _real_checkpoint_files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


@pytest.mark.slow
def test_a_prune_killed_midway_leaves_nothing_loadable_and_the_next_start_cleans_it(tmp_path) -> None:
    """A real run's checkpoint (save_model's arrays and config) pruned, and the process `kill -9`-ed with
    half its files deleted: no `step-000001/` with files missing is there to load, and the next start
    removes what is left."""
    import signal
    import subprocess
    import sys
    import time

    from schooner.model import find_checkpoint, list_checkpoints, load_model

    root = tmp_path / "run"
    env = {**os.environ, "SCHOONER_TRAIN_PAUSE_CHECKPOINT_PRUNE": "1", "JAX_PLATFORMS": "cpu"}
    tests = os.path.dirname(__file__)
    proc = subprocess.Popen([sys.executable, "-c", _PRUNING_RUN, str(root), tests], env=env)
    try:
        deadline = time.time() + 120
        while not list(root.glob("step-000001*/.paused")):
            assert proc.poll() is None and time.time() < deadline, "the prune never paused"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = [p.name for p in root.iterdir()]
    (half,) = [p for p in root.iterdir() if p.name.startswith("step-000001")]
    full = _real_checkpoint_files(root / "step-000002")
    assert 0 < len(_real_checkpoint_files(half)) - 1 < len(full)  # half its files gone (.paused aside)
    assert "step-000001" not in left
    assert [s for s, _ in list_checkpoints(str(root))] == [2]
    with pytest.raises(FileNotFoundError):
        find_checkpoint(str(root), step=1)
    load_model(find_checkpoint(str(root)))  # the latest loads
    CheckpointManager(str(root), CheckpointConfig(every=1))
    assert sorted(p.name for p in root.iterdir()) == ["step-000002"]


def test_a_half_deleted_step_folder_from_an_older_prune_is_cleaned_at_start(tmp_path) -> None:
    """A real checkpoint folder that an older, non-atomic prune left half deleted (its marker among the
    files gone) stayed forever: it is removed when the next manager starts; the complete one is kept."""
    import jax

    from schooner.model import init, list_checkpoints, save_model

    from .conftest import _nano

    cfg = _nano()
    model = init(cfg, key=jax.random.PRNGKey(0))
    m = CheckpointManager(str(tmp_path), CheckpointConfig(every=1, keep_last=2))
    for step in (1, 2):
        m.save(step, model, lambda folder, snap: save_model(folder, snap, cfg), {})
    m.close()
    old = tmp_path / "step-000001"
    files = _real_checkpoint_files(old)
    assert "checkpoint.json" in files and len(files) > 4
    for f in [*files[: len(files) // 2], "checkpoint.json"]:
        if os.path.exists(old / f):
            os.remove(old / f)
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [2]
    CheckpointManager(str(tmp_path), CheckpointConfig(every=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000002"]


def test_keep_every_keeps_its_multiples_when_every_does_not_land_on_them(tmp_path) -> None:
    """every=3, keep_every=10: the steps 10 and 20 asked to be kept for good must be written (they are not
    multiples of 3), or the policy keeps nothing but the last checkpoints."""
    m = CheckpointManager(str(tmp_path), CheckpointConfig(every=3, keep_last=1, keep_every=10))
    for step in range(1, 26):
        if m.should_save(step, last_step=25):
            m.save(step, {"w": np.full(2, step)}, write_arrays, {})
    m.close()
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [10, 20, 25]
    only_final = CheckpointManager(str(tmp_path / "b"), CheckpointConfig(every=None, keep_every=10))
    assert [s for s in range(1, 26) if only_final.should_save(s, last_step=25)] == [10, 20, 25]
