"""The `schooner` command: run an experiment file, list step outputs, explain why a step (re)runs.

    schooner run EXPERIMENT.py [--dry-run] [--force RE] [--only RE] [--prefix P] [--cluster SPEC] [--quiet]
    schooner status [--prefix P] [--name RE]
    schooner explain STEP [EXPERIMENT.py] [--prefix P]
    schooner report [RUN ...] [--prefix P] [--out FILE]
    schooner cluster up --local-nodes N | status | kill-node NAME | down
    schooner compare A [B ...] [--prefix P] [--plot OUT.png] [--metric RE] [--html OUT.html]
    schooner browse PATH [--out FILE] [--sample N]     (from schooner-data: subcommands of other packages
                                                      are found through the `schooner.commands` entry points)

Exit status: 0 when every step is done, 1 when a step failed, 2 for a bad experiment file (its own code
raised: its traceback from the file's first frame), bad arguments or a prefix that does not exist, 130 when
interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from schooner.cluster.runner._progress import make_console
from schooner.cluster.runner._version import ConfigError
from schooner.cluster.storage import NotStandardJSON

from ._entry import ExperimentRaised
from ._flags import add_run_flags


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `schooner` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="schooner", description="Run and inspect Schooner experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment file (its steps that are not done yet)")
    p_run.add_argument("experiment", help="the experiment's Python file")
    add_run_flags(p_run)
    p_run.epilog = "Arguments after '--' are passed to the experiment script as its sys.argv[1:]."
    p_status = sub.add_parser("status", help="a table of the step outputs under a prefix")
    p_status.add_argument("--prefix", default=None)
    p_status.add_argument(
        "--name",
        default=None,
        metavar="RE",
        help="only steps whose name matches RE (a step's exact name: that step alone)",
    )
    p_status.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p_explain = sub.add_parser("explain", help="why a step would rerun or be reused")
    p_explain.add_argument("step", help="the step's name (or a regex matching names)")
    p_explain.add_argument(
        "experiment",
        nargs="?",
        default=None,
        help="the experiment file defining the step today (without it: compare the two "
        "latest recorded versions)",
    )
    p_explain.add_argument("--prefix", default=None)
    p_report = sub.add_parser(
        "report", help="write a static HTML page of every experiment and step under a prefix"
    )
    p_report.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="steps to overlay at the top, with a sortable table of their hyperparameters and results "
        "(output folders, NAME@KEY-PREFIX, or step names: their latest version)",
    )
    p_report.add_argument("--prefix", default=None)
    p_report.add_argument(
        "--out", default=None, metavar="FILE", help="where to write it (default PREFIX/report.html)"
    )
    p_compare = sub.add_parser(
        "compare", help="versions of steps side by side: config differences, results, metrics"
    )
    p_compare.add_argument(
        "steps",
        nargs="+",
        metavar="STEP",
        help="output folders, NAME@KEY-PREFIX, or step names (latest version; a name alone: its two latest)",
    )
    p_compare.add_argument("--prefix", default=None)
    p_compare.add_argument("--plot", default=None, metavar="OUT.png", help="also write the metrics overlaid")
    p_compare.add_argument("--metric", default=None, metavar="RE", help="plot only the metrics matching RE")
    p_compare.add_argument(
        "--html",
        default=None,
        metavar="OUT.html",
        help="also write a page with every metric overlaid and a sortable table of the runs",
    )
    from ._cluster_cmd import add_cluster_parser
    from ._plugins import add_plugin_parsers

    add_cluster_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = add_plugin_parsers(sub, argv[0] if argv else None)
    script_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, script_args = argv[:i], argv[i + 1 :]
    ns = parser.parse_args(argv)
    ns.script_args = script_args
    try:
        if ns.command == "run":
            from ._run import cmd_run

            code = cmd_run(ns)
            from ._entry import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_now

            if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
                # Ctrl-C, SIGTERM: do not wait for in-process steps (they are recorded INTERRUPTED)
                exit_now(code)
            return code
        if ns.command == "status":
            return _cmd_status(ns)
        if ns.command == "report":
            return _cmd_report(ns)
        if ns.command == "compare":
            from schooner.cluster.runner._runner import resolve_prefix
            from schooner.cluster.views import compare

            compare(resolve_prefix(ns.prefix), ns.steps, ns.plot, ns.metric, html=ns.html)
            return 0
        if ns.command in plugins:
            return plugins[ns.command].run(ns)
        if ns.command == "cluster":
            from ._cluster_cmd import cmd_cluster

            return cmd_cluster(ns, make_console())
        return _cmd_explain(ns)
    except (ConfigError, NotStandardJSON) as e:  # a record holding NaN: its file and the fix, no traceback
        make_console().print(f"[bold red]error:[/] {_esc(str(e))}")
        return 2
    except ExperimentRaised as e:  # from any command that loads the file (`run`, `explain`)
        print(e.traceback, end="", file=sys.stderr)
        return 2


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _cmd_status(ns: argparse.Namespace) -> int:
    from schooner.cluster.runner._runner import resolve_prefix
    from schooner.cluster.views import print_status, status_rows

    prefix = resolve_prefix(ns.prefix)
    _require_prefix(prefix, ns.prefix)
    rows = status_rows(prefix, ns.name)
    if ns.json:
        print(json.dumps(rows, indent=1))
    else:
        print_status(rows, prefix, make_console())
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from schooner.cluster.runner._runner import resolve_prefix
    from schooner.cluster.views import write_report

    prefix = resolve_prefix(ns.prefix)
    _require_prefix(prefix, ns.prefix)
    out = write_report(prefix, ns.out, runs=ns.runs or None)
    print(f"report written to {out}")
    return 0


def _require_prefix(prefix: str, given: str | None) -> None:
    """A prefix that does not exist is a typo or the wrong working directory: say which, create nothing."""
    from schooner.cluster.runner._runner import PREFIX_ENV
    from schooner.cluster.storage import storage_for

    if storage_for(prefix).exists(prefix):
        return
    source = (
        f"--prefix {given!r}"
        if given
        else (f"${PREFIX_ENV}" if os.environ.get(PREFIX_ENV) else "the default ./schooner-output")
    )
    raise ConfigError(
        f"prefix {prefix} (from {source}, working directory {os.getcwd()}) does not exist: no experiment has "
        "run there; pass the prefix the experiment used"
    )


def _cmd_explain(ns: argparse.Namespace) -> int:
    from schooner.cluster.runner._runner import resolve_prefix
    from schooner.cluster.views import explain_planned, explain_recorded

    from ._run import capture_steps

    prefix = resolve_prefix(ns.prefix)
    console = make_console()
    if ns.experiment is None and ns.step.endswith(".py") and os.path.isfile(ns.step):
        console.print(
            _esc(
                f"schooner explain: {ns.step!r} is an experiment file, and the first argument is the step: give "
                f"the step's name (or a regex; '.' for every step) first and the file second, e.g. "
                f"`schooner explain . {ns.step}`"
            )
        )
        return 2
    if ns.experiment is None:
        try:
            found = explain_recorded(prefix, ns.step)
        except LookupError as e:
            console.print(_esc(str(e.args[0])))
            return 1
    else:
        found = explain_planned(capture_steps(ns.experiment, prefix), prefix, ns.step, ns.experiment)
    for explained in found:
        console.print(_esc("\n".join(explained.lines())))
    return 0


_MOVED = {"module_handles": "schooner.cluster.cli._run", "capture_steps": "schooner.cluster.cli._run"}


def __getattr__(name: str) -> Any:
    """`module_handles` and `capture_steps` moved to `cli/_run.py` (0.2.0); the old names work for one
    release with a DeprecationWarning."""
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(
            f"schooner.cluster.cli.{name} moved; it is internal to the `schooner run`/`explain` commands now "
            "and will be removed from schooner.cluster.cli in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
