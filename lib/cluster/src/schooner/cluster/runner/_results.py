"""What a run returns: one `StepOutcome` per step, gathered in a `RunResult`; `StepFailedError`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster.records import read_step_record

from ._lower import Step
from ._step import InputPath, StepHandle

STATES = ("cached", "succeeded", "failed", "interrupted", "skipped", "will_run")
"""`cached`: done before (or by a concurrent runner); `succeeded`: ran now; `failed`: raised (or its
lease was lost); `interrupted`: stopped by Ctrl-C; `skipped`: not run because an input failed;
`will_run`: dry run only."""

_UNSET: Any = object()


@dataclass
class StepOutcome:
    """How one step ended in a run."""

    name: str
    key: str
    output_path: str
    state: str
    duration_s: float | None = None
    error: str | None = None
    """The scrubbed traceback (failed) or the reason (skipped)."""
    error_type: str | None = None
    note: str = ""
    """Extra context, e.g. 'finished by run 1a2b3c' when a concurrent runner did the work."""
    _result: Any = field(default=_UNSET, repr=False)

    @property
    def ok(self) -> bool:
        return self.state in ("cached", "succeeded", "will_run")

    @property
    def result(self) -> Any:
        """The step's return value (as recorded, JSON-able); read from its record for cached steps."""
        if self._result is _UNSET:
            record = read_step_record(self.output_path) or {}
            self._result = record.get("result")
        return self._result

    def error_line(self) -> str:
        """Why the step failed or was not run: for a failure, the exception with its whole message (a
        message of several lines keeps them all, up to `REASON_LINES`: the line naming a differing field is
        often not the last); for a skip, the reason's first line."""
        if not self.error:
            return ""
        if self.state == "failed":
            return exception_reason(self.error)
        lines = [ln for ln in self.error.strip().splitlines() if ln.strip()]
        return lines[0].strip() if lines else ""


REASON_LINES = 8
"""Lines of an exception's message shown as a failure's reason at most (the rest are counted)."""


def exception_reason(text: str) -> str:
    """The exception at the end of a traceback `text`, with every line of its message (`Type: line 1`,
    then the message's further lines, up to `REASON_LINES`); a text without frames (already a reason) whole,
    up to `REASON_LINES`.

    In a traceback the frames are indented (`  File ...` and their source lines) and the exception starts at
    the first line after the last frame that is not: so a message whose own lines are indented is kept whole.
    Chained exceptions give the last one (the one raised).
    """
    lines = [ln.rstrip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
    start = 0
    if frames:
        after = range(frames[-1] + 1, len(lines))
        start = next((i for i in after if not lines[i].startswith(" ")), len(lines) - 1)
    message = lines[start:]
    if len(message) > REASON_LINES:
        message = [*message[: REASON_LINES - 1], f"… ({len(message) - REASON_LINES + 1} more lines)"]
    return "\n".join([message[0].strip(), *message[1:]])


@dataclass
class RunResult:
    """The outcome of `StepRunner.run`: `ok`, and per step `result[handle]` -> `StepOutcome`."""

    run_id: str
    prefix: str
    steps: list[StepOutcome]
    dry_run: bool = False
    duration_s: float = 0.0
    experiment_record: str | None = None

    @property
    def ok(self) -> bool:
        """True when no step failed or was left out because an input failed."""
        return all(o.ok for o in self.steps)

    def _with(self, state: str) -> list[StepOutcome]:
        return [o for o in self.steps if o.state == state]

    failed = property(lambda self: self._with("failed"))
    skipped = property(lambda self: self._with("skipped"))
    succeeded = property(lambda self: self._with("succeeded"))
    cached = property(lambda self: self._with("cached"))

    def __getitem__(self, which: StepHandle | Step | InputPath | str) -> StepOutcome:
        """The outcome of a step, by handle, lowered step, key or (unique) name."""
        if isinstance(which, InputPath):
            which = which.step
        if isinstance(which, StepHandle | Step):
            key = which.key
            for o in self.steps:
                if o.key == key:
                    return o
            raise KeyError(f"step {which.name!r} (key {key[:8]}) was not part of this run")
        matches = [o for o in self.steps if which in (o.key, o.name)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} steps named or keyed {which!r} in this run; pass the handle")
        return matches[0]

    def counts_line(self) -> str:
        c = Counter(o.state for o in self.steps)
        parts = [f"{c[s]} {s.replace('_', ' ')}" for s in STATES if c[s]]
        return ", ".join(parts) or "no steps"


class StepFailedError(RuntimeError):
    """Raised by `StepRunner.run` when a step failed; `.result` is the full `RunResult`."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        lines = [
            f"{len(result.failed)} step(s) failed, {len(result.skipped)} not run because of them "
            f"(run {result.run_id}):"
        ]
        lines += [
            f"  {o.name}: {o.error_line().replace(chr(10), chr(10) + '    ')}  [{o.output_path}]"
            for o in result.failed
        ]
        super().__init__("\n".join(lines))


class RunInterrupted(KeyboardInterrupt):
    """Raised by `StepRunner.run` on Ctrl-C (or SIGTERM: `.signal`), after the running steps were recorded INTERRUPTED and their
    jobs (with every process they started) were stopped. `str(err)` is one line: what was interrupted and
    how a rerun continues."""

    def __init__(self, message: str, result: RunResult | None = None, *, signal: str = "SIGINT") -> None:
        super().__init__(message)
        self.message = message
        self.result = result
        self.signal = signal
        """'SIGINT' (Ctrl-C) or 'SIGTERM'."""

    def __str__(self) -> str:
        return self.message


class ResultWarning(UserWarning):
    """A step's return value could not be recorded as it is: a NaN or infinity (stored as null, which is
    what JSON has) or a value too large for its record (stored as a note)."""
