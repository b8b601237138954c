"""Running one step: lease, record, the function (here or on the cluster), then SUCCESS or FAILED.

Writers are fenced (see `_publish`): the function writes into a folder of its own attempt, never into the
step's output folder; on success, with the lease still held, the attempt is swapped into place in one
atomic rename, with its SUCCESS status inside. A reader of a step's output thus only ever sees a complete
published attempt, even while `--force` reruns it, and a runner that was stopped past its lease (and lost
it to another) writes only into its own orphaned folder: its heartbeat notices the loss, says so, stops the
step (cancels its job; raises `LeaseLostError` inside an in-process step) and it publishes nothing.

Beside it: `_take_lease` (the lease, or another runner's outcome), `_attempt_folder` (the folders checked
and prepared before the function runs), `_call_step` (what runs where the function runs) and
`_attempt_end` (the end's record, history and status).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
import traceback
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from schooner.cluster._client import JobError
from schooner.cluster._fingerprint import code_files
from schooner.cluster._secrets import scrub
from schooner.cluster.records import (
    StepState,
    meta_path,
    read_step_record,
    record_lost_attempt,
    step_status,
    write_step_record,
    write_step_status,
)
from schooner.cluster.storage import storage_for

from . import _call_step
from ._attempt_end import (
    free_reserve,
    held_now,
    how_it_continues,
    is_disk_full,
    record_end,
    reserve_disk,
    restore_published,
    seconds_text,
)
from ._attempt_folder import attempt_folder, check_input_paths, check_own_folder
from ._call_step import call_step, imported_afresh, read_starts
from ._lease import Lease
from ._lower import Step
from ._orphans import OrphanGuard
from ._publish import keep_failed_attempt, publish, rebase_paths, remove_tree
from ._records import scrub_any, step_record
from ._results import ResultWarning, StepOutcome
from ._scrub_output import scrubbed_output
from ._step import resolve_config
from ._take_lease import take_lease

if TYPE_CHECKING:
    from schooner.cluster._client import Client, JobHandle

    from ._progress import Progress

MAX_RESULT_CHARS = 1_000_000
"""A step's return value is stored in its record; larger values are replaced by a note."""


_RUNNER_FILES = frozenset({__file__, _call_step.__file__})
"""The runner's own source files: their frames are cut from the top of a failed step's traceback."""


class LeaseLostError(RuntimeError):
    """Another runner took this step's lease over while it ran (this runner looked dead to it): this
    attempt stops and publishes nothing."""


class RunnerSettings(Protocol):
    """What an executor reads of its `StepRunner`."""

    client: Client | None
    lease_ttl: float
    heartbeat_s: float


class StepExecutor:
    """Executes the steps of one run (called from the runner's threads)."""

    def __init__(
        self,
        runner: RunnerSettings,
        prefix: str,
        paths: dict[str, str],
        run_id: str,
        env: dict[str, Any],
        forced: set[str],
        progress: Progress,
        secrets: list[str],
    ) -> None:
        self.runner = runner
        self.prefix = prefix
        self.paths = paths
        self.run_id = run_id
        self.env = env
        self.forced = forced
        self.progress = progress
        self.secrets = secrets
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._jobs: dict[str, JobHandle] = {}
        self._logs: dict[str, str] = {}
        self._running: dict[str, tuple[Step, Lease, dict, float]] = {}
        self._interrupted = False
        self._stopped: list[str] = []
        self._published: dict[str, tuple[Any, dict]] = {}
        """Steps rerun (forced) over a published output: its status and record, restored if they fail."""
        self._threads: dict[str, int] = {}
        """Steps running in this process now: the id of the thread calling their function."""
        self._lost: set[str] = set()
        """Steps whose lease another runner took over while they ran."""
        """Steps that raised KeyboardInterrupt themselves (already recorded INTERRUPTED)."""
        self._orphans = OrphanGuard()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="schooner-heartbeat", daemon=True)
        self._beat.start()

    # -- leases ------------------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.runner.heartbeat_s):
            with self._lock:
                leases = list(self._leases.values())
            for lease in leases:
                # A transient storage error (OSError or a store client's own exception type): the next
                # beat retries, and the ttl has slack for several missed beats.
                with contextlib.suppress(Exception):
                    if not lease.heartbeat():
                        self._lease_lost(lease)

    def _lease_lost(self, lease: Lease) -> None:
        """Another runner took a running step over (this one stalled past the ttl): say so, stop the step."""
        with self._lock:
            found = [(k, s) for k, (s, held, _r, _t) in self._running.items() if held is lease]
            if not found or found[0][0] in self._lost:
                return
            key, step = found[0]
            self._lost.add(key)
            job = self._jobs.get(key)
            thread = self._threads.get(key)
            if thread is not None:  # in process: stop the function at its next Python line
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread), ctypes.py_object(LeaseLostError)
                )
        holder = lease.read()
        self.progress.note(
            step,
            f"lost its lease on {self.paths[key]} to "
            f"{holder.describe() if holder else 'another runner'} (this runner stalled past the lease ttl): "
            "stopping this attempt; it publishes nothing",
        )
        if job is not None:
            with contextlib.suppress(Exception):
                job.cancel()

    # -- one step ----------------------------------------------------------------------------------------
    def execute(self, step: Step) -> StepOutcome:
        out = self.paths[step.key]
        try:
            lease, decided = take_lease(
                step,
                out,
                run_id=self.run_id,
                ttl=self.runner.lease_ttl,
                forced=step.key in self.forced,
                progress=self.progress,
            )
        except Exception as e:  # storage errors: report against the step, keep the run going
            return self._failed(step, out, e, None, 0.0)
        if decided is not None:
            self.progress.finished(decided)
            return decided
        assert lease is not None
        with self._lock:
            self._leases[step.key] = lease
        storage = storage_for(out)
        record = step_record(
            step, out, run_id=self.run_id, owner=lease.owner, env=self.env, secrets=self.secrets
        )
        t0 = time.time()
        outcome: StepOutcome | None = None
        attempt = out
        with self._lock:
            self._running[step.key] = (step, lease, record, t0)
        try:
            check_own_folder(step, out, forced=step.key in self.forced, progress=self.progress)
            previous = read_step_record(out, storage=storage) or {}
            published = step_status(out, storage=storage)
            if (
                published is not None
                and published.state is StepState.SUCCESS
                and published.key == step.key
                and previous.get("state") == "SUCCESS"
            ):
                # A forced rerun over a published output: if it fails, that output stays and is said to.
                with self._lock:
                    self._published[step.key] = (published, previous)
            record_lost_attempt(out, storage=storage)
            attempt = attempt_folder(
                step, out, lease.owner, previous, forced=step.key in self.forced, progress=self.progress
            )
            record["attempt_path"] = attempt
            write_step_record(out, record, storage=storage)
            reserve_disk(out)
            write_step_status(
                out, StepState.RUNNING, key=step.key, name=step.name, owner=lease.owner, storage=storage
            )
            config = resolve_config(
                step.handle.config, lambda h: self.paths.get(h.key) or h.output_path(self.prefix)
            )
            check_input_paths(step, self.paths, self.prefix)
            record["inputs"] = [{**i, "owner": self._input_owner(i["key"])} for i in record["inputs"]]
            where = "cluster" if step.handle.resources is not None else "in process"
            self.progress.started(step, out, where)
            try:
                value = self._call(step, config, out, attempt)
            finally:
                self._record_starts(step, record, attempt)
            if not lease.still_held():
                raise LeaseLostError(self._lost_message(step, lease))
            result = self._recordable(step, rebase_paths(value, attempt, out))
            free_reserve(out)  # before the swap: never copied, and the end's records get its space
            record.update(state="SUCCESS", ended=time.time(), duration_s=time.time() - t0, result=result)
            fn_sha = record.get("fn_source_sha256") or ""
            if not publish(
                out,
                attempt,
                lambda folder: record_end(step, folder, record, lease, StepState.SUCCESS, fn_sha=fn_sha),
                lease.still_held,
            ):
                raise LeaseLostError(self._lost_message(step, lease))
            outcome = StepOutcome(
                step.name, step.key, out, "succeeded", duration_s=time.time() - t0, _result=result
            )
        except KeyboardInterrupt:  # raised inside an in-process step: the run stops here, recorded as such
            self._stopped.append(self._record_interrupted(step, lease, record, t0))
            outcome = StepOutcome(step.name, step.key, out, "interrupted", duration_s=time.time() - t0)
            raise
        except BaseException as e:  # noqa: BLE001 - every failure is recorded, then re-raised if fatal
            if not step.handle.resumable and attempt != out and held_now(lease):
                # Still ours: a rerun starts from nothing anyway. Its files are kept aside for debugging
                # (the latest few), except after a full disk, which gets its space back first.
                with contextlib.suppress(Exception):
                    if is_disk_full(e):
                        remove_tree(attempt)
                    else:
                        record["failed_attempt_path"] = keep_failed_attempt(out, attempt, lease.owner)
            outcome = self._failed(step, out, e, (lease, record), t0)
            # sys.exit() inside an in-process step ends that step, as it does in a worker: not the run.
            if not isinstance(e, Exception | SystemExit):
                raise
        finally:
            with self._lock:
                self._leases.pop(step.key, None)
                self._published.pop(step.key, None)
                self._jobs.pop(step.key, None)
                self._running.pop(step.key, None)
                self._lost.discard(step.key)
            free_reserve(out)
            lease.release(checked=outcome is not None and outcome.state == "succeeded")
        assert outcome is not None
        self.progress.finished(outcome)
        return outcome

    def _input_owner(self, key: str) -> str | None:
        """The attempt (status owner) of an input's published output that this step reads."""
        path = self.paths.get(key)
        with contextlib.suppress(Exception):
            st = step_status(path) if path else None
            if st is not None and st.state is StepState.SUCCESS:
                return st.owner
        return None

    def _recordable(self, step: Step, value: Any) -> Any:
        """The step's return value as its record stores it, scrubbed; a `ResultWarning` (also said on the
        console) for NaN and infinities, stored as null, and for a value too large, stored as a note."""
        non_finite: list[str] = []
        result = scrub_any(value, self.secrets, non_finite)
        if non_finite:
            shown = ", ".join(non_finite[:5]) + (
                f" and {len(non_finite) - 5} more" if len(non_finite) > 5 else ""
            )
            self._warn(
                step,
                f"its result holds {len(non_finite)} non-finite number(s) ({shown}), stored as null in its "
                "record (JSON has no NaN or infinity); a NaN result usually means the step diverged",
            )
        size = len(json.dumps(result))
        if size > MAX_RESULT_CHARS:
            result = {"note": f"result too large to record ({size:,} characters as JSON)"}
            self._warn(
                step,
                f"its result is {size:,} characters as JSON, over the {MAX_RESULT_CHARS:,} a record holds: "
                "the record keeps a note (result too large to record) instead; write large values into "
                "the step's output folder and return their path",
            )
        return result

    def _warn(self, step: Step, text: str) -> None:
        self.progress.note(step, text)
        warnings.warn(f"step {step.name!r}: {text}", ResultWarning, stacklevel=2)

    def _record_starts(self, step: Step, record: dict, attempt: str) -> None:
        """Put the starts of the function (see `call_step`) into the record; say so when it started again."""
        with contextlib.suppress(Exception):
            starts = read_starts(attempt)
            record["starts"] = starts
            if len(starts) > 1:
                path = " -> ".join(f"{s['node']} ({s['how'].split(' (')[0]})" for s in starts)
                self.progress.note(step, f"started {len(starts)} times: {path}")

    def _lost_message(self, step: Step, lease: Lease) -> str:
        holder = lease.read()
        return (
            f"step {step.name!r} lost its lease on {self.paths[step.key]} to "
            f"{holder.describe() if holder else 'another runner'} while it ran (this runner stalled past the "
            "lease ttl, e.g. stopped or swapping): this attempt published nothing and its output is discarded"
        )

    def _call(self, step: Step, config: Any, out: str, attempt: str) -> Any:
        """Run the function into `attempt` (its own folder); its job's log goes to `out`'s `.schooner/`."""
        h = step.handle
        if h.resources is None:
            self._orphans.start()  # what the step starts dies with the driver (see `_orphans`)
            with self._lock:
                self._threads[step.key] = threading.get_ident()
            try:
                with scrubbed_output(self.secrets):
                    return call_step(h.fn, config, attempt, h.resumable)
            finally:
                with self._lock:
                    del self._threads[step.key]
                    # A stop that the heartbeat asked for but that was not raised yet never fires later.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
        client = self.runner.client
        if client is None:
            from schooner.cluster._current import current_client

            client = current_client()
        files = imported_afresh(code_files(h.code))  # checked in the worker, which imports them afresh
        job = client.submit(
            call_step, h.fn, config, attempt, h.resumable, files or None, resources=h.resources, name=h.name
        )
        with self._lock:
            self._jobs[step.key] = job
        try:
            value = job.result()
        except BaseException:
            logs = self._save_logs(job, out)
            if logs:
                with self._lock:
                    self._logs[step.key] = logs[-4000:]
            raise
        self._save_logs(job, out)
        return value

    def _save_logs(self, job: JobHandle, out: str) -> str:
        """The job's output, scrubbed, also kept as `{out}/.schooner/job.log` (best effort)."""
        logs = ""
        with contextlib.suppress(Exception):
            logs = scrub(job.logs() or "", self.secrets)
            if logs:
                storage_for(out).write_text(meta_path(out, "job.log"), logs)
        return logs

    def _failed(
        self, step: Step, out: str, err: BaseException, held: tuple[Lease, dict] | None, t0: float
    ) -> StepOutcome:
        tb = err.__traceback__
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _RUNNER_FILES:
            tb = tb.tb_next  # the runner's own frames say nothing about the step's failure
        text = scrub("".join(traceback.format_exception(type(err), err, tb)), self.secrets)
        error_type = type(err).__name__
        if isinstance(err, JobError) and err.remote_traceback:
            # A step run by a worker: its own traceback as the worker formatted it, and its own exception's
            # type; the driver's frames, the cause re-raised and the JobError's message only repeat it.
            text = scrub(err.remote_traceback.rstrip() + "\n", self.secrets)
            error_type = err.cause_type.rsplit(".", 1)[-1] or error_type
        logs = self._logs.get(step.key)
        duration = time.time() - t0 if t0 else None
        if self._interrupted and held is not None:
            # Ctrl-C: `interrupt()` has recorded this step INTERRUPTED; its job's end is no failure.
            return StepOutcome(
                step.name, step.key, out, "interrupted", duration_s=duration, error="interrupted"
            )
        if held is not None and (isinstance(err, LeaseLostError) or not held_now(held[0])):
            # A fenced-off attempt: what the step raised after its lease was taken over (e.g. its attempt
            # folder was removed by the new holder) is not the step's failure.
            error = self._lost_message(step, held[0])
            if not isinstance(err, LeaseLostError):
                cause = scrub(f"{type(err).__name__}: {err}", self.secrets).splitlines()[0][:300]
                error += f" (the step then raised {cause})"
            return StepOutcome(
                step.name,
                step.key,
                out,
                "failed",
                duration_s=duration,
                error=error,
                error_type="LeaseLostError",
            )
        if held is not None:
            lease, record = held
            record.update(
                state="FAILED",
                ended=time.time(),
                duration_s=duration,
                error=text,
                logs_tail=scrub(logs, self.secrets) if logs else None,
            )
            error = scrub(f"{type(err).__name__}: {err}", self.secrets).splitlines()[0][:500]
            kept = record.get("failed_attempt_path")
            with self._lock:
                published = self._published.get(step.key)
            if published is not None:  # notes first: the last line stays the exception (the reason shown)
                text = (
                    f"(the previous output stays published in {out}: its status and record still describe "
                    f"it, run {published[0].owner.split('-')[0]}; this failure is in its history.jsonl)\n{text}"
                )
            if kept:
                text = f"(this attempt's files are kept for debugging in {kept})\n{text}"
                self.progress.note(step, f"failed; its attempt's files are kept for debugging in {kept}")
            for last_try in (False, True):
                try:
                    if lease.still_held():
                        if published is not None:
                            restore_published(step, out, record, published, error)
                        else:
                            record_end(step, out, record, lease, StepState.FAILED, error=error)
                    break
                except OSError as write_err:
                    # A full disk (the step filled it): free the space kept aside, then try once more.
                    if last_try or not free_reserve(out):
                        # The status stays RUNNING with a dead lease: the next run retries the step.
                        self.progress.note(step, f"could not record its failure in {out}: {write_err}")
                        break
        return StepOutcome(
            step.name, step.key, out, "failed", duration_s=duration, error=text, error_type=error_type
        )

    def interrupt(self) -> list[str]:
        """Ctrl-C: record every running step INTERRUPTED, stop its job (the worker and every process it
        started), release its lease. One phrase per step for the one-line message."""
        self._interrupted = True
        with self._lock:
            running = list(self._running.values())
            jobs = dict(self._jobs)
        phrases = list(self._stopped)
        self._orphans.kill()  # the processes in-process steps started
        for step, lease, record, t0 in running:
            job = jobs.get(step.key)
            if job is not None:
                with contextlib.suppress(Exception):
                    job.cancel()
            phrases.append(self._record_interrupted(step, lease, record, t0))
        return phrases

    def _record_interrupted(self, step: Step, lease: Lease, record: dict, t0: float) -> str:
        """Write INTERRUPTED (status, record, history), release the lease; the phrase for the message."""
        out = self.paths[step.key]
        record.update(
            state="INTERRUPTED", ended=time.time(), duration_s=time.time() - t0, error="interrupted"
        )
        with self._lock:
            published = self._published.get(step.key)
        with contextlib.suppress(Exception):  # best effort on the way out: a stale lease says the same
            if lease.still_held():
                if published is not None:
                    restore_published(step, out, record, published, "interrupted", "was interrupted")
                else:
                    record_end(step, out, record, lease, StepState.INTERRUPTED)
            lease.release()
        how = how_it_continues(step, record.get("attempt_path") or out)
        return f"{step.name} after {seconds_text(time.time() - t0)} ({how})"

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            with contextlib.suppress(Exception):  # best effort on the way out
                job.cancel()

    def close(self) -> None:
        self._stop.set()
        self._orphans.stop()
