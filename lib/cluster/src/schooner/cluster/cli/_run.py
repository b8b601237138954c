"""Running an experiment file: `schooner run EXP.py` (its `StepRunner` calls, else every step it declares)
and, for `schooner explain`, the steps it would run, captured without running anything."""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from schooner.cluster.runner._lower import Step, lower
from schooner.cluster.runner._options import CapturedRun, RunOptions, applying
from schooner.cluster.runner._progress import make_console
from schooner.cluster.runner._step import StepHandle

from ._entry import EXIT_BAD, RUNNER_OUTCOMES, ExperimentRaised, execute
from ._flags import options_from_args


@contextlib.contextmanager
def _script_context(path: str, args: Sequence[str]) -> Iterator[None]:
    """sys.argv / sys.path as when running `python path args...`, restored afterwards."""
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = old_argv, old_path


def _load(path: str, options: RunOptions, args: Sequence[str] = ()) -> dict[str, Any]:
    """Run the experiment file as `__main__` under `options`; its globals. Every command that loads an
    experiment file loads it here: an exception of the file's own code is `ExperimentRaised` (shown from
    the file's first frame, exit status 2)."""
    if not os.path.isfile(path):
        raise SystemExit(f"schooner: experiment file {path!r} does not exist")
    with _script_context(path, args), applying(options):
        try:
            return runpy.run_path(path, run_name="__main__")
        except RUNNER_OUTCOMES:
            raise
        except Exception as e:  # the experiment's own code raised: its frames, not the CLI's
            raise ExperimentRaised(path, e) from e


def module_handles(globs: dict[str, Any]) -> list[StepHandle]:
    """The step handles bound to module-level names (also inside lists/dicts/tuples), in definition order."""
    found: dict[str, StepHandle] = {}

    def add(v: Any, depth: int = 0) -> None:
        if isinstance(v, StepHandle):
            found.setdefault(v.key, v)
        elif isinstance(v, Step):
            found.setdefault(v.key, v.handle)
        elif depth < 2 and isinstance(v, list | tuple):
            for x in v:
                add(x, depth + 1)
        elif depth < 2 and isinstance(v, dict):
            for x in v.values():
                add(x, depth + 1)

    for name, v in globs.items():
        if not name.startswith("_"):
            add(v)
    return list(found.values())


def cmd_run(ns: argparse.Namespace) -> int:
    """`schooner run EXP.py`: run the file under its flags; the exit status."""
    from schooner.cluster.runner._runner import StepRunner

    opts = options_from_args(ns)

    def body() -> int:
        globs = _load(ns.experiment, opts, ns.script_args)
        if opts.runs:
            return 0
        handles = module_handles(globs)  # the file only declares steps: run all of them
        if not handles:
            make_console().print(
                f"[bold red]error:[/] {ns.experiment} declares no steps and runs none; define step handles "
                "at module level or end it with StepRunner().main([...]) under `if __name__ == '__main__':`"
            )
            return EXIT_BAD
        from schooner.cluster.runner._records import running_script

        with running_script(ns.experiment):  # recorded as this experiment (its name, file and git state)
            StepRunner().run(handles)
        return 0

    code, value = execute(opts, body, experiment=ns.experiment)
    return code or (value or 0)


def capture_steps(path: str, prefix: str | None = None) -> list[Step]:
    """The lowered steps an experiment file would run (its `StepRunner.run` calls, else its module-level
    handles), without running anything."""
    opts = RunOptions(prefix=prefix, capture=[])
    t0 = time.time()
    try:
        globs = _load(path, opts)
    except CapturedRun:
        globs = {}
    if opts.capture:
        return [s for batch in opts.capture for s in batch]
    steps = lower(module_handles(globs))
    if not steps:
        raise SystemExit(f"schooner: {path} declares no steps (loaded in {time.time() - t0:.1f}s)")
    return steps
