"""What the runner prints: the plan, a line per step event while running, and the summary table."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from ._lower import Step
    from ._results import RunResult, StepOutcome

_STYLE = {
    "cached": ("green", "cached"),
    "succeeded": ("bold green", "done"),
    "failed": ("bold red", "FAILED"),
    "interrupted": ("yellow", "stopped"),
    "skipped": ("yellow", "not run"),
    "will_run": ("cyan", "will run"),
    "running": ("cyan", "running"),
}
MAX_ROWS = 40
"""Summary tables longer than this list only the steps that did not come from the cache."""


def make_console(quiet: bool = False) -> Console:
    from rich.console import Console

    width = None if os.isatty(1) else int(os.environ.get("COLUMNS", "140"))
    return Console(highlight=False, width=width, quiet=quiet, soft_wrap=False)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def fmt_age(t: float | None) -> str:
    return "" if not t else fmt_duration(max(0.0, time.time() - t)) + " ago"


class Progress:
    """Prints runner events on a rich console (thread-safe: rich serialises prints)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.quiet = bool(getattr(console, "quiet", False))
        self._running: dict[str, float] = {}
        self._waiting: set[str] = set()
        self._done = 0
        self._total = 0

    @contextlib.contextmanager
    def live(self, total: int) -> Iterator[None]:
        """On a terminal: a status line below the event lines, listing the running steps and their time."""
        self._total, self._done = total, 0
        if self.quiet or not self.console.is_terminal:
            yield
            return
        from rich.live import Live

        with Live(_LiveView(self), console=self.console, refresh_per_second=2, transient=True):
            yield

    def status_line(self) -> str:
        now = time.time()
        running = sorted(self._running.items(), key=lambda kv: kv[1])
        shown = ", ".join(f"{name} ({fmt_duration(now - t0)})" for name, t0 in running[:4])
        more = f" and {len(running) - 4} more" if len(running) > 4 else ""
        waiting = f"; waiting for other runners: {', '.join(sorted(self._waiting))}" if self._waiting else ""
        return f"{self._done}/{self._total} finished; running: {shown or '-'}{more}{waiting}"

    def plan(self, total: int, cached: int, to_run: int, prefix: str, run_id: str) -> None:
        if self.quiet:
            return
        self.console.print(
            f"[bold]schooner[/] run {run_id}: {total} step(s), [green]{cached} cached[/], "
            f"[cyan]{to_run} to run[/] under {prefix}"
        )

    def started(self, step: Step, output_path: str, where: str) -> None:
        self._waiting.discard(step.name)
        self._running[step.name] = time.time()
        if self.quiet:
            return
        self.console.print(f"  [cyan]▶ start[/]   {step.name} [dim]({where}) → {output_path}[/]")

    def waiting(self, step: Step, holder: str) -> None:
        self._waiting.add(step.name)
        if self.quiet:
            return
        self.console.print(f"  [yellow]… wait[/]    {step.name} [dim]held by {holder}[/]")

    def message(self, text: str) -> None:
        """A one-line remark about the whole run."""
        if self.quiet:
            return
        self.console.print(f"  [yellow]! note[/]    [dim]{_escape(text)}[/]")

    def note(self, step: Step, text: str) -> None:
        """A one-line remark about a step (e.g. what `--force` removed)."""
        if self.quiet:
            return
        self.console.print(f"  [yellow]! note[/]    {step.name} [dim]{_escape(text)}[/]")

    def took_over(self, step: Step) -> None:
        if self.quiet:
            return
        self.console.print(f"  [yellow]↻ resume[/]  {step.name} [dim](took over a stale lease)[/]")

    def finished(self, outcome: StepOutcome) -> None:
        self._running.pop(outcome.name, None)
        self._waiting.discard(outcome.name)
        self._done += 1
        if self.quiet:
            return
        style, word = _STYLE[outcome.state]
        extra = fmt_duration(outcome.duration_s)
        if outcome.state == "cached":
            extra = "finished by another runner" if outcome.note else "cached"
        if outcome.state == "failed":  # its error is printed once, with its traceback, after the summary
            took = f" after {fmt_duration(outcome.duration_s)}" if outcome.duration_s is not None else ""
            extra = (
                f"{_escape(outcome.error_type or 'error')}{took} (its error is shown at the end of the run)"
            )
        elif outcome.state == "skipped":
            extra = _escape(outcome.error_line())
        self.console.print(
            f"  [{style}]{'✓' if outcome.ok else '✗'} {word:<7}[/] {outcome.name} [dim]{extra}[/]"
        )

    def dry_run(
        self, steps: Sequence[Step], states: dict[str, str], paths: dict[str, str], roots: Sequence[str]
    ) -> None:
        if self.quiet:
            return
        from rich.tree import Tree

        by_key = {s.key: s for s in steps}
        tree = Tree(
            f"[bold]plan[/] (dry run: nothing is written): {sum(v == 'will_run' for v in states.values())} "
            f"to run, {sum(v == 'cached' for v in states.values())} cached"
        )
        shown: set[str] = set()

        def add(node: Any, key: str) -> None:
            s = by_key[key]
            style, word = _STYLE[states[key]]
            label = f"[{style}]{word}[/] {s.name} [dim]{paths[key]}[/]"
            if key in shown and s.deps:
                node.add(label + " [dim](inputs shown above)[/]")
                return
            shown.add(key)
            child = node.add(label)
            for d in s.deps:
                add(child, d)

        for r in roots:
            add(tree, r)
        self.console.print(tree)

    def summary(self, result: RunResult) -> None:
        if self.quiet:
            return
        from rich.table import Table

        rows = list(result.steps)
        hidden: dict[str, int] = {}
        if len(rows) > MAX_ROWS:  # long runs: every problem, then as many others as fit
            bad = [o for o in rows if not o.ok]
            good = [o for o in rows if o.ok]
            room = max(0, MAX_ROWS - len(bad))
            for o in good[room:]:
                hidden[o.state] = hidden.get(o.state, 0) + 1
            rows = bad + good[:room]
        table = Table(title=f"run {result.run_id}: {result.counts_line()}", title_justify="left")
        table.add_column("step")
        table.add_column("state")
        table.add_column("time", justify="right")
        table.add_column("output / reason", overflow="fold")
        for o in rows:
            style, word = _STYLE[o.state]
            detail = o.output_path if o.ok else _escape(o.error_line())
            if o.state == "failed":  # the error itself is printed once, below the table
                detail = f"{_escape(o.error_type or 'error')} (below): {o.output_path}"
            table.add_row(o.name, f"[{style}]{word}[/]", fmt_duration(o.duration_s), detail)
        for state, n in sorted(hidden.items()):
            style, word = _STYLE[state]
            table.add_row(f"[dim]… {n} more[/]", f"[{style}]{word}[/]", "", "[dim]see `schooner status`[/]")
        self.console.print(table)
        for o in result.failed:
            self.console.print(failure_text(o))


TRACEBACK_LINES = 25
"""The last lines of a failed step's traceback printed after a run's summary (its record keeps them all)."""


def failure_text(o: StepOutcome) -> str:
    """A failed step as the end of a run prints it, its error's only appearance on the console: the step's
    name and output folder, the last `TRACEBACK_LINES` of its traceback (ending in the error), and where the
    whole of it is kept: the `error` of its record, `.schooner/step.json` (and its cluster job's output)."""
    lines = (o.error or "").rstrip().splitlines()
    notes = 0  # the runner's notes before the traceback ("(the previous output stays published in ...)"):
    while notes < len(lines) - 1 and lines[notes].startswith("(") and lines[notes].endswith(")"):
        notes += 1  # printed whole; only the traceback below them is cut
    body = lines[notes:]
    start = max(0, len(body) - TRACEBACK_LINES)
    if start:  # from a frame's `File` line, not from the middle of a frame (its source or caret line)
        start = next((i for i in range(start, len(body) - 1) if body[i].lstrip().startswith("File ")), start)
    cut = f"[dim]… ({start} lines above)[/]\n" if start else ""
    head = "".join(f"{_escape(ln)}\n" for ln in lines[:notes])
    tail = "\n".join(body[start:])
    text = f"[bold red]{o.name}[/] failed ({o.output_path}):\n{head}{cut}[red]{_escape(tail)}[/]"
    if o.error_type == "LeaseLostError":
        return text  # nothing of this attempt is recorded: another runner holds the step
    from schooner.cluster.records import meta_path

    if any(
        ln.startswith("(the previous output stays published in") for ln in lines[:2]
    ):  # its record is that output's
        kept = f"the whole traceback is the `error` of the last line of {meta_path(o.output_path, 'history.jsonl')}"
    else:
        kept = f"the whole traceback is the `error` of its record, {meta_path(o.output_path, 'step.json')}"
    log = meta_path(o.output_path, "job.log")
    with contextlib.suppress(Exception):
        from schooner.cluster.storage import exists

        if exists(log):
            kept += f"; its job's output: {log}"
    return f"{text}\n[dim]({_escape(kept)})[/]"


class _LiveView:
    """Rendered afresh at every refresh of the live display."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def __rich__(self) -> str:
        return f"[dim]{_escape(self.progress.status_line())}[/]"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
