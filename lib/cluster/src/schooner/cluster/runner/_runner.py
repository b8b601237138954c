"""`StepRunner`: run a graph of steps in topological order, concurrently, skipping what is done.

Per step: read the status file (SUCCESS -> cached; no lock, no client call, so a no-op rerun is pure
bookkeeping); otherwise take the output folder's lease (waiting while another live runner holds it),
write the record and RUNNING, run the function (in this process, or through the current cluster client
when the step has resources), then write the final record and SUCCESS (last) or FAILED.

Writers are fenced (`_publish`, `_step_exec`): the function writes into a folder of its own attempt beside
the output, never into the output folder. On success, with the lease checked once more, the attempt (with
its record and SUCCESS) is swapped with the output folder in one atomic rename, so a reader resolving a
step's output only ever sees a complete published attempt, even while `--force` reruns it. A runner that
stalled past its lease and lost it (SIGSTOP, swapping) writes only into its own orphaned folder; its
heartbeat notices, says so, stops the step and it publishes nothing. Resumable steps adopt the folder of a
dead attempt (their checkpoints, their ledger of finished shards); every start of a function (node, pid,
how it ended: a preemption is a start that died) goes into the step's record and history.

Beside it: `_plan` (which steps a run picks, their statuses, notes on reused steps), `_schedule` (running
them concurrently in dependency order) and `_step_exec` (one step).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable
from typing import Any

from schooner.cluster._client import Client
from schooner.cluster._current import using_client
from schooner.cluster._resources import ResourceConfig
from schooner.cluster._secrets import secret_values
from schooner.cluster.records import (
    StepState,
    experiment_record_path,
    read_step_record,
    write_experiment_record,
)
from schooner.cluster.storage import is_plain_path, normalize_prefix

from ._lease import DEFAULT_HEARTBEAT_S, DEFAULT_TTL_S
from ._lower import Step, _flatten, lower
from ._options import CapturedRun, DryRunStop, current_options, run_flags_in
from ._plan import code_change, forced_rerun_failed, input_replaced, picks, read_statuses, select
from ._progress import Progress, make_console
from ._records import environment, experiment_name, scrub_any
from ._results import RunInterrupted, RunResult, StepFailedError, StepOutcome
from ._schedule import schedule
from ._step_exec import StepExecutor
from ._version import ConfigError

PREFIX_ENV = "SCHOONER_PREFIX"
DEFAULT_PREFIX = "schooner-output"
"""Used when neither `prefix=`/`--prefix` nor $SCHOONER_PREFIX is given (relative to the working dir)."""
DEFAULT_MAX_CONCURRENT = 32
SHARED_PREFIX_ENV = "SCHOONER_SHARED_PREFIX"
"""Set to 1 when a local-looking prefix is shared by every node of the cluster (NFS, a mounted bucket)."""


def resolve_prefix(prefix: str | None = None) -> str:
    """`prefix`, else $SCHOONER_PREFIX, else ./schooner-output; normalised (absolute local path or URL)."""
    return normalize_prefix(prefix or os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX)


def _compile(patterns: Iterable[str] | str | None, flag: str) -> list[re.Pattern[str]]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ConfigError(f"{flag}={p!r} is not a valid regular expression: {e}") from None
    return out


class StepRunner:
    """Runs steps: `StepRunner(prefix=None, client=None).run([handles or lowered steps])`.

    Args:
        prefix: where outputs go: a local folder, `file://`, `memory://` (in-process steps only) or any
            fsspec URL. Default: $SCHOONER_PREFIX, else `./schooner-output`.
        client: the cluster client for steps with resources; default `current_client()` when needed.
        lease_ttl: seconds without heartbeat after which another host's lease is stale
            (default $SCHOONER_LEASE_TTL or 60). Leases of dead processes on this host are stale at once.
        heartbeat_s: seconds between lease heartbeats (default ttl/12, at most 5).
        quiet: print nothing.
        shared_prefix: a local-looking prefix is on storage every node of the cluster sees (NFS, a
            mounted bucket). Without it, a local prefix is refused when steps would run on a Ray cluster
            of several nodes: each node would write to its own disk. Default: $SCHOONER_SHARED_PREFIX=1.
    """

    def __init__(
        self,
        prefix: str | None = None,
        client: Client | None = None,
        *,
        lease_ttl: float | None = None,
        heartbeat_s: float | None = None,
        quiet: bool = False,
        console: Any = None,
        shared_prefix: bool | None = None,
    ) -> None:
        self._prefix_arg = prefix
        self.client = client
        self.shared_prefix = (
            shared_prefix if shared_prefix is not None else os.environ.get(SHARED_PREFIX_ENV, "") == "1"
        )
        ttl = (
            lease_ttl if lease_ttl is not None else float(os.environ.get("SCHOONER_LEASE_TTL", DEFAULT_TTL_S))
        )
        if ttl <= 0:
            raise ValueError(f"StepRunner: lease_ttl must be > 0 seconds, got {ttl}")
        self.lease_ttl = ttl
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else min(DEFAULT_HEARTBEAT_S, ttl / 12)
        self.quiet = quiet
        self._console = console

    @property
    def prefix(self) -> str:
        opts = current_options()
        return resolve_prefix((opts.prefix if opts else None) or self._prefix_arg)

    def output_path(self, handle: Any) -> str:
        """Where a step (handle or lowered step) writes under this runner's prefix."""
        h = handle.handle if isinstance(handle, Step) else handle
        return h.output_path(self.prefix)

    def run(
        self,
        steps: Any,
        run_only: Iterable[str] | str | None = None,
        force: Iterable[str] | str | None = None,
        dry_run: bool = False,
        max_concurrent: int | None = None,
        *,
        raise_on_failure: bool = True,
    ) -> RunResult:
        """Run `steps` (handles, lowered steps, or lists of them) and everything they need.

        Args:
            steps: what to produce.
            run_only: regexes (`re.search` on step names); run only matching steps and their inputs.
            force: regexes; rerun matching steps even when done (their dependents keep their keys, so
                they stay cached unless forced too). A pattern that matches no step of the run is a
                `ConfigError` (a `--force` from the command line: a note in the plan, since it applies to
                every run() of the script).
            dry_run: print the plan as a tree (what runs, what is cached) and write nothing.
            max_concurrent: run at most this many steps at once (default 32; steps with resources are
                further limited by the cluster).
            raise_on_failure: raise `StepFailedError` (after printing the summary) when a step failed;
                with False, check `result.ok` instead.

        Command-line flags apply on top of these arguments when the experiment is started by
        `schooner run EXP.py --dry-run ...` or through `StepRunner().main([...])` (`python EXP.py --dry-run`):
        `--only` replaces `run_only` (the later, explicit selection), `--force` adds its patterns to `force`,
        and `--dry-run`, `--prefix` and the others override their arguments. `run` itself never reads
        `sys.argv`, and refuses to run when it holds flags nothing applied.

        Returns:
            A `RunResult`: `.ok`, `.steps`, and `result[handle]` -> `StepOutcome` (state, output_path,
            result, error).

        Raises:
            StepFailedError: a step failed (with `raise_on_failure`).
            RunInterrupted: Ctrl-C; the running steps were recorded INTERRUPTED and their jobs stopped.
            ResourcesUnavailableError: a step that would run asks for more than the client has (checked
                before anything runs).
        """
        opts = current_options()
        if opts is None:
            _refuse_unread_flags()
        quiet, shared = self.quiet, self.shared_prefix
        cli_force: set[str] = set()
        if opts is not None:
            opts.runs += 1
            dry_run = dry_run or opts.dry_run
            run_only = list(opts.only) or run_only
            cli_force = set(opts.force) - set(_as_list(force))
            force = [*(_as_list(force)), *opts.force]
            max_concurrent = opts.max_concurrent or max_concurrent
            quiet = quiet or opts.quiet
            shared = shared or opts.shared_prefix
        prefix = resolve_prefix((opts.prefix if opts else None) or self._prefix_arg)
        lowered = lower(steps)
        if opts is not None and opts.capture is not None:
            opts.capture.append(lowered)
            raise CapturedRun()
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        result = self._run(
            lowered,
            [h.key for h in _flatten(steps)],
            prefix,
            _compile(run_only, "run_only"),
            _compile(force, "force"),
            dry_run,
            max_concurrent or DEFAULT_MAX_CONCURRENT,
            raise_on_failure,
            quiet,
            shared,
            cli_force,
        )
        if opts is not None and opts.dry_run:
            # `--dry-run` from the command line: the plan is the whole answer. Stop the script here, since
            # code after run() may need results that a dry run does not produce.
            raise DryRunStop()
        return result

    def main(self, steps: Any, argv: list[str] | None = None) -> RunResult:
        """The entry point of an experiment script: `python exp.py [--dry-run] [--force RE] [--only RE]
        [--prefix P] [--cluster SPEC] [--max-concurrent N] [--quiet]`.

        Reads the flags from `argv` (default `sys.argv[1:]`; an unknown flag is an error), runs `steps`
        with them and returns the `RunResult`. Like `schooner run`, it exits the process with status 1 when
        a step failed, 130 on Ctrl-C (after one line saying what was interrupted), 2 for a bad experiment,
        and 0 after a dry run's plan. Under `schooner run EXP.py`, the command line's flags apply and
        `main` is `run`.

        Example:
            >>> if __name__ == "__main__":          # at the end of an experiment file  # doctest: +SKIP
            ...     StepRunner().main([model])
        """
        if current_options() is not None:
            return self.run(steps)
        # A script's entry point is the command line's (flags, exit statuses): the runner parses nothing.
        from schooner.cluster.cli._entry import run_main

        return run_main(lambda: self.run(steps), sys.argv[1:] if argv is None else list(argv))

    # ------------------------------------------------------------------------------------------------------
    def _run(
        self,
        steps: list[Step],
        root_keys: list[str],
        prefix: str,
        only: list[re.Pattern[str]],
        force: list[re.Pattern[str]],
        dry_run: bool,
        max_concurrent: int,
        raise_on_failure: bool,
        quiet: bool = False,
        shared_prefix: bool = False,
        cli_force: set[str] | None = None,
    ) -> RunResult:
        t0 = time.time()
        run_id = uuid.uuid4().hex[:10]
        console = self._console or make_console(quiet)
        progress = Progress(console)
        if only:
            steps = select(steps, only)
        step_names = {s.name for s in steps}
        for p in force:
            if not any(picks(p, s.name, step_names) for s in steps):
                names = ", ".join(sorted({s.name for s in steps})[:20]) or "none"
                text = f"matches no step{' of this run' if only else ''}; steps are: {names}"
                if p.pattern in (cli_force or ()):
                    # The command line's --force applies to every run() of a script (each may run other
                    # steps): said in this run's plan, not refused.
                    progress.message(f"--force {p.pattern!r} {text}; nothing is forced by it here")
                else:
                    raise ConfigError(f"force {p.pattern!r} {text}")
        if not steps:
            progress.plan(0, 0, 0, prefix, run_id)
            return RunResult(run_id, prefix, [], dry_run=dry_run, duration_s=time.time() - t0)
        by_key = {s.key: s for s in steps}
        needed = {d for s in steps for d in s.deps}
        roots = [k for k in dict.fromkeys(root_keys) if k in by_key and k not in needed]
        roots = roots or [s.key for s in steps if s.key not in needed]
        paths = {s.key: s.handle.output_path(prefix) for s in steps}
        for s in steps:
            if s.handle.resources is not None and paths[s.key].startswith("memory://"):
                raise ConfigError(
                    f"step {s.name!r} has resources, so it runs in a worker process, but its output "
                    f"{paths[s.key]} is in this process's memory:// filesystem, which workers cannot see; "
                    "use a local or object-store prefix, or drop the step's resources"
                )
        forced = {s.key for s in steps if any(picks(p, s.name, step_names) for p in force)}
        states: dict[str, str] = {}
        code_changed: list[tuple[Step, str]] = []
        statuses = read_statuses([paths[s.key] for s in steps])
        for s, st in zip(steps, statuses, strict=True):
            out = paths[s.key]
            if st is not None and st.state is StepState.SUCCESS and st.key != s.key:
                raise ConfigError(
                    f"step {s.name!r}: output folder {out} already holds a different step ({st.name!r}, key "
                    f"{st.key[:8]}); give this step another override_output_path or remove that folder"
                )
            done = st is not None and st.state is StepState.SUCCESS and s.key not in forced
            states[s.key] = "cached" if done else "will_run"
            if done and st is not None:
                note = code_change(s, out, st)
                if note:
                    code_changed.append((s, note))
        # A cached step whose input was published again since it ran (a `--force` of the input in another
        # run) is stale; steps downstream of a forced or stale one rerun on its new output (skipped if it
        # fails). Both run like forced steps (from an empty folder, the old output readable until replaced).
        status_of = {s.key: st for s, st in zip(steps, statuses, strict=True)}
        rerun_notes: list[tuple[Step, str]] = []
        for s in steps:  # topological order: inputs first
            if states[s.key] != "cached":
                continue
            upstream = next((by_key[d] for d in s.deps if d in forced), None)
            if upstream is not None:
                why = f"reruns: its input {upstream.name!r} reruns in this run, so its output is replaced"
            else:
                why = input_replaced(s, paths[s.key], status_of, by_key)
            if why:
                forced.add(s.key)
                states[s.key] = "will_run"
                rerun_notes.append((s, why))
            else:
                note = forced_rerun_failed(s, paths[s.key], status_of[s.key])
                if note:
                    code_changed.append((s, note))
        for s, st in zip(steps, statuses, strict=True):
            if st is not None and states[s.key] == "will_run":
                # Its attempt reads the record (whose folder it is, what it resumes): a record that is not
                # standard JSON stops the run here, before anything is written, as a cached step's does.
                read_step_record(paths[s.key])
        behind_forced: set[str] = set()
        n_run = sum(v == "will_run" for v in states.values())
        will_run = [s for s in steps if states[s.key] == "will_run"]
        self._check_resources(will_run, prefix, dry_run, progress, shared_prefix)
        if dry_run:
            progress.dry_run(steps, states, paths, roots)
            for s, note in rerun_notes + code_changed:
                progress.note(s, note)
            planned = [StepOutcome(s.name, s.key, paths[s.key], states[s.key]) for s in steps]
            return RunResult(run_id, prefix, planned, dry_run=True, duration_s=time.time() - t0)

        progress.plan(len(steps), len(steps) - n_run, n_run, prefix, run_id)
        for s, note in rerun_notes + code_changed:
            progress.note(s, note)
        outcomes = {
            s.key: StepOutcome(s.name, s.key, paths[s.key], "cached")
            for s in steps
            if states[s.key] == "cached" and s.key not in behind_forced
        }
        env = environment()
        exp_name = experiment_name()
        exp_key = hashlib.sha256(json.dumps(sorted(roots)).encode()).hexdigest()
        exp_path = experiment_record_path(prefix, exp_name, exp_key, t0, run_id)
        exp = _experiment_record(exp_name, run_id, prefix, env, t0)
        if n_run:
            write_experiment_record(exp_path, exp)  # early, so a run that dies is on record too
            executor = StepExecutor(self, prefix, paths, run_id, env, forced, progress, secret_values())
            restore_sigterm = sigterm_interrupts()
            try:
                todo = [s for s in steps if states[s.key] == "will_run" or s.key in behind_forced]
                # The runner's client is also the current client of the steps it runs in-process, so
                # their own fan-out (`current_client().map(...)`) lands on the same cluster.
                current = using_client(self.client) if self.client is not None else contextlib.nullcontext()
                with progress.live(len(todo)), current:
                    schedule(todo, by_key, outcomes, executor, max_concurrent)
            except KeyboardInterrupt as e:
                stopped = executor.interrupt()
                how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
                message = how + (f": {'; '.join(stopped)}" if stopped else " before any step started")
                exp.update(ended=time.time(), ok=False, interrupted=True, counts=message)
                if isinstance(e, Terminated):
                    exp["signal"] = "SIGTERM"
                with contextlib.suppress(Exception):
                    write_experiment_record(exp_path, exp)
                raise RunInterrupted(
                    message, signal="SIGTERM" if isinstance(e, Terminated) else "SIGINT"
                ) from None
            finally:
                executor.close()
                restore_sigterm()
        ordered = [outcomes[s.key] for s in steps]
        result = RunResult(run_id, prefix, ordered, duration_s=time.time() - t0, experiment_record=exp_path)
        # The experiment record of every (non-dry) run.
        exp.update(
            ended=time.time(),
            ok=result.ok,
            counts=result.counts_line(),
            steps=[
                {
                    "name": o.name,
                    "key": o.key,
                    "output_path": o.output_path,
                    "state": o.state,
                    "duration_s": o.duration_s,
                    "error": o.error_line() or None,
                }
                for o in ordered
            ],
        )
        write_experiment_record(exp_path, exp)
        if n_run or not result.ok:
            progress.summary(result)
        if not result.ok and raise_on_failure:
            raise StepFailedError(result)
        return result

    def _check_resources(
        self, to_run: list[Step], prefix: str, dry_run: bool, progress: Progress, shared_prefix: bool
    ) -> None:
        """Every step that will run must fit the client, and its output must be where every node sees it:
        fail before anything runs, not when a step's turn comes.

        A client that connects lazily (a `RayClient` that has not started) is not started for a dry run.
        """
        needs = [s for s in to_run if s.handle.resources is not None]
        if not needs:
            return
        client = self.client
        if client is None:
            from schooner.cluster._current import current_client

            client = current_client()
        if dry_run and getattr(client, "started", True) is False:
            progress.message(
                f"resources of {len(needs)} step(s) not checked: {client!r} is not started for a dry run"
            )
            return
        for s in needs:
            client.check(s.handle.resources or ResourceConfig(), what=f"step {s.name!r}")
        nodes = getattr(client, "nodes", None)
        local = [s for s in needs if is_plain_path(s.handle.output_path(prefix))]
        if local and nodes is not None and not shared_prefix and len(nodes()) > 1:
            raise ConfigError(
                f"the output of step {local[0].name!r} ({local[0].handle.output_path(prefix)}) is on a local path, "
                f"but the Ray cluster has {len(nodes())} nodes: each would write to its own disk and outputs would "
                "be split between them silently; use a prefix every node sees (gs://, s3://, NFS) and, for a "
                "shared local-looking path, say so with --shared-prefix, StepRunner(shared_prefix=True) or "
                f"{SHARED_PREFIX_ENV}=1"
            )


def _as_list(x: Iterable[str] | str | None) -> list[str]:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def _refuse_unread_flags() -> None:
    """`python exp.py --dry-run` whose script calls `StepRunner().run` (not `.main`): the flag would be
    ignored and everything would run. Refuse instead (`SCHOONER_NO_ARGV=1` for scripts with their own
    flags of these names)."""
    given = run_flags_in(sys.argv[1:])
    if not given:
        return
    script = os.path.basename(sys.argv[0]) or "EXP.py"
    raise ConfigError(
        f"the command line has {' '.join(given)}, which StepRunner.run does not read, so it would be ignored; "
        f"run `schooner run {script} {' '.join(sys.argv[1:])}`, or end the script with "
        "`StepRunner().main([...])`, which reads them (set SCHOONER_NO_ARGV=1 if the script parses such "
        "flags itself)"
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while steps ran: handled like Ctrl-C (steps recorded INTERRUPTED, jobs stopped), said
    as such, exit status 143."""


def sigterm_interrupts() -> Any:
    """While steps run, SIGTERM raises `Terminated` in the main thread (as Ctrl-C raises KeyboardInterrupt);
    returns what puts the previous handler back. Nothing is changed outside the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum: int, frame: Any) -> None:
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def _experiment_record(name: str, run_id: str, prefix: str, env: dict[str, Any], t0: float) -> dict[str, Any]:
    return {
        "experiment": name,
        "run_id": run_id,
        "prefix": prefix,
        "argv": scrub_any(list(sys.argv)),
        "env": env,
        "started": t0,
        "ended": None,
        "ok": None,
        "steps": [],
    }
