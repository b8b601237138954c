"""The on-disk records of a step's output folder, written and read only through this module.

A step's output folder holds the runner's own files under `.schooner/` and, when the step logs any, its
metrics at the top:

- `.schooner/status.json`: the state of the latest attempt (`step_status`); SUCCESS is written last, after
  the outputs and the step record are complete, so a folder marked SUCCESS never holds partial output;
- `.schooner/step.json`: the provenance of the latest attempt (`read_step_record`);
- `.schooner/history.jsonl`: every attempt's end, oldest first (`read_history`), so an earlier failure's
  traceback survives a later success;
- `metrics.jsonl`: one JSON object per logged row (`read_metrics`, `MetricsWriter`, `append_metrics`);
  a row has a `step` field and any numeric fields beside it. NaN and infinities are stored as `null`
  (JSON has no such numbers): a diverged loss reads back as `None`.

An experiment run is recorded at `{prefix}/experiments/{name}-{key}/{start}-{run_id}.json`
(`read_experiment_records`).

Every path is a local folder or any fsspec URL (`schooner.cluster.storage`).

Example:
    >>> from schooner.cluster import records
    >>> records.append_metrics("memory://records-demo/run", {"step": 1, "train/loss": 2.5})
    >>> records.append_metrics("memory://records-demo/run", {"step": 2, "train/loss": float("nan")})
    >>> records.read_metrics("memory://records-demo/run")
    [{'step': 1, 'train/loss': 2.5}, {'step': 2, 'train/loss': None}]
    >>> records.step_status("memory://records-demo/run") is None  # not a step the runner ran
    True
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._reading import NotStandardJSON, strict_loads
from .storage import (
    Storage,
    decode_utf8,
    dumps_json,
    is_local,
    join,
    json_kind,
    loads_json,
    local_path,
    read_bytes,
    storage_for,
    url_to_fs,
)

META_DIR = ".schooner"
"""Folder inside every step output that holds the runner's own files (status, lease, record, history)."""

METRICS_FILE = "metrics.jsonl"
"""The metrics file at the top of a step's output folder."""

HISTORY_KEEP = 50
"""Attempts kept in a step's `history.jsonl` (the oldest are dropped beyond it)."""

LOST_STATE = "LOST"
"""The history's state for an attempt whose end was never recorded (see `record_lost_attempt`)."""


def meta_path(output_path: str, file: str) -> str:
    """`{output_path}/.schooner/{file}`."""
    return join(output_path, META_DIR, file)


def metrics_path(output_path: str) -> str:
    """`{output_path}/metrics.jsonl`."""
    return join(output_path, METRICS_FILE)


# ------------------------------------------------------------------------------------------- status


class StepState(enum.StrEnum):
    """What a status file says."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    """Stopped by Ctrl-C (or SIGTERM) of its runner; a rerun resumes or restarts it."""


@dataclass(frozen=True)
class StepStatus:
    """A parsed `.schooner/status.json`."""

    state: StepState
    key: str
    """The step key of the attempt that wrote it (a folder reused by another step is not taken for it)."""
    name: str
    owner: str
    """Lease owner id of the attempt that wrote it."""
    time: float
    """Unix time it was written."""
    error: str = ""
    """One line: the exception for FAILED."""
    fn_sha: str = ""
    """SHA-256 of the step function's source when it ran (a plan notes a change without a version bump)."""

    def to_json(self) -> str:
        """The status file's text (`ValueError` for a non-finite `time`: JSON has no such number)."""
        return dumps_json(
            {
                "status": self.state.value,
                "key": self.key,
                "name": self.name,
                "owner": self.owner,
                "time": self.time,
                "error": self.error,
                "fn_sha": self.fn_sha,
            },
            indent=None,
            sort_keys=False,
            where="status.json",
        )


def parse_status(text: str | None, where: str = "status.json") -> StepStatus | None:
    """A status file's text parsed; None for none, empty or unreadable text.

    Raises:
        ValueError: the text holds NaN or an infinity, which no writer here writes (`loads_json`); the
            message names the file (`where`), line and column, and the fix.
    """
    if not text:
        return None
    d = _loads_or_none(text, where)  # a non-standard number is refused, not read
    try:
        return StepStatus(
            StepState(d["status"]),
            d["key"],
            d.get("name", ""),
            d.get("owner", ""),
            float(d.get("time", 0.0)),
            d.get("error", ""),
            d.get("fn_sha") or "",
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def step_status(output_path: str, *, storage: Storage | None = None) -> StepStatus | None:
    """The status of the step in `output_path`, or None when there is none (never run by the step runner,
    or unreadable). `storage` (`storage_for(output_path)`) saves looking it up again in a loop."""
    st = storage_for(output_path) if storage is None else storage
    path = meta_path(output_path, "status.json")
    return parse_status(st.read_text(path), path)


def write_step_status(
    output_path: str,
    state: StepState,
    *,
    key: str,
    name: str,
    owner: str,
    error: str = "",
    fn_sha: str = "",
    storage: Storage | None = None,
) -> StepStatus:
    """Atomically replace the status file (the step runner's; nothing else writes it)."""
    info = StepStatus(state, key, name, owner, time.time(), error, fn_sha)
    st = storage_for(output_path) if storage is None else storage
    st.write_text(meta_path(output_path, "status.json"), info.to_json())
    return info


# ------------------------------------------------------------------------------- step record, history


def _read_json_or_none(storage: Storage, path: str) -> Any:
    """The JSON value of a record; None for none, or text that is not JSON (a write cut short on a store
    without atomic writes). A NaN or infinity token is refused (`ValueError` naming the file, line and the
    fix): no writer here writes one, and other readers (jq, JavaScript) refuse the file."""
    return _loads_or_none(storage.read_text(path), path)


def _loads_or_none(text: str | None, where: str) -> Any:
    if not text:
        return None
    try:
        return strict_loads(text)
    except NotStandardJSON:
        return loads_json(text, where)  # raises, naming where
    except ValueError:
        return None


def read_step_record(output_path: str, *, storage: Storage | None = None) -> dict[str, Any] | None:
    """The record of the step's latest attempt (`.schooner/step.json`), or None when there is none.

    Raises:
        ValueError: the record holds NaN or an infinity (not JSON, never written here); named with the fix.
    """
    st = storage_for(output_path) if storage is None else storage
    record = _read_json_or_none(st, meta_path(output_path, "step.json"))
    return record if isinstance(record, dict) else None


def write_step_record(output_path: str, record: dict[str, Any], *, storage: Storage | None = None) -> None:
    """Replace `.schooner/step.json` (keys sorted).

    Raises:
        ValueError: `record` holds NaN or an infinity (the runner stores a result's as null, a config's as
            `{"__float__": "nan"}`); the message names the file and the field (`$.result.loss`). Nothing is
            written.
    """
    st = storage_for(output_path) if storage is None else storage
    path = meta_path(output_path, "step.json")
    st.write_text(path, dumps_json(record, where=path))


def read_history(output_path: str, *, storage: Storage | None = None) -> list[dict[str, Any]]:
    """The attempts of a step, oldest first (`.schooner/history.jsonl`; unreadable lines skipped: the
    file is rewritten whole, so only a writer killed mid-write on a non-atomic store leaves one).

    Raises:
        ValueError: a line holding NaN or an infinity (not JSON, never written here), named `path:line`.
    """
    st = storage_for(output_path) if storage is None else storage
    path = meta_path(output_path, "history.jsonl")
    out = []
    for n, line in enumerate((st.read_text(path) or "").splitlines(), 1):
        entry = _loads_or_none(line, f"{path}:{n}")
        if isinstance(entry, dict):
            out.append(entry)
    return out


def append_history(output_path: str, record: dict[str, Any], *, storage: Storage | None = None) -> None:
    """Add the end of an attempt (its outcome, times, run, error traceback) to `.schooner/history.jsonl`.

    The status file and `step.json` describe the latest attempt; the history keeps every attempt (the last
    `HISTORY_KEEP`). Rewritten whole (object stores cannot append).
    """
    st = storage_for(output_path) if storage is None else storage
    path = meta_path(output_path, "history.jsonl")
    entry = {
        k: record.get(k) for k in ("run_id", "owner", "state", "started", "ended", "duration_s", "error")
    }
    entry["host"] = (record.get("env") or {}).get("host")
    if record.get("starts"):  # every start of the function: node, pid, how it ended (preemptions too)
        entry["starts"] = record["starts"]
    if record.get("failed_attempt_path"):  # where a failed attempt's files are kept (the newest few)
        entry["failed_attempt_path"] = record["failed_attempt_path"]
    lines = (st.read_text(path) or "").splitlines()
    lines = [*lines, dumps_json(entry, indent=None, where=path)][-HISTORY_KEEP:]
    st.write_text(path, "\n".join(lines) + "\n")


def record_lost_attempt(output_path: str, *, storage: Storage | None = None) -> dict[str, Any] | None:
    """If the step's record still says RUNNING, its attempt ended without a record: add that attempt to the
    history as `LOST` (its start, no end) and return the entry; None if there is nothing to add.

    Called by the attempt that takes the step over (its lease was free or stale), before it writes its own
    record: without it a killed attempt would leave no trace in the history, and its start (the run's real
    start) would be lost. An attempt already in the history (same run, owner and start: a taker killed
    right after adding it) is not added twice.
    """
    st = storage_for(output_path) if storage is None else storage
    previous = read_step_record(output_path, storage=st)
    if previous is None or previous.get("state") != "RUNNING":
        return None
    same = ("run_id", "owner", "started")
    if any(all(h.get(k) == previous.get(k) for k in same) for h in read_history(output_path, storage=st)):
        return None
    lost = {
        **previous,
        "state": LOST_STATE,
        "ended": None,
        "duration_s": None,
        "error": "no end was recorded: a later attempt found this one's record still RUNNING and its lease "
        "free or stale (its runner was killed, e.g. with SIGKILL, its machine was lost, or it stalled "
        "past the lease's time-out)",
    }
    append_history(output_path, lost, storage=st)
    return lost


# ------------------------------------------------------------------------------------- experiments


def experiment_record_path(prefix: str, name: str, key: str, started: float, run_id: str) -> str:
    """`{prefix}/experiments/{name}-{key[:12]}/{UTC start}-{run_id}.json`: one record per run, kept, so
    failed and interrupted runs stay on record beside later ones (sorted by name = by start time)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return f"{prefix.rstrip('/')}/experiments/{name}-{key[:12]}/{stamp}-{run_id}.json"


def write_experiment_record(path: str, record: dict[str, Any]) -> None:
    """Replace an experiment record (keys sorted; values JSON cannot hold are written as `str`).

    Raises:
        ValueError: `record` holds NaN or an infinity; the message names the file and the field. Nothing
            is written.
    """
    st = storage_for(path)
    st.makedirs(path.rsplit("/", 1)[0])
    st.write_text(path, dumps_json(record, default=str, where=path))


def read_experiment_records(prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """`(path, record)` of every experiment run recorded under `prefix`, newest start first (records that
    are not JSON skipped: a write cut short).

    Raises:
        ValueError: a record holding NaN or an infinity (not JSON, never written here); named with the fix.
    """
    st = storage_for(prefix)
    found = []
    for path in st.glob(f"{prefix.rstrip('/')}/experiments/**/*.json"):
        record = _read_json_or_none(st, path)
        if isinstance(record, dict):
            found.append((path, record))
    found.sort(key=lambda pr: pr[1].get("started") or 0, reverse=True)
    return found


# ------------------------------------------------------------------------------------------ metrics


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def metrics_line(row: Mapping[str, Any]) -> str:
    """One `metrics.jsonl` line (with its newline): NaN and infinities as `null`, keys in `row`'s order."""
    return json.dumps({k: _finite(v) for k, v in row.items()}, allow_nan=False) + "\n"


_DAMAGED_METRICS = "the run writes one JSON object per line: mend or delete that line, or rerun the step"


def read_metrics(output_path: str) -> list[dict[str, Any]]:
    """The rows of `{output_path}/metrics.jsonl`, in file order (none when there is no such file).

    A torn last line (no final newline: a step still running, or killed mid-write) is left out.

    Raises:
        ValueError: a complete line that is not JSON or not a JSON object (named in JSON's words, as
            `storage.read_json_lines` names a row); the message names the file, line and the fix, as for a
            complete line that is not UTF-8 (it was a bare UnicodeDecodeError).
    """
    path = metrics_path(output_path)
    try:
        data = read_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    whole, sep, torn_bytes = data.rpartition(b"\n")
    # decoded as any input file is (a bad byte named file:line with the fix); a torn last line may end inside
    # a character (a writer killed mid-write), which is no error: it is left out as torn
    lines = decode_utf8(whole, path).split("\n") if sep else []
    try:
        torn = torn_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data":
            decode_utf8(torn_bytes, path, line=len(lines) + 1, offset=len(whole) + len(sep))
        torn = ""
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = strict_loads(line)
        except NotStandardJSON:
            loads_json(line, f"{path}:{n}")  # raises: NaN, Infinity, 1e999 named with the fix
            raise
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{n} is not valid JSON ({e.msg} at column {e.colno}; the line starts {line[:80]!r}); "
                f"{_DAMAGED_METRICS}"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}:{n} is {json_kind(row)}, not a JSON object ({line[:80]!r}); a metrics row is one JSON "
                f"object; {_DAMAGED_METRICS}"
            )
        rows.append(row)
    if torn.strip():
        try:  # a complete last line written without its newline
            row = strict_loads(torn)
        except NotStandardJSON:
            loads_json(torn, f"{path}:{len(lines) + 1}")  # raises, as for any other line
            raise
        except ValueError:
            row = None  # torn
        if isinstance(row, dict):
            rows.append(row)
    return rows


def append_metrics(output_path: str, row: Mapping[str, Any]) -> None:
    """Add one row to `{output_path}/metrics.jsonl` (an append locally; on object stores, which cannot
    append, the file is rewritten: log many rows with `MetricsWriter`)."""
    path = metrics_path(output_path)
    line = metrics_line(row)
    if is_local(path):
        import os

        p = local_path(path)
        os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
        with open(p, "ab") as f:
            end = f.tell()
            if end:
                _drop_torn_tail(p, end)
            f.write(line.encode("utf-8"))
        return
    st = storage_for(path)
    text = st.read_text(path) or ""
    st.write_text(path, text[: text.rfind("\n") + 1] + line)


def _drop_torn_tail(path: str, end: int) -> None:
    """Cut a last line left without its newline (a writer killed mid-row) off the end of a local file."""
    with open(path, "r+b") as f:
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        pos, chunk = end, 4096
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            found = f.read(pos - start).rfind(b"\n")
            if found >= 0:
                f.truncate(start + found + 1)
                return
            pos = start
        f.truncate(0)


class MetricsWriter:
    """Writes `{output_path}/metrics.jsonl`, one row at a time.

    `resume_step=None` starts a new file (an old one is removed); `resume_step=S` keeps the rows of steps up
    to S and drops later ones (logged by an interrupted run after its last checkpoint), so the file reads as
    one uninterrupted run. Locally every row is appended and flushed at once; on an object store, which
    cannot append, the whole file is uploaded again at `flush()`, at most every `upload_every_s` seconds
    otherwise, and at `close()`.

    Example:
        >>> from schooner.cluster.records import MetricsWriter, read_metrics
        >>> with MetricsWriter("memory://metrics-demo") as w:
        ...     w.append({"step": 0, "loss": 3.0})
        >>> read_metrics("memory://metrics-demo")
        [{'step': 0, 'loss': 3.0}]
    """

    upload_every_s: float = 30.0

    def __init__(self, output_path: str, *, resume_step: int | None = None) -> None:
        self.path = metrics_path(output_path)
        self._local = is_local(self.path)
        kept: list[dict[str, Any]] = []
        if resume_step is not None:
            kept = [r for r in read_metrics(output_path) if _step_of(r) <= resume_step]
        self._lines = [metrics_line(r) for r in kept]
        self._uploaded = time.monotonic()
        if self._local:
            import os

            p = local_path(self.path)
            os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.writelines(self._lines)
            self._f = open(p, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        else:
            self._fs, self._p = url_to_fs(self.path)
            self.flush()

    def append(self, row: Mapping[str, Any]) -> None:
        """Add one row (NaN and infinities become `null`)."""
        line = metrics_line(row)
        if self._local:
            self._f.write(line)
            self._f.flush()
            return
        self._lines.append(line)
        if time.monotonic() - self._uploaded >= self.upload_every_s:
            self.flush()

    def flush(self) -> None:
        """Make every row appended so far durable (an object store: upload the file again)."""
        if self._local:
            self._f.flush()
        else:
            self._fs.pipe_file(self._p, "".join(self._lines).encode("utf-8"))
            self._uploaded = time.monotonic()

    def close(self) -> None:
        if self._local:
            self._f.close()
        else:
            self.flush()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _step_of(row: dict[str, Any]) -> float:
    step = row.get("step", 0)
    return step if isinstance(step, int | float) and not isinstance(step, bool) else 0


# ------------------------------------------------------------------------------------- environment

RECORDED_PACKAGES = (
    "schooner",
    "schooner-cluster",
    "schooner-data",
    "schooner-tokenize",
    "schooner-model",
    "schooner-train",
    "schooner-eval",
    "jax",
    "jaxlib",
    "haliax",
    "equinox",
    "optax",
    "numpy",
    "tensorstore",
    "tokenizers",
    "ray",
    "fsspec",
)
"""The distributions whose versions every step record holds (`env.packages`)."""


@functools.cache
def installed_versions() -> dict[str, str]:
    """The installed versions of the Schooner packages and the main libraries they use (jax, numpy,
    tensorstore, ray, ...): what a step record holds as `env.packages`. Names not installed are left out.

    Example:
        >>> from schooner.cluster import records
        >>> "schooner-cluster" in records.installed_versions()
        True
    """
    from importlib import metadata

    out = {}
    for name in RECORDED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out
