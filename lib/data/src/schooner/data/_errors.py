"""Bad input: one error type that names the file and the line (or row group), and the skip log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

OnError = Literal["raise", "skip"]
"""What a reader does with a bad record: `"raise"` (default) stops with a `DataError`; `"skip"` counts it."""

_logger = logging.getLogger("schooner.data")

DEFAULT_KIND = "bad_input"
"""The reason a `DataError` is listed under when it names none."""

_SKIP_HINT = "pass on_error='skip' to skip bad records (they are counted in the manifest)"


class DataError(ValueError):
    """Bad input data. The message names the file, the line or row group, the reason and the fix.

    Attributes:
        path: The file that holds the bad data.
        line: The 1-based line number (text formats), or None.
        row_group: The parquet row group, or None.
        reason: What is wrong, without the location.
        kind: A short name for the reason (`"empty_body"`, `"damaged_stream"`): skips are listed by it.
    """

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        line: int | None = None,
        row_group: int | None = None,
        row: int | None = None,
        fix: str | None = None,
        kind: str | None = None,
    ) -> None:
        self.path = path
        self.kind = kind or DEFAULT_KIND
        self.line = line
        self.row_group = row_group
        self.row = row
        self.reason = reason
        self.fix = fix
        super().__init__(f"{self.location}: {reason}" + (f"; {fix}" if fix else ""))

    @property
    def skipped_message(self) -> str:
        """The message without its fix: what a skip records (the fix, e.g. "pass on_error='skip'", is moot)."""
        return f"{self.location}: {self.reason}"

    @property
    def location(self) -> str:
        """`file, line N` / `file, row group G, row R` / `file`."""
        parts = [self.path]
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.row_group is not None:
            parts.append(f"row group {self.row_group}")
        if self.row is not None:
            parts.append(f"row {self.row}")
        return ", ".join(parts)

    def __reduce__(
        self,
    ) -> tuple[
        Callable[..., DataError], tuple[object, ...]
    ]:  # keep the fields when the error crosses a process boundary
        return (
            _rebuild,
            (self.path, self.reason, self.line, self.row_group, self.row, self.fix, self.kind),
        )


def _rebuild(
    path: str,
    reason: str,
    line: int | None,
    row_group: int | None,
    row: int | None,
    fix: str | None,
    kind: str | None = None,
) -> DataError:
    return DataError(path, reason, line=line, row_group=row_group, row=row, fix=fix, kind=kind)


def record_error(
    path: str,
    reason: str,
    *,
    line: int | None = None,
    row_group: int | None = None,
    row: int | None = None,
    kind: str | None = None,
) -> DataError:
    """A bad *record* (skippable): the message ends with the `on_error='skip'` hint."""
    return DataError(path, reason, line=line, row_group=row_group, row=row, fix=_SKIP_HINT, kind=kind)


MAX_EXAMPLES = 5
"""How many skipped-record examples a `SkipLog` keeps in `examples` (`reasons` lists every one)."""


@dataclass
class SkipLog:
    """Counts skipped bad input, for the manifest and step record: the first few messages (`examples`, what a
    log line shows) and every message by its reason (`reasons`: `{kind: [message, ...]}`, in reading order
    within a task, tasks in order)."""

    skipped: int = 0
    examples: list[str] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def add(self, err: DataError) -> None:
        self.skipped += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(err.skipped_message)
        self.reasons.setdefault(err.kind, []).append(err.skipped_message)

    def merge(self, other: SkipLog | dict) -> None:
        if isinstance(other, dict):
            other = SkipLog(
                int(other.get("skipped", 0)),
                list(other.get("examples", [])),
                {k: list(v) for k, v in other.get("reasons", {}).items()},
            )
        self.skipped += other.skipped
        room = MAX_EXAMPLES - len(self.examples)
        if room > 0:
            self.examples.extend(other.examples[:room])
        for kind, messages in other.reasons.items():
            self.reasons.setdefault(kind, []).extend(messages)

    def counts(self) -> dict[str, int]:
        """How many skips of each reason."""
        return {k: len(v) for k, v in sorted(self.reasons.items())}

    def to_dict(self) -> dict:
        return {
            "skipped": self.skipped,
            "examples": list(self.examples),
            "reasons": {k: list(v) for k, v in sorted(self.reasons.items())},
        }


def check_on_error(on_error: str) -> OnError:
    """`on_error`, checked to be one of the `OnError` choices."""
    if on_error == "raise":
        return "raise"
    if on_error == "skip":
        return "skip"
    raise ValueError(f"on_error must be 'raise' or 'skip', got on_error={on_error!r}")


def handle(err: DataError, on_error: str, skips: SkipLog | None) -> None:
    """Raise `err`, or count it in `skips` (the process-wide log when None) and log the first few."""
    if on_error != "skip":
        raise err
    log = skips if skips is not None else _default_skips
    if log.skipped < MAX_EXAMPLES:
        _logger.warning("skipping bad input: %s", err.skipped_message)
    log.add(err)


_default_skips = SkipLog()
"""Where skips go when a caller skips without passing a log (e.g. plain `read_records` loops)."""


def default_skip_log() -> SkipLog:
    """The process-wide log of skips made by readers called without their own `skips=` log."""
    return _default_skips
