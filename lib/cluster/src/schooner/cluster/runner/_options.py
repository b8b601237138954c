"""Process-wide run options: how `schooner run EXP.py --dry-run` reaches the `StepRunner()` inside EXP.py.

The command line sets `RunOptions` for the duration of the experiment file; every `StepRunner.run` in it
applies them on top of its own arguments (command-line flags win: they are the later, explicit intent).
The two explicit entry points that read flags are `schooner run EXP.py ...` and `StepRunner().main([...])`
(for `python EXP.py ...`). `StepRunner.run` never parses `sys.argv`; when it finds flags there that no
entry point applied, it refuses to run rather than ignore them (`SCHOONER_NO_ARGV=1` turns that check off
for scripts that parse flags of these names themselves).
"""

from __future__ import annotations

import argparse
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
"""The flags `add_run_flags` defines."""


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `schooner run` and `python exp.py`."""
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (what runs, what is cached); write nothing"
    )
    parser.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="RE",
        help="rerun steps whose name matches RE even if done (repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="RE",
        help="run only steps whose name matches RE, and the steps they need (repeatable)",
    )
    parser.add_argument(
        "--prefix",
        default=None,
        help="where outputs go (default: $SCHOONER_PREFIX, else "
        "./schooner-output); a local path or an fsspec URL",
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=None, metavar="N", help="run at most N steps at once"
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="SPEC",
        help="'local', 'ray' or a Ray address (sets SCHOONER_CLUSTER for this run); Ray is started or "
        "connected only when a step will run on it",
    )
    parser.add_argument(
        "--shared-prefix",
        action="store_true",
        help="the (local-looking) prefix is shared by every node of the cluster, e.g. an NFS mount",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print no plan, progress or job output (by default every step's output is streamed)",
    )


def options_from_args(ns: argparse.Namespace) -> RunOptions:
    if ns.max_concurrent is not None and ns.max_concurrent < 1:
        raise SystemExit(f"--max-concurrent must be >= 1, got {ns.max_concurrent}")
    return RunOptions(
        prefix=ns.prefix,
        dry_run=ns.dry_run,
        force=tuple(ns.force),
        only=tuple(ns.only),
        max_concurrent=ns.max_concurrent,
        cluster=ns.cluster,
        quiet=ns.quiet,
        shared_prefix=ns.shared_prefix,
    )


def options_from_argv(argv: Sequence[str]) -> RunOptions | None:
    """Our flags from a script's argv (unknown flags are left to the script); None when there are none."""
    if os.environ.get("SCHOONER_NO_ARGV"):
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # `--pre` is not `--prefix`
    add_run_flags(parser)
    ns, _ = parser.parse_known_args(list(argv))
    opts = options_from_args(ns)
    return opts if opts != RunOptions() else None
