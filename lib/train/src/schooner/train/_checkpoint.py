"""Checkpoints: asynchronous, atomic, with a keep policy and discovery of the latest complete one.

Layout under the run's output folder::

    step-000010/
        config.json        the model config (schooner.model.load_model reads the model from this folder)
        ...                the model's arrays, written by schooner.model.save_model
        train_state/       optimizer state, RNG key and step (tensorstore, one array per leaf)
        checkpoint.json    written LAST: step, metrics, data position; its presence marks completeness

A checkpoint is first written to `step-000010.tmp-<pid>/` and renamed into place only after
`checkpoint.json` is in it, so a crash (even `kill -9`) mid-write leaves a `.tmp-` folder that is never
loaded and is removed by the next run. On object stores without atomic rename the marker alone decides.

Pruning is atomic the same way: an old checkpoint is renamed to `step-000010.trash-<pid>/` and only then
deleted, so a prune cut midway leaves a `.trash-` folder, never a `step-000010/` with half its files that a
load could pick. On object stores the marker goes first. The manager's start and every prune remove such
leftovers (and a local step folder without its marker, which no write of this manager leaves).

Several hosts (a multi-host run) write one checkpoint together: process 0 prepares the folder, all wait,
each writes the pieces of the arrays its own devices hold (`schooner.model.save_pytree`), all wait, then
process 0 alone writes the marker, renames and prunes, and all wait once more so every host sees the commit.
The waits are the coordination service's barriers (not collectives), safe on the writer thread.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from schooner.cluster import storage
from schooner.model import CHECKPOINT_MARKER, checkpoint_folder_name, checkpoint_step, list_checkpoints

from ._run_info import run_in_context

# Fault injection for the crash-during-write test: when set to N, the N-th checkpoint write of this process
# touches `<tmp>/.paused` after writing the arrays and then sleeps, so a test can `kill -9` it mid-write.
_PAUSE_ENV = "SCHOONER_TRAIN_PAUSE_CHECKPOINT_WRITE"
# The same for pruning: when set to N, the N-th checkpoint this process prunes is renamed to its trash name,
# half its files deleted, `<trash>/.paused` touched, and then it sleeps (the interrupted-prune test).
_PRUNE_PAUSE_ENV = "SCHOONER_TRAIN_PAUSE_CHECKPOINT_PRUNE"
_TRASH = ".trash-"
BARRIER_TIMEOUT_S = 600
"""How long a host waits for the others at a checkpoint barrier before the write fails."""


@dataclass(frozen=True)
class CheckpointConfig:
    """When to write checkpoints and which to keep.

    Example:
        >>> CheckpointConfig(every=100, keep_last=2, keep_every=1000).keep_last
        2
    """

    every: int | None = 1000
    """Write a checkpoint every this many steps (None: only at the end, and at multiples of `keep_every`)."""
    keep_last: int = 2
    """Keep this many most recent checkpoints (older ones are deleted after a newer one is complete)."""
    keep_every: int | None = None
    """Also write and keep, for good, a checkpoint at every multiple of this step (written even where `every`
    does not land on it)."""
    save_final: bool = True
    """Write a checkpoint after the last step."""
    asynchronous: bool = True
    """Write on a background thread so the step loop does not wait."""

    def __post_init__(self) -> None:
        for f in ("save_final", "asynchronous"):  # the string "false" is truthy: refuse, do not coerce
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise ValueError(
                    f"CheckpointConfig.{f} must be True or False, got {v!r} ({type(v).__name__})"
                )
        # True == 1 in Python: a flag where a count belongs is refused below (`_count`), not read as 1.
        if self.every is not None and (not _count(self.every) or self.every <= 0):
            raise ValueError(
                f"CheckpointConfig.every must be a positive int or None, got every={self.every!r}"
            )
        if not _count(self.keep_last) or self.keep_last < 1:
            raise ValueError(
                f"CheckpointConfig.keep_last must be an int >= 1 (the latest checkpoint is always kept), "
                f"got keep_last={self.keep_last!r}"
            )
        if self.keep_every is not None and (not _count(self.keep_every) or self.keep_every <= 0):
            raise ValueError(
                f"CheckpointConfig.keep_every must be a positive int or None, got {self.keep_every!r}"
            )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def complete_checkpoints(root: str) -> list[tuple[int, str]]:
    """The complete checkpoints under `root` as (step, path), oldest first (incomplete ones are ignored).

    `schooner.model.list_checkpoints(root, require_config=False)`: a folder counts once its `checkpoint.json`
    is written, whatever the manager's `write_fn` stored (a train run's also hold the model's `config.json`).
    """
    return list_checkpoints(root, require_config=False)


def latest_checkpoint(root: str) -> tuple[int, str] | None:
    """The newest complete checkpoint under `root` as `(step, path)`, or None (a fresh run, or no such folder).

    A thin wrapper over `schooner.model.list_checkpoints` for resuming; to resolve a path to a checkpoint folder
    with an error that explains what is missing, use `schooner.model.find_checkpoint`.
    """
    found = complete_checkpoints(root)
    return found[-1] if found else None


def read_marker(path: str) -> dict[str, Any]:
    """The `checkpoint.json` of a complete checkpoint folder."""
    marker: dict[str, Any] = storage.read_json(storage.join(path, CHECKPOINT_MARKER))
    return marker


class CheckpointManager:
    """Writes checkpoints (optionally on a background thread) and applies the keep policy.

    The caller supplies `write_fn(folder, snapshot)` that writes the arrays into `folder`; the manager
    owns the folder's life cycle: temporary name, marker last, rename, pruning, error propagation.
    """

    def __init__(
        self, root: str, config: CheckpointConfig, *, log: Callable[[str], None] | None = None
    ) -> None:
        self.root = root.rstrip("/")
        self.config = config
        self._log = log or (lambda msg: None)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._writes = 0
        self._prunes = 0
        self.write_seconds: list[float] = []
        self._multi, self._primary = jax.process_count() > 1, jax.process_index() == 0
        self._barriers = 0
        if self._primary:
            self._remove_stale_temporaries()
        self._barrier("start")

    def _remove_stale_temporaries(self, *, writes: bool = True) -> None:
        """Remove what interrupted writes (`writes`) and prunes left: `.tmp-` and `.trash-` folders, and step
        folders without their marker (an object store's in-place write, or a prune cut after the marker)."""
        for name in storage.listdir(self.root):
            if not name.startswith("step-"):
                continue
            entry = storage.join(self.root, name)
            if _TRASH in name:
                self._log(f"removing {name} (a checkpoint whose pruning was interrupted)")
                storage.remove_tree(entry)
            elif ".tmp-" in name:
                if writes:
                    self._log(f"removing incomplete checkpoint {name} (left by an interrupted write)")
                    storage.remove_tree(entry)
            elif checkpoint_step(name) is not None and not storage.exists(
                storage.join(entry, CHECKPOINT_MARKER)
            ):
                # Locally a step folder only ever appears by the rename after its marker: without one it is
                # what an interrupted prune left. On object stores, also an interrupted in-place write.
                self._log(
                    f"removing {name}: a step folder without {CHECKPOINT_MARKER} (interrupted prune or write)"
                )
                storage.remove_tree(entry)

    def _barrier(self, what: str) -> None:
        """On several hosts, wait until every process got here (a no-op on one)."""
        if not self._multi:
            return
        from jax._src import distributed

        self._barriers += 1
        client = distributed.global_state.client
        if client is None:
            raise RuntimeError(
                f"checkpoint under {self.root}: {jax.process_count()} processes but jax.distributed is not "
                "initialized, so the hosts cannot meet at a barrier; call jax.distributed.initialize() first"
            )
        try:
            client.wait_at_barrier(
                f"schooner-ckpt-{self.root}-{self._barriers}-{what}", BARRIER_TIMEOUT_S * 1000
            )
        except Exception as e:
            raise RuntimeError(
                f"checkpoint under {self.root}: process {jax.process_index()} waited {BARRIER_TIMEOUT_S}s at "
                f"{what!r} for the other hosts, which did not all arrive (one died or hangs): {e}"
            ) from e

    def _tmp_tag(self) -> str:
        # A name every host of the run agrees on (one process: its pid; a gang: the start's id).
        if not self._multi:
            return str(os.getpid())
        return os.environ.get("SCHOONER_GANG_ATTEMPT") or "multihost"

    def should_save(self, step: int, *, last_step: int) -> bool:
        """Whether the policy asks for a checkpoint after `step` (steps counted from 1)."""
        if step == last_step and self.config.save_final:
            return True
        if self.config.keep_every is not None and step % self.config.keep_every == 0:
            return True  # kept for good: written whether or not `every` lands on it
        return self.config.every is not None and step % self.config.every == 0

    def save(
        self,
        step: int,
        snapshot: Any,
        write_fn: Callable[[str, Any], None],
        metadata: dict[str, Any],
    ) -> None:
        """Write checkpoint `step`: `write_fn(tmp_folder, snapshot)`, then the marker, then the rename.

        `snapshot` must not alias buffers the training loop will donate (copy device arrays first).
        Waits for the previous write to finish first; re-raises its error if it failed.
        """
        self.wait()
        self._writes += 1
        args = (step, snapshot, write_fn, dict(metadata), self._writes)
        if self.config.asynchronous:
            self._thread = threading.Thread(  # in the caller's context: its log lines are the run's
                target=run_in_context(self._write_guarded), args=args, name=f"checkpoint-{step}", daemon=True
            )
            self._thread.start()
        else:
            self._write(*args)

    def _write_guarded(self, *args: Any) -> None:
        try:
            self._write(*args)
        except BaseException as e:  # re-raised on the main thread by wait()
            self._error = e

    def _write(
        self, step: int, snapshot: Any, write_fn: Callable[[str, Any], None], metadata: dict, nth: int
    ) -> None:
        t0 = time.perf_counter()
        final = f"{self.root}/{checkpoint_folder_name(step)}"
        local = storage.is_local(self.root)
        folder = f"{final}.tmp-{self._tmp_tag()}" if local else final
        if self._primary:
            storage.remove_tree(folder)
            storage.makedirs(folder)
        self._barrier(f"{step}-prepared")
        write_fn(folder, snapshot)
        if os.environ.get(_PAUSE_ENV) == str(nth):
            storage.write_text(f"{folder}/.paused", "paused")
            time.sleep(3600)
        self._barrier(f"{step}-written")
        if self._primary:
            self._commit(step, folder, final, metadata)
        self._barrier(f"{step}-committed")
        self.write_seconds.append(time.perf_counter() - t0)
        self._log(f"checkpoint {checkpoint_folder_name(step)} written in {self.write_seconds[-1]:.2f}s")

    def _commit(self, step: int, folder: str, final: str, metadata: dict) -> None:
        metadata = {**metadata, "step": step, "written_at": time.time()}
        if isinstance(metadata.get("metrics"), dict):  # JSON has no NaN: null, as metrics.jsonl holds it
            metadata["metrics"] = {k: _finite(v) for k, v in metadata["metrics"].items()}
        storage.write_json(f"{folder}/{CHECKPOINT_MARKER}", metadata, default=str)
        if folder != final:
            final_local = final.removeprefix("file://")
            if os.path.exists(final_local):
                # A checkpoint of this step already exists (e.g. a re-run of the last step): replace it.
                shutil.rmtree(final_local)
            os.replace(folder.removeprefix("file://"), final_local)
        self._prune()

    def _prune(self) -> None:
        found = complete_checkpoints(self.root)
        keep = {s for s, _ in found[-self.config.keep_last :]}
        if self.config.keep_every:
            keep |= {s for s, _ in found if s % self.config.keep_every == 0}
        for s, path in found:
            if s not in keep:
                self._remove_checkpoint(path)
        self._remove_stale_temporaries(writes=False)  # what an earlier, interrupted prune left

    def _remove_checkpoint(self, path: str) -> None:
        """Delete a checkpoint folder so that no moment leaves it loadable with files missing: locally, rename
        it to a `.trash-` name (atomic) and delete that; on object stores, delete its marker first."""
        self._prunes += 1
        if not storage.is_local(self.root):
            storage.remove(storage.join(path, CHECKPOINT_MARKER))
            storage.remove_tree(path)
            return
        fpath = storage.local_path(path)
        trash = f"{fpath}{_TRASH}{self._tmp_tag()}"
        if os.path.exists(trash):
            shutil.rmtree(trash)
        os.replace(fpath, trash)
        if os.environ.get(_PRUNE_PAUSE_ENV) == str(self._prunes):
            files = sorted(os.path.join(d, f) for d, _, fs_ in os.walk(trash) for f in fs_)
            for file in files[: len(files) // 2]:
                os.remove(file)
            with open(os.path.join(trash, ".paused"), "w") as f:
                f.write("paused")
            time.sleep(3600)
        shutil.rmtree(trash)

    def wait(self) -> None:
        """Block until the pending write (if any) is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint under {self.root} failed: {err}") from err

    def close(self) -> None:
        """Finish pending writes."""
        self.wait()


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value
