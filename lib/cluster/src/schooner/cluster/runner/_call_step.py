"""What runs once per attempt where a step's function runs (a worker, or the runner for an in-process step).

`call_step` checks that the step's source files are the ones its key was computed from, prepares the
attempt's folder (process 0 of a gang prepares it, the others wait), logs each start and end of the function
in `.schooner/starts.jsonl` and calls the function; `read_starts` reads that log back for the step's
record. `imported_afresh` picks the files a worker checks (those it imports afresh).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

from schooner.cluster._fingerprint import changed_files
from schooner.cluster._gang import current_gang
from schooner.cluster.records import META_DIR, meta_path
from schooner.cluster.storage import clear_folder, is_plain_path, storage_for


class CodeChangedError(RuntimeError):
    """A source file of a step's code changed after the step's key was computed (edited during the run): the
    worker would run other code than the key names, so the step does not run."""


def call_step(
    fn: Any, config: Any, output_path: str, resumable: bool = False, code_files: dict[str, str] | None = None
) -> Any:
    """What runs on a worker (or in the runner), once per attempt: make the local output folder, empty it
    unless the step is resumable (so a killed attempt's partial output never mixes with this one's), call
    `fn`. The runner's own files (`.schooner/`) stay.

    In a gang (a step with `hosts > 1`), process 0 prepares the folder and the others wait for it, so no
    process writes into a folder that is about to be emptied.

    Every start appends a line to `{output_path}/.schooner/starts.jsonl` (node, host, pid, time) and, when
    the function returns or raises, its end: a start without an end died with its worker or node (a
    preemption), and the runner records all of them in the step's record and history.

    `code_files` (path -> SHA-256 of the user source files the step's key was computed from; given for steps
    that run in a worker, which imports them afresh): a file whose text differs here raises
    `CodeChangedError` before the function runs."""
    changed = changed_files(code_files or {})
    if changed:
        raise CodeChangedError(
            f"{', '.join(changed)} changed after this run computed the step's key (edited during the run?): "
            "the worker would run the new code under a key that names the old one; rerun to key the step by "
            "the code as it is now"
        )
    gang = current_gang()
    if gang is not None and gang.num_processes > 1:
        _gang_prepare(output_path, resumable, gang.process_id, gang.attempt)
    else:
        if not resumable:
            clear_folder(output_path, keep=META_DIR)
        if is_plain_path(output_path) and not os.path.isdir(output_path):
            os.makedirs(output_path, exist_ok=True)
    start = _log_start(output_path, gang.process_id if gang is not None else 0)
    try:
        value = fn(config, output_path)
    except BaseException as e:
        _log_end(output_path, start, f"raised {type(e).__name__}")
        raise
    _log_end(output_path, start, "returned")
    return value


STARTS = "starts.jsonl"


def _node_name() -> str:
    """The Ray node this runs on (its `--node-name`), else the host name."""
    import socket
    import sys

    ray = sys.modules.get("ray")
    with contextlib.suppress(Exception):
        if ray is not None and ray.is_initialized():
            me = ray.get_runtime_context().get_node_id()
            return str(next(n["NodeName"] for n in ray.nodes() if n["NodeID"] == me))
    return socket.gethostname()


def _log_start(output_path: str, process: int) -> str:
    """Append this start to the attempt's `starts.jsonl` (best effort: it is a record, not a requirement)."""
    import json
    import socket

    start = uuid.uuid4().hex[:12]
    line = {"start": start, "node": _node_name(), "host": socket.gethostname(), "pid": os.getpid()}
    line.update(process=process, started=time.time())
    _append_line(output_path, json.dumps(line, allow_nan=False), make=True)
    return start


def _log_end(output_path: str, start: str, how: str) -> None:
    import json

    _append_line(output_path, json.dumps({"start": start, "ended": time.time(), "how": how}, allow_nan=False))


def _append_line(output_path: str, line: str, make: bool = False) -> None:
    """`make`: create the folder if needed (never for an end: a fenced-off attempt's folder may be gone)."""
    with contextlib.suppress(Exception):
        if is_plain_path(output_path):
            if make:
                os.makedirs(os.path.join(output_path, META_DIR), exist_ok=True)
            with open(meta_path(output_path, STARTS), "a") as f:
                f.write(line + "\n")
            return
        storage = storage_for(output_path)
        path = meta_path(output_path, STARTS)
        storage.write_text(path, (storage.read_text(path) or "") + line + "\n")


def read_starts(attempt: str) -> list[dict[str, Any]]:
    """The starts of an attempt's function, oldest first: node, host, pid, process, started, and ended with
    `how` ('returned', 'raised X') or, for a start that never ended (its worker or node died), `how`
    'died (worker or node lost)' and `ended` None."""
    import json

    text = storage_for(attempt).read_text(meta_path(attempt, STARTS)) or ""
    starts: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            d = json.loads(raw)
            if "node" in d:
                starts[d["start"]] = {**d, "ended": None, "how": "died (worker or node lost)"}
            elif d["start"] in starts:
                starts[d["start"]].update(ended=d["ended"], how=d["how"])
    return sorted(starts.values(), key=lambda d: d["started"])


GANG_READY_TIMEOUT_S = 600.0


def _gang_prepare(output_path: str, resumable: bool, process_id: int, attempt: str) -> None:
    storage = storage_for(output_path)
    marker = meta_path(output_path, f"gang-{attempt}.ready")
    if process_id == 0:
        if not resumable:
            clear_folder(output_path, keep=META_DIR)
        for old in storage.glob(meta_path(output_path, "gang-*.ready")):
            storage.remove(old)
        storage.makedirs(output_path)
        storage.write_text(marker, attempt)
        return
    deadline = time.monotonic() + GANG_READY_TIMEOUT_S
    while not storage.exists(marker):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gang process {process_id}: process 0 did not prepare {output_path} within "
                f"{GANG_READY_TIMEOUT_S:g} s (is the prefix shared by every host?)"
            )
        time.sleep(0.05)


def imported_afresh(files: dict[str, str]) -> dict[str, str]:
    """The files of `files` a worker imports afresh: not the script run as `__main__` nor modules shipped by
    value (their code travels from this process, as the key saw it)."""
    import sys

    from schooner.cluster._worker_pickle import needs_by_value

    if not files:
        return files
    by_value = set()
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and os.path.abspath(path) in files:
            with contextlib.suppress(Exception):
                if getattr(mod, "__name__", "") == "__main__" or needs_by_value(mod):
                    by_value.add(os.path.abspath(path))
    return {p: d for p, d in files.items() if p not in by_value}
