"""What `schooner run EXP.py` and `StepRunner().main([...])` share: a client for the run, the flags applied
while the experiment runs, and one exit status per outcome.

Exit status: 0 done (or a dry run's plan), 1 a step failed, 2 a bad experiment or bad arguments (the
message names the step, the field and the file:line), 130 interrupted (one line: what stopped and how a
rerun continues).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schooner.cluster._client import Client, ResourcesUnavailableError
from schooner.cluster._current import CLUSTER_ENV, client_from_spec, using_client
from schooner.cluster.runner._options import DryRunStop, RunOptions, applying
from schooner.cluster.runner._progress import make_console
from schooner.cluster.runner._results import RunInterrupted, StepFailedError
from schooner.cluster.runner._version import ConfigError
from schooner.cluster.storage import NotStandardJSON

from ._flags import add_run_flags, options_from_args

if TYPE_CHECKING:
    from schooner.cluster.runner._results import RunResult

EXIT_OK, EXIT_FAILED, EXIT_BAD, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
RUNNER_OUTCOMES = (
    StepFailedError,
    DryRunStop,
    RunInterrupted,
    ConfigError,
    ResourcesUnavailableError,
    NotStandardJSON,
)
"""What `execute` reports itself: raised from an experiment file, they are outcomes, not its own errors."""


def client_for(options: RunOptions) -> Client:
    """The run's client: `--cluster`, else $SCHOONER_CLUSTER, else local. It streams every job's output
    unless `--quiet`; a Ray client connects (or starts Ray) only when a step is submitted to it."""
    spec = options.cluster or os.environ.get(CLUSTER_ENV) or "local"
    return client_from_spec(spec, quiet=options.quiet)


def execute(
    options: RunOptions, body: Callable[[], Any], *, experiment: str | None = None
) -> tuple[int, Any]:
    """Run `body` (which runs the experiment) with `options` applied and the run's client current.

    Returns (exit status, what `body` returned). The client is shut down before returning.
    """
    console = make_console()
    try:
        client = client_for(options)
    except ValueError as e:
        console.print(f"[bold red]error:[/] --cluster: {_esc(str(e))}")
        return EXIT_BAD, None
    if options.cluster:
        os.environ[CLUSTER_ENV] = options.cluster
    try:
        with using_client(client), applying(options):
            return EXIT_OK, body()
    except StepFailedError:
        return EXIT_FAILED, None  # the summary table has been printed
    except DryRunStop:
        return EXIT_OK, None
    except RunInterrupted as e:
        console.print(f"[yellow]{_esc(e.message)}[/]")
        return (EXIT_TERMINATED if e.signal == "SIGTERM" else EXIT_INTERRUPTED), None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted before any step ran[/]")
        return EXIT_INTERRUPTED, None
    except (ConfigError, ResourcesUnavailableError, NotStandardJSON) as e:  # NaN in a record: file and fix
        console.print(f"[bold red]error:[/] {_esc(str(e))}{_experiment_line(e, experiment)}")
        return EXIT_BAD, None
    finally:
        client.shutdown()


def experiment_traceback(path: str, error: BaseException) -> str:
    """`error`'s traceback from the experiment file's first frame on, as `python path` prints it: the CLI's and
    runpy's frames before it tell the user nothing (all of it when no frame is the file's)."""
    import traceback

    tb, target = error.__traceback__, os.path.abspath(path)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb or error.__traceback__))


class ExperimentRaised(Exception):
    """An experiment file's own code raised `error` (not one of `RUNNER_OUTCOMES`) while a command loaded it.
    The `schooner` command prints `traceback` (from the file's first frame) and exits with status 2."""

    def __init__(self, path: str, error: Exception) -> None:
        super().__init__(f"{path} raised {type(error).__name__}: {error}")
        self.traceback = experiment_traceback(path, error)


def run_main(run: Callable[[], RunResult], argv: list[str]) -> RunResult:
    """`StepRunner.main`: parse `argv` strictly, call `run` (the runner's `run` of the steps) with the flags
    applied, and exit the process unless everything is done."""
    parser = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0]) or "experiment", description="Run this experiment's steps."
    )
    add_run_flags(parser)
    options = options_from_args(parser.parse_args(argv))  # an unknown flag: usage and exit status 2
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    code, result = execute(options, run, experiment=script)
    if code == EXIT_OK and result is not None:
        return result
    exit_now(code)
    raise AssertionError("unreachable")


def exit_now(code: int) -> None:
    """Exit with `code`. On Ctrl-C, without waiting for in-process steps' threads (their steps are recorded
    INTERRUPTED already, and a rerun continues them); otherwise a normal exit."""
    if code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        raise SystemExit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _experiment_line(err: BaseException, experiment: str | None) -> str:
    """' (at exp.py:12)': the innermost line of the experiment file in the error's traceback."""
    if not experiment:
        return ""
    target = os.path.abspath(experiment)
    found = ""
    tb = err.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == target:
            found = f" (at {os.path.basename(experiment)}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
