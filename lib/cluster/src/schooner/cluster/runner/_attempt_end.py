"""The end of a step's attempt as the runner writes it: record, history line, then status.

Also what that end needs around it: restoring a published output when a forced rerun over it fails or is
interrupted, the disk space kept aside in a local step's `.schooner/` so that a step that filled the disk can
still record its end, whether the lease is still held, and the phrase saying how an interrupted step
continues.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from schooner.cluster.records import (
    StepState,
    append_history,
    meta_path,
    write_step_record,
    write_step_status,
)
from schooner.cluster.storage import is_plain_path, storage_for

from ._lease import Lease
from ._lower import Step

DISK_RESERVE_BYTES = 256 * 1024
"""Space kept aside in a local step's `.schooner/` while it runs, freed to record its end when the step
filled the disk (a full disk would otherwise leave the status RUNNING, read as INTERRUPTED)."""
DISK_RESERVE = "disk-reserve"


def record_end(
    step: Step, out: str, record: dict, lease: Lease, state: StepState, *, error: str = "", fn_sha: str = ""
) -> None:
    """The end of an attempt, in order: its record, its line in the history, then the status (last)."""
    storage = storage_for(out)
    write_step_record(out, record, storage=storage)
    append_history(out, record, storage=storage)
    write_step_status(
        out,
        state,
        key=step.key,
        name=step.name,
        owner=lease.owner,
        error=error,
        fn_sha=fn_sha,
        storage=storage,
    )


def restore_published(
    step: Step, out: str, record: dict, published: tuple[Any, dict], error: str, state: str = "failed"
) -> None:
    """A forced rerun over a published output failed (or was interrupted): the output is the old one, so its
    record and status go back to it (the record saying which rerun failed), the attempt goes to history."""
    status, previous = published
    storage = storage_for(out)
    append_history(out, record, storage=storage)
    note = (
        f"a forced rerun {state} (run {record.get('run_id')}): {error}; this output was published before it"
    )
    restored = {
        **previous,
        "last_failed_attempt": {
            "run_id": record.get("run_id"),
            "owner": record.get("owner"),
            "state": record.get("state"),
            "ended": record.get("ended"),
            "error": error,
            "failed_attempt_path": record.get("failed_attempt_path"),
        },
    }
    write_step_record(out, restored, storage=storage)
    write_step_status(
        out,
        StepState.SUCCESS,
        key=step.key,
        name=step.name,
        owner=status.owner,
        error=note[:500],
        fn_sha=status.fn_sha,
        storage=storage,
    )


def is_disk_full(err: BaseException) -> bool:
    import errno

    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


def held_now(lease: Lease) -> bool:
    """Whether the lease is still ours; True when the lease file cannot be read (a storage error is not a
    lost lease: the status write that follows is checked again)."""
    try:
        return lease.still_held()
    except Exception:  # noqa: BLE001 - OSError or a store client's own exception type
        return True


def reserve_disk(out: str) -> None:
    """Keep `DISK_RESERVE_BYTES` aside in a local step's `.schooner/` (best effort: a disk already this full
    fails the step's own writes soon enough)."""
    if not is_plain_path(out):
        return
    with contextlib.suppress(OSError), open(meta_path(out, DISK_RESERVE), "wb") as f:
        f.write(b"\0" * DISK_RESERVE_BYTES)
        f.flush()
        os.fsync(f.fileno())


def free_reserve(out: str) -> bool:
    """Delete the space kept aside; True when there was some."""
    if not is_plain_path(out):
        return False
    try:
        os.unlink(meta_path(out, DISK_RESERVE))
    except OSError:
        return False
    return True


def seconds_text(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60)} s"


def how_it_continues(step: Step, out: str) -> str:
    """'a rerun resumes it from checkpoint step-000040' / 'a rerun starts it again'. `out`: the attempt's
    folder (what the hint reads)."""
    h = step.handle
    if not h.resumable:
        return "a rerun starts it again from an empty folder"
    hint = None
    if h.resume_hint is not None:
        with contextlib.suppress(Exception):  # a hint must never hide the interrupt itself
            hint = h.resume_hint(out)
    return f"a rerun resumes it {hint}" if hint else "a rerun resumes it from its partial output"
