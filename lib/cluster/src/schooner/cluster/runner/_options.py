"""Process-wide run options: how `schooner run EXP.py --dry-run` reaches the `StepRunner()` inside EXP.py.

The command line sets `RunOptions` for the duration of the experiment file; every `StepRunner.run` in it
applies them on top of its own arguments (command-line flags win: they are the later, explicit intent).
The two explicit entry points that read flags are `schooner run EXP.py ...` and `StepRunner().main([...])`
(for `python EXP.py ...`). `StepRunner.run` never parses `sys.argv`; when it finds flags there that no
entry point applied, it refuses to run rather than ignore them (`SCHOONER_NO_ARGV=1` turns that check off
for scripts that parse flags of these names themselves).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ._lower import Step


@dataclass
class RunOptions:
    """Options given on the command line for the runs of one experiment file."""

    prefix: str | None = None
    dry_run: bool = False
    force: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    max_concurrent: int | None = None
    cluster: str | None = None
    quiet: bool = False
    """No plan, progress or job output (errors and the interrupt line are still printed)."""
    shared_prefix: bool = False
    """A local-looking prefix is on storage every node sees (see `StepRunner(shared_prefix=...)`)."""
    capture: list[list[Step]] | None = field(default=None, repr=False)
    """When set (by `schooner explain`), `run()` records its lowered steps here and stops the script."""
    runs: int = 0
    """How many `StepRunner.run` calls used these options (0: the script never called it)."""


class CapturedRun(BaseException):
    """Raised by `run()` in capture mode to stop the experiment script after its graph is known."""


class DryRunStop(BaseException):
    """Raised by `run()` after printing the plan of `schooner run --dry-run`: the script stops there."""


_current: RunOptions | None = None


def current_options() -> RunOptions | None:
    return _current


@contextlib.contextmanager
def applying(options: RunOptions) -> Iterator[RunOptions]:
    """Make `options` the process-wide run options inside the block."""
    global _current
    previous, _current = _current, options
    try:
        yield options
    finally:
        _current = previous


RUN_FLAGS = (
    "--dry-run",
    "--force",
    "--only",
    "--prefix",
    "--max-concurrent",
    "--cluster",
    "--quiet",
    "--shared-prefix",
)
"""The flags of `schooner run` and `StepRunner.main` (the command line defines them: `cli/_flags.py`)."""


def run_flags_in(argv: Sequence[str]) -> list[str]:
    """The run flags among a script's arguments (`--force=x` counts as `--force`), in order; none when
    `SCHOONER_NO_ARGV` is set (a script that parses flags of these names itself)."""
    if os.environ.get("SCHOONER_NO_ARGV"):
        return []
    return [a for a in argv if a.split("=", 1)[0] in RUN_FLAGS]
