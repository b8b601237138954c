"""The `schooner` command: run an experiment file, list step outputs, explain why a step (re)runs.

    schooner run EXPERIMENT.py [--dry-run] [--force RE] [--only RE] [--prefix P] [--cluster SPEC] [--quiet]
    schooner status [--prefix P] [--name RE]
    schooner explain STEP [EXPERIMENT.py] [--prefix P]
    schooner report [--prefix P] [--out FILE]
    schooner cluster up --local-nodes N | status | kill-node NAME | down
    schooner compare A [B ...] [--prefix P] [--plot OUT.png] [--metric RE]
    schooner browse PATH [--out FILE] [--sample N]     (from schooner-data: subcommands of other packages
                                                      are found through the `schooner.commands` entry points)

Exit status: 0 when every step is done, 1 when a step failed (or the experiment raised), 2 for a bad
experiment file, bad arguments or a prefix that does not exist, 130 when interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import runpy
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from schooner.cluster.runner._lower import Step, lower
from schooner.cluster.runner._options import (
    CapturedRun,
    RunOptions,
    add_run_flags,
    applying,
    options_from_args,
)
from schooner.cluster.runner._progress import fmt_age, fmt_duration, make_console
from schooner.cluster.runner._step import StepHandle
from schooner.cluster.runner._version import ConfigError


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
            code = _cmd_run(ns)
            if code == 130:  # Ctrl-C: do not wait for in-process steps (they are recorded INTERRUPTED)
                from schooner.cluster.runner._entry import exit_now

                exit_now(code)
            return code
        if ns.command == "status":
            return _cmd_status(ns)
        if ns.command == "report":
            return _cmd_report(ns)
        if ns.command == "compare":
            from schooner.cluster.runner._runner import resolve_prefix

            from ._compare import cmd_compare

            return cmd_compare(resolve_prefix(ns.prefix), ns.steps, ns.plot, ns.metric)
        if ns.command in plugins:
            return plugins[ns.command].run(ns)
        if ns.command == "cluster":
            from ._cluster_cmd import cmd_cluster

            return cmd_cluster(ns, make_console())
        return _cmd_explain(ns)
    except ConfigError as e:
        make_console().print(f"[bold red]error:[/] {_esc(str(e))}")
        return 2


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


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
    """Run the experiment file as `__main__` under `options`; its globals."""
    if not os.path.isfile(path):
        raise SystemExit(f"schooner: experiment file {path!r} does not exist")
    with _script_context(path, args), applying(options):
        return runpy.run_path(path, run_name="__main__")


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


def _cmd_run(ns: argparse.Namespace) -> int:
    from schooner.cluster.runner._entry import EXIT_BAD, execute
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


def _cmd_status(ns: argparse.Namespace) -> int:
    from rich.table import Table

    from schooner.cluster.records import read_step_record
    from schooner.cluster.runner._lease import parse_lease
    from schooner.cluster.runner._runner import resolve_prefix
    from schooner.cluster.runner._status import StepState, meta_path, scan_prefix
    from schooner.cluster.storage import storage_for

    prefix = resolve_prefix(ns.prefix)
    console = make_console()
    _require_prefix(prefix, ns.prefix)
    try:
        pattern = re.compile(ns.name) if ns.name else None
    except re.error as e:
        from rich.markup import escape

        console.print(
            f"[bold red]error:[/] {escape(f'--name {ns.name!r} is not a valid regular expression: {e}')}"
        )
        return 2
    table = Table(title=f"steps under {prefix}", title_justify="left")
    for col in ("step", "key", "state", "age", "took", "output"):
        table.add_column(col, overflow="fold" if col == "output" else "ellipsis")
    counts: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    listed = []
    for found in scan_prefix(prefix):
        storage = storage_for(found.output_path)
        st = found.status
        record = read_step_record(found.output_path, storage=storage) or {}
        name = (st.name if st else "") or record.get("name") or found.output_path.rsplit("/", 1)[-1]
        listed.append((found, storage, st, record, name))
    exact = pattern is not None and any(name == ns.name for *_, name in listed)
    for found, storage, st, record, name in listed:
        # --name that is a step's name is that step alone (names may hold regex characters); else a regex
        if pattern and (name != ns.name if exact else not pattern.search(name)):
            continue
        state = st.state.value if st else "UNKNOWN"
        style = {"SUCCESS": "green", "FAILED": "red", "RUNNING": "cyan"}.get(state, "yellow")
        if st is not None and st.state is StepState.RUNNING:
            lease = parse_lease(storage.read_text(meta_path(found.output_path, "lease.json")))
            if lease is None or lease.is_stale():
                state, style = "INTERRUPTED", "yellow"
        counts[state] = counts.get(state, 0) + 1
        took = record.get("duration_s")
        rows.append(
            {
                "name": name,
                "key": st.key if st else record.get("key"),
                "state": state,
                "time": st.time if st else None,
                "duration_s": took,
                "output_path": found.output_path,
            }
        )
        table.add_row(
            name,
            (st.key if st else record.get("key", ""))[:8],
            f"[{style}]{state}[/]",
            fmt_age(st.time if st else None),
            fmt_duration(took),
            found.output_path,
        )
    if ns.json:
        print(json.dumps(rows, indent=1))
        return 0
    console.print(table)
    console.print(", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no steps found")
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from schooner.cluster.runner._runner import resolve_prefix

    from ._report import write_report

    prefix = resolve_prefix(ns.prefix)
    _require_prefix(prefix, ns.prefix)
    out = write_report(prefix, ns.out)
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
    from schooner.cluster.runner._explain import explain_records, explain_step
    from schooner.cluster.runner._runner import resolve_prefix

    prefix = resolve_prefix(ns.prefix)
    console = make_console()
    if ns.experiment is None:
        expl = explain_records(prefix, ns.step)
        found = [expl] if expl is not None else []
        known: list[str] = []
        if not found:  # a regex, as for a step of the experiment file
            from schooner.cluster.cli._compare import _known_names

            known = _known_names(prefix)
            with contextlib.suppress(re.error):
                found = [e for n in known if re.search(ns.step, n) for e in [explain_records(prefix, n)] if e]
        if not found:
            listed = ", ".join(known[:30]) or "none"
            console.print(
                _esc(
                    f"no recorded step named {ns.step!r} under {prefix} (steps there: {listed}); pass the "
                    "experiment file to explain a step that has not run yet"
                )
            )
            return 1
        for e in found[:10]:
            console.print(_esc("\n".join(e.lines())))
        return 0
    steps = capture_steps(ns.experiment, prefix)
    by_key = {s.key: s for s in steps}
    names = ", ".join(sorted({s.name for s in steps})[:30])
    try:
        matches = [s for s in steps if s.name == ns.step] or [s for s in steps if re.search(ns.step, s.name)]
    except re.error as e:
        console.print(
            f"[bold red]error:[/] {_esc(f'{ns.step!r} is no step name of {ns.experiment} and not a valid regular expression ({e}); its steps: {names}')}"
        )
        return 2
    if not matches:
        console.print(f"[bold red]error:[/] no step named {ns.step!r} in {ns.experiment}; its steps: {names}")
        return 2
    for s in matches[:10]:
        console.print(_esc("\n".join(explain_step(s, prefix, by_key).lines())))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
