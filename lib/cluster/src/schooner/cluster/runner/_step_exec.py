"""Running one step: lease, record, the function (here or on the cluster), then SUCCESS or FAILED.

Writers are fenced (see `_publish`): the function writes into a folder of its own attempt, never into the
step's output folder; on success, with the lease still held, the attempt is swapped into place in one
atomic rename, with its SUCCESS status inside. A reader of a step's output thus only ever sees a complete
published attempt, even while `--force` reruns it, and a runner that was stopped past its lease (and lost
it to another) writes only into its own orphaned folder: its heartbeat notices the loss, says so, stops the
step (cancels its job; raises `LeaseLostError` inside an in-process step) and it publishes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
import traceback
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from schooner.cluster._fingerprint import changed_files, code_files
from schooner.cluster._gang import current_gang
from schooner.cluster._secrets import scrub
from schooner.cluster.records import (
    META_DIR,
    StepState,
    append_history,
    meta_path,
    read_step_record,
    record_lost_attempt,
    step_status,
    write_step_record,
    write_step_status,
)
from schooner.cluster.storage import clear_folder, is_plain_path, list_folder, storage_for

from ._lease import Lease
from ._lower import Step
from ._orphans import OrphanGuard
from ._publish import keep_failed_attempt, prepare_attempt, publish, rebase_paths, remove_tree
from ._records import scrub_any, step_record
from ._results import ResultWarning, StepOutcome
from ._scrub_output import scrubbed_output
from ._step import join_path, resolve_config

if TYPE_CHECKING:
    from schooner.cluster._client import Client, JobHandle

    from ._progress import Progress

DISK_RESERVE_BYTES = 256 * 1024
"""Space kept aside in a local step's `.schooner/` while it runs, freed to record its end when the step
filled the disk (a full disk would otherwise leave the status RUNNING, read as INTERRUPTED)."""
DISK_RESERVE = "disk-reserve"

MAX_RESULT_CHARS = 1_000_000
"""A step's return value is stored in its record; larger values are replaced by a note."""


class LeaseLostError(RuntimeError):
    """Another runner took this step's lease over while it ran (this runner looked dead to it): this
    attempt stops and publishes nothing."""


class ForeignOutputError(RuntimeError):
    """A step's output folder holds files that no attempt of this step wrote."""


class MissingInputError(FileNotFoundError):
    """A `handle / "sub/path"` input names a path its step did not write."""


class CodeChangedError(RuntimeError):
    """A source file of a step's code changed after the step's key was computed (edited during the run): the
    worker would run other code than the key names, so the step does not run."""


def call_step(
    fn: Any, config: Any, output_path: str, resumable: bool = False, code_files: dict[str, str] | None = None
) -> Any:
    """What runs on a worker (or in the runner), once per attempt: make the local output folder, empty it
    unless the step is resumable (so a killed attempt's partial output never mixes with this one's), call
    `fn`. The runner's own files (`.schooner/`) stay.

    In a gang (a step with `hosts > 1`), process 0 prepares the folder and the others wait for it, so no
    process writes into a folder that is about to be emptied.

    Every start appends a line to `{output_path}/.schooner/starts.jsonl` (node, host, pid, time) and, when
    the function returns or raises, its end: a start without an end died with its worker or node (a
    preemption), and the runner records all of them in the step's record and history.

    `code_files` (path -> SHA-256 of the user source files the step's key was computed from; given for steps
    that run in a worker, which imports them afresh): a file whose text differs here raises
    `CodeChangedError` before the function runs."""
    changed = changed_files(code_files or {})
    if changed:
        raise CodeChangedError(
            f"{', '.join(changed)} changed after this run computed the step's key (edited during the run?): "
            "the worker would run the new code under a key that names the old one; rerun to key the step by "
            "the code as it is now"
        )
    gang = current_gang()
    if gang is not None and gang.num_processes > 1:
        _gang_prepare(output_path, resumable, gang.process_id, gang.attempt)
    else:
        if not resumable:
            clear_folder(output_path, keep=META_DIR)
        if is_plain_path(output_path) and not os.path.isdir(output_path):
            os.makedirs(output_path, exist_ok=True)
    start = _log_start(output_path, gang.process_id if gang is not None else 0)
    try:
        value = fn(config, output_path)
    except BaseException as e:
        _log_end(output_path, start, f"raised {type(e).__name__}")
        raise
    _log_end(output_path, start, "returned")
    return value


STARTS = "starts.jsonl"


def _node_name() -> str:
    """The Ray node this runs on (its `--node-name`), else the host name."""
    import socket
    import sys

    ray = sys.modules.get("ray")
    with contextlib.suppress(Exception):
        if ray is not None and ray.is_initialized():
            me = ray.get_runtime_context().get_node_id()
            return str(next(n["NodeName"] for n in ray.nodes() if n["NodeID"] == me))
    return socket.gethostname()


def _log_start(output_path: str, process: int) -> str:
    """Append this start to the attempt's `starts.jsonl` (best effort: it is a record, not a requirement)."""
    import json
    import socket

    start = uuid.uuid4().hex[:12]
    line = {"start": start, "node": _node_name(), "host": socket.gethostname(), "pid": os.getpid()}
    line.update(process=process, started=time.time())
    _append_line(output_path, json.dumps(line), make=True)
    return start


def _log_end(output_path: str, start: str, how: str) -> None:
    import json

    _append_line(output_path, json.dumps({"start": start, "ended": time.time(), "how": how}))


def _append_line(output_path: str, line: str, make: bool = False) -> None:
    """`make`: create the folder if needed (never for an end: a fenced-off attempt's folder may be gone)."""
    with contextlib.suppress(Exception):
        if is_plain_path(output_path):
            if make:
                os.makedirs(os.path.join(output_path, META_DIR), exist_ok=True)
            with open(meta_path(output_path, STARTS), "a") as f:
                f.write(line + "\n")
            return
        storage = storage_for(output_path)
        path = meta_path(output_path, STARTS)
        storage.write_text(path, (storage.read_text(path) or "") + line + "\n")


def read_starts(attempt: str) -> list[dict[str, Any]]:
    """The starts of an attempt's function, oldest first: node, host, pid, process, started, and ended with
    `how` ('returned', 'raised X') or, for a start that never ended (its worker or node died), `how`
    'died (worker or node lost)' and `ended` None."""
    import json

    text = storage_for(attempt).read_text(meta_path(attempt, STARTS)) or ""
    starts: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            d = json.loads(raw)
            if "node" in d:
                starts[d["start"]] = {**d, "ended": None, "how": "died (worker or node lost)"}
            elif d["start"] in starts:
                starts[d["start"]].update(ended=d["ended"], how=d["how"])
    return sorted(starts.values(), key=lambda d: d["started"])


GANG_READY_TIMEOUT_S = 600.0


def _gang_prepare(output_path: str, resumable: bool, process_id: int, attempt: str) -> None:
    storage = storage_for(output_path)
    marker = meta_path(output_path, f"gang-{attempt}.ready")
    if process_id == 0:
        if not resumable:
            clear_folder(output_path, keep=META_DIR)
        for old in storage.glob(meta_path(output_path, "gang-*.ready")):
            storage.remove(old)
        storage.makedirs(output_path)
        storage.write_text(marker, attempt)
        return
    deadline = time.monotonic() + GANG_READY_TIMEOUT_S
    while not storage.exists(marker):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gang process {process_id}: process 0 did not prepare {output_path} within "
                f"{GANG_READY_TIMEOUT_S:g} s (is the prefix shared by every host?)"
            )
        time.sleep(0.05)


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

    def _acquire(self, step: Step, out: str) -> tuple[Lease | None, StepOutcome | None]:
        """Take the lease, or return the outcome decided by another runner (done or failed)."""
        storage = storage_for(out)
        lease = Lease(
            storage,
            out,
            owner=f"{self.run_id}-{uuid.uuid4().hex[:8]}",
            run_id=self.run_id,
            ttl=self.runner.lease_ttl,
        )
        waited_for = None
        delay = 0.05
        forced = step.key in self.forced
        first = True
        while True:
            # The plan has just read the status; later rounds (after waiting) read it again.
            st = None if first else step_status(out, storage=storage)
            if st is not None and st.state is StepState.SUCCESS and (not forced or waited_for is not None):
                note = f"finished by run {st.owner.split('-')[0]}" if waited_for else ""
                return None, StepOutcome(step.name, step.key, out, "cached", note=note)
            if (
                waited_for is not None
                and st is not None
                and st.state is StepState.FAILED
                and st.owner == waited_for.owner
            ):
                return None, StepOutcome(
                    step.name,
                    step.key,
                    out,
                    "failed",
                    error_type="ConcurrentRunFailed",
                    error=f"failed in concurrent run {waited_for.run_id}: {st.error}",
                )
            if first:
                storage.makedirs(join_path(out, META_DIR))  # also makes `out`
                first = False
            acquired, holder = lease.try_acquire()
            if acquired:
                st = step_status(out, storage=storage)  # finished while we were acquiring?
                if (
                    st is not None
                    and st.state is StepState.SUCCESS
                    and (not forced or waited_for is not None)
                ):
                    lease.release()
                    continue
                if lease.took_over:
                    self.progress.took_over(step)
                return lease, None
            if holder is not None and (waited_for is None or holder.owner != waited_for.owner):
                waited_for = holder
                self.progress.waiting(step, holder.describe())
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    # -- one step ----------------------------------------------------------------------------------------
    def execute(self, step: Step) -> StepOutcome:
        out = self.paths[step.key]
        try:
            lease, decided = self._acquire(step, out)
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
            self._prepare_folder(step, out)
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
            attempt = self._prepare_attempt(step, out, lease, previous)
            record["attempt_path"] = attempt
            write_step_record(out, record, storage=storage)
            _reserve_disk(out)
            write_step_status(
                out, StepState.RUNNING, key=step.key, name=step.name, owner=lease.owner, storage=storage
            )
            config = resolve_config(
                step.handle.config, lambda h: self.paths.get(h.key) or h.output_path(self.prefix)
            )
            self._check_input_paths(step)
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
            _free_reserve(out)  # before the swap: never copied, and the end's records get its space
            record.update(state="SUCCESS", ended=time.time(), duration_s=time.time() - t0, result=result)
            fn_sha = record.get("fn_source_sha256") or ""
            if not publish(
                out,
                attempt,
                lambda folder: _record_end(step, folder, record, lease, StepState.SUCCESS, fn_sha=fn_sha),
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
            if not step.handle.resumable and attempt != out and _held_now(lease):
                # Still ours: a rerun starts from nothing anyway. Its files are kept aside for debugging
                # (the latest few), except after a full disk, which gets its space back first.
                with contextlib.suppress(Exception):
                    if _is_disk_full(e):
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
            _free_reserve(out)
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

    def _prepare_folder(self, step: Step, out: str) -> None:
        """Refuse a folder holding files this step did not write.

        Publishing an attempt replaces the whole output folder (and deletes the version it replaces): that
        must never delete data that is not the step's own (an `override_output_path` pointing at a user's
        folder).
        """
        storage = storage_for(out)
        forced = step.key in self.forced
        others = [e for e in list_folder(out) if e != META_DIR]
        if not others:
            return
        rec = read_step_record(out, storage=storage)
        if rec is None or rec.get("key") != step.key:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise ForeignOutputError(
                f"step {step.name!r}: its output folder {out} holds files it did not write ({shown}); "
                "the runner empties a step's folder before each attempt, so it will not run there: "
                "remove those files or give the step another override_output_path"
            )
        if forced:
            self.progress.note(
                step,
                f"--force: reruns from an empty folder; the {len(others)} entries of {out} stay readable until "
                "the new output replaces them whole",
            )

    def _prepare_attempt(self, step: Step, out: str, lease: Lease, previous: dict) -> str:
        """This attempt's own folder (see `_publish`); a resumable step adopts the one a dead attempt left.

        A resumable step whose partial output sits in the output folder itself (written before attempt
        folders existed) gets it moved into its attempt folder.
        """
        resume = step.handle.resumable and step.key not in self.forced
        attempt, adopted = prepare_attempt(
            out, lease.owner, adopt=previous.get("attempt_path"), resume=resume
        )
        if adopted:
            self.progress.note(step, f"resumes the partial output of an earlier attempt ({adopted})")
        elif resume and previous.get("state") != "SUCCESS" and is_plain_path(out):
            legacy = [e for e in list_folder(out) if e != META_DIR]
            for name in legacy:
                os.rename(os.path.join(out, name), os.path.join(attempt, name))
            if legacy:
                self.progress.note(step, f"resumes the partial output left in {out}")
        return attempt

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

    def _check_input_paths(self, step: Step) -> None:
        """Every `handle / "sub"` input must exist once its step is done: catch typos before running."""
        for field_path, ref in step.handle.input_paths():
            if not ref.path:
                continue
            base = self.paths.get(ref.step.key) or ref.step.output_path(self.prefix)
            path = join_path(base, ref.path)
            if not storage_for(path).exists(path):
                raise MissingInputError(
                    f"step {step.name!r}: config field {field_path!r} names {path}, which step "
                    f"{ref.step.name!r} did not write; check the sub path {ref.path!r} in `handle / {ref.path!r}`"
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
        files = _imported_afresh(code_files(h.code))  # checked in the worker, which imports them afresh
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
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the runner's own frames say nothing about the step's failure
        text = scrub("".join(traceback.format_exception(type(err), err, tb)), self.secrets)
        logs = self._logs.get(step.key)
        duration = time.time() - t0 if t0 else None
        if self._interrupted and held is not None:
            # Ctrl-C: `interrupt()` has recorded this step INTERRUPTED; its job's end is no failure.
            return StepOutcome(
                step.name, step.key, out, "interrupted", duration_s=duration, error="interrupted"
            )
        if held is not None and (isinstance(err, LeaseLostError) or not _held_now(held[0])):
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
                            _restore_published(step, out, record, published, error)
                        else:
                            _record_end(step, out, record, lease, StepState.FAILED, error=error)
                    break
                except OSError as write_err:
                    # A full disk (the step filled it): free the space kept aside, then try once more.
                    if last_try or not _free_reserve(out):
                        # The status stays RUNNING with a dead lease: the next run retries the step.
                        self.progress.note(step, f"could not record its failure in {out}: {write_err}")
                        break
        return StepOutcome(
            step.name, step.key, out, "failed", duration_s=duration, error=text, error_type=type(err).__name__
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
                    _restore_published(step, out, record, published, "interrupted", "was interrupted")
                else:
                    _record_end(step, out, record, lease, StepState.INTERRUPTED)
            lease.release()
        how = _how_it_continues(step, record.get("attempt_path") or out)
        return f"{step.name} after {_seconds(time.time() - t0)} ({how})"

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            with contextlib.suppress(Exception):  # best effort on the way out
                job.cancel()

    def close(self) -> None:
        self._stop.set()
        self._orphans.stop()


def _imported_afresh(files: dict[str, str]) -> dict[str, str]:
    """The files of `files` a worker imports afresh: not the script run as `__main__` nor modules shipped by
    value (their code travels from this process, as the key saw it)."""
    import sys

    from schooner.cluster._worker_pickle import needs_by_value

    if not files:
        return files
    by_value = set()
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and os.path.abspath(path) in files:
            with contextlib.suppress(Exception):
                if getattr(mod, "__name__", "") == "__main__" or needs_by_value(mod):
                    by_value.add(os.path.abspath(path))
    return {p: d for p, d in files.items() if p not in by_value}


def _record_end(
    step: Step, out: str, record: dict, lease: Lease, state: StepState, *, error: str = "", fn_sha: str = ""
) -> None:
    """The end of an attempt, in order: its record, its line in the history, then the status (last)."""
    storage = storage_for(out)
    write_step_record(out, record, storage=storage)
    append_history(out, record, storage=storage)
    write_step_status(
        out,
        state,
        key=step.key,
        name=step.name,
        owner=lease.owner,
        error=error,
        fn_sha=fn_sha,
        storage=storage,
    )


def _restore_published(
    step: Step, out: str, record: dict, published: tuple[Any, dict], error: str, state: str = "failed"
) -> None:
    """A forced rerun over a published output failed (or was interrupted): the output is the old one, so its
    record and status go back to it (the record saying which rerun failed), the attempt goes to history."""
    status, previous = published
    storage = storage_for(out)
    append_history(out, record, storage=storage)
    note = (
        f"a forced rerun {state} (run {record.get('run_id')}): {error}; this output was published before it"
    )
    restored = {
        **previous,
        "last_failed_attempt": {
            "run_id": record.get("run_id"),
            "owner": record.get("owner"),
            "state": record.get("state"),
            "ended": record.get("ended"),
            "error": error,
            "failed_attempt_path": record.get("failed_attempt_path"),
        },
    }
    write_step_record(out, restored, storage=storage)
    write_step_status(
        out,
        StepState.SUCCESS,
        key=step.key,
        name=step.name,
        owner=status.owner,
        error=note[:500],
        fn_sha=status.fn_sha,
        storage=storage,
    )


def _is_disk_full(err: BaseException) -> bool:
    import errno

    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


def _held_now(lease: Lease) -> bool:
    """Whether the lease is still ours; True when the lease file cannot be read (a storage error is not a
    lost lease: the status write that follows is checked again)."""
    try:
        return lease.still_held()
    except Exception:  # noqa: BLE001 - OSError or a store client's own exception type
        return True


def _reserve_disk(out: str) -> None:
    """Keep `DISK_RESERVE_BYTES` aside in a local step's `.schooner/` (best effort: a disk already this full
    fails the step's own writes soon enough)."""
    if not is_plain_path(out):
        return
    with contextlib.suppress(OSError), open(meta_path(out, DISK_RESERVE), "wb") as f:
        f.write(b"\0" * DISK_RESERVE_BYTES)
        f.flush()
        os.fsync(f.fileno())


def _free_reserve(out: str) -> bool:
    """Delete the space kept aside; True when there was some."""
    if not is_plain_path(out):
        return False
    try:
        os.unlink(meta_path(out, DISK_RESERVE))
    except OSError:
        return False
    return True


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60)} s"


def _how_it_continues(step: Step, out: str) -> str:
    """'a rerun resumes it from checkpoint step-000040' / 'a rerun starts it again'. `out`: the attempt's
    folder (what the hint reads)."""
    h = step.handle
    if not h.resumable:
        return "a rerun starts it again from an empty folder"
    hint = None
    if h.resume_hint is not None:
        with contextlib.suppress(Exception):  # a hint must never hide the interrupt itself
            hint = h.resume_hint(out)
    return f"a rerun resumes it {hint}" if hint else "a rerun resumes it from its partial output"
