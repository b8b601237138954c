"""`LocalClient`: the embedded default. Jobs run in warm worker processes on this machine; nothing to start.

Example:
    >>> from schooner.cluster import LocalClient, ResourceConfig
    >>> client = LocalClient()
    >>> client.submit(pow, 2, 10, resources=ResourceConfig.with_cpu()).result()
    1024
    >>> list(client.map(abs, [-1, -2, 3]))
    [1, 2, 3]
    >>> client.shutdown()
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._client import EventJobHandle, JobCancelledError, JobError, JobStatus, WorkerDiedError, error_from_info
from ._local_machine import detect_machine
from ._local_map import local_map
from ._pool import Pool, Reservation, Waiter, WorkerProcess
from ._resources import ResourceConfig
from ._secrets import scrub, secret_values
from ._worker_pickle import dumps

LOCAL_CPUS_ENV = "SCHOONER_LOCAL_CPUS"
"""Set inside each job to the CPUs it reserved, so a `LocalClient` made inside the job stays within them."""

_LOG_CAP = 16 * 2**20  # keep at most the last 16 MiB of a job's log in memory


class LocalJobHandle(EventJobHandle):
    """A job submitted to a `LocalClient` (see `schooner.cluster.JobHandle`)."""

    def __init__(self, client: LocalClient, name: str, resources: ResourceConfig, log_path: str) -> None:
        self.name = name
        self.resources = resources
        self.attempts = 0
        """Times the job was started (1 + retries after worker deaths)."""
        self._client = client
        self._log_path = log_path
        self._log_text: str | None = None
        self._streamed = 0  # bytes of the log already streamed (kept across retries)
        self._over_memory = 0  # resident bytes when it was killed for exceeding its `ram`
        self._caller_env = dict(os.environ)  # the job sees the environment as it was at submit
        self._secrets = sorted(
            set(secret_values()) | set(secret_values(resources.env)), key=len, reverse=True
        )
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._status = JobStatus.PENDING
        self._value: Any = None
        self._error: JobError | None = None
        self._cancelled = False
        self._worker: WorkerProcess | None = None

    def __repr__(self) -> str:
        return f"LocalJobHandle(name={self.name!r}, status={self._status.value})"

    def cancel(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._cancelled = True
            worker = self._worker
        if worker is not None:
            worker.kill()
        self._client._pool.wake()

    def logs(self) -> str:
        if self._log_text is not None:
            return self._log_text
        return scrub(self._read_log(), self._secrets)

    # -- driven by the job's thread ----------------------------------------------------------------------
    def _read_log(self) -> str:
        """The captured output (its last 16 MiB), unscrubbed."""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self._log_path) - _LOG_CAP))
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def _read_log_from(self, offset: int) -> bytes:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return b""

    def _note(self, text: str) -> None:
        """Append a line from the client itself (a retry, a death) to the job's log."""
        with open(self._log_path, "a") as f:
            f.write(f"[schooner] {text}\n")

    def _start(self, worker: WorkerProcess) -> bool:
        with self._lock:
            if self._cancelled:
                return False
            self._worker = worker
            self._status = JobStatus.RUNNING
            self.attempts += 1
            return True

    def _finish(self, status: JobStatus, value: Any = None, error: JobError | None = None) -> None:
        self._log_text = scrub(self._read_log(), self._secrets)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._log_path)
        with self._lock:
            self._worker = None
            self._value, self._error = value, error
            self._status = status
            self._done.set()


class LocalClient:
    """Runs jobs in worker processes on this machine, within its cores and memory.

    Args:
        max_workers: CPUs this client may reserve at once (default: the cores this process may use, or
            the CPUs reserved by the enclosing job when created inside a job).
        memory: bytes (or a size like '8GiB') this client may reserve at once (default: physical memory).
        stream_logs: also print each job's output here as it runs, each line prefixed with `[job name]`.
        enforce_memory: kill a job whose processes hold more resident memory than its `ResourceConfig.ram`
            (checked every 0.2 s; jobs without `ram` are not watched), so one job cannot starve the others.
        oversubscribe: allow `max_workers` above this machine's cores and `memory` above its physical
            memory (for I/O-bound jobs); without it such a client is refused, since it would admit jobs
            that cannot all run at full speed or fit.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        memory: int | str | None = None,
        *,
        stream_logs: bool = False,
        enforce_memory: bool = True,
        oversubscribe: bool = False,
    ):
        machine = detect_machine()
        cpus = machine.cpus
        inherited = os.environ.get(LOCAL_CPUS_ENV)
        if max_workers is None and inherited:
            cpus = min(cpus, max(1.0, math.floor(float(inherited))))
        if max_workers is not None:
            if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
                raise ValueError(f"LocalClient(max_workers=...) must be an integer >= 1, got {max_workers!r}")
            if max_workers > machine.cpus and not oversubscribe:
                raise ValueError(
                    f"LocalClient(max_workers={max_workers}) is more than the {machine.cpus:g} cores this process "
                    "may use; lower it, or pass oversubscribe=True for I/O-bound jobs"
                )
            cpus = float(max_workers)
        mem = machine.memory
        if memory is not None:
            from ._resources import parse_bytes

            try:
                mem = parse_bytes(memory, field_name="memory") or 0
            except ValueError as e:
                raise ValueError(f"LocalClient(memory={memory!r}): {e}") from None
            if mem <= 0:
                raise ValueError(f"LocalClient(memory=...) must be > 0, got {memory!r}")
            if mem > machine.memory and not oversubscribe:
                raise ValueError(
                    f"LocalClient(memory={memory!r}) is more than this machine's {machine.memory / 2**30:.1f} GiB "
                    "of memory; lower it, or pass oversubscribe=True"
                )
        self.machine = dataclasses.replace(machine, cpus=cpus, memory=mem)
        self.stream_logs = stream_logs
        self.enforce_memory = enforce_memory
        self._pool = Pool(self.machine)
        self._logdir: str | None = None
        self._ids = itertools.count()
        self._threads: set[threading.Thread] = set()
        self._closed = False
        _live_clients.add(self)

    def __repr__(self) -> str:
        return f"LocalClient(max_workers={self.machine.cpus:g}, memory={self.machine.memory})"

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def check(self, resources: ResourceConfig, *, what: str = "job") -> None:
        """Raise `ResourcesUnavailableError` when `resources` can never run on this client."""
        self.machine.check(resources, what=what)

    # -- jobs --------------------------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        resources: ResourceConfig | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> LocalJobHandle:
        """Run `fn(*args, **kwargs)` in a worker once `resources` fit; see `schooner.cluster.Client.submit`."""
        if self._closed:
            raise RuntimeError("LocalClient was shut down; create a new client")
        res = resources if resources is not None else ResourceConfig.with_cpu()
        job_id = next(self._ids)
        name = name or f"{getattr(fn, '__name__', 'job')}-{job_id}"
        if res.hosts > 1:  # a gang: its processes run as fresh children of one worker holding all they need
            fn, args, kwargs, res = _as_local_gang(fn, args, kwargs, res, what=f"job {name!r}")
        self.machine.check(res, what=f"job {name!r}")
        try:
            payload = dumps((fn, args, kwargs))  # pickling errors surface here, in the caller
        except Exception as exc:
            raise TypeError(
                f"job {name!r}: cannot send {fn!r} and its arguments to a worker ({exc}); "
                f"use module-level functions and picklable arguments"
            ) from exc
        if self._logdir is None:
            self._logdir = tempfile.mkdtemp(prefix="schooner-local-logs-")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]
        handle = LocalJobHandle(self, name, res, os.path.join(self._logdir, f"{job_id:06d}-{safe}.log"))
        self._pool.add_secrets(handle._secrets)
        place = self._pool.enqueue(res)  # queued here, in the caller, so jobs start in submission order
        t = threading.Thread(
            target=self._drive, args=(handle, payload, place), name=f"schooner-job-{name}", daemon=True
        )
        self._threads.add(t)
        t.start()
        return handle

    def _drive(self, job: LocalJobHandle, payload: bytes, place: Waiter) -> None:
        try:
            held = self._pool.wait_for(place, give_up=lambda: job._cancelled)
            if held is None:
                self._end_unstarted(job)
                return
            try:
                self._attempts(job, payload, held)
            finally:
                self._pool.unreserve(held)
        except BaseException as exc:  # noqa: BLE001 - never leave a handle hanging
            if not job._done.is_set():
                # After shutdown, closing the worker under a running attempt can surface here (a closed file
                # descriptor) before the attempt loop sees the worker die: that is the shutdown, not a bug.
                why = (
                    "LocalClient was shut down while it ran"
                    if self._closed
                    else f"LocalClient internal error: {exc!r}"
                )
                job._finish(JobStatus.FAILED, error=JobError(job.name, why))
        finally:
            self._threads.discard(threading.current_thread())

    def _end_unstarted(self, job: LocalJobHandle) -> None:
        if job._cancelled:
            job._finish(JobStatus.CANCELLED, error=JobCancelledError(job.name, "cancelled before it started"))
        else:
            job._finish(
                JobStatus.FAILED, error=JobError(job.name, "LocalClient was shut down before it started")
            )

    def _attempts(self, job: LocalJobHandle, payload: bytes, held: Reservation) -> None:
        res = job.resources
        env = {LOCAL_CPUS_ENV: f"{max(res.cpu, 1.0):g}"}
        deaths = 0
        while True:
            try:
                worker = self._pool.checkout({**res.env, **held.env()})
            except RuntimeError:
                self._end_unstarted(job)
                return
            if not job._start(worker):
                self._pool.checkin(worker)
                self._end_unstarted(job)
                return
            job_env = {**worker.env_changes(job._caller_env), **env}
            worker.send(("job", job.attempts, payload, job_env, job._log_path, res.max_retries_failure))
            reply = self._await(job, worker)
            if reply is not None:
                self._pool.checkin(worker)
                _, _, status, value = reply
                if status == "ok":
                    try:
                        job._finish(JobStatus.SUCCEEDED, value=pickle.loads(value))
                    except Exception as exc:  # noqa: BLE001
                        job._finish(
                            JobStatus.FAILED,
                            error=JobError(job.name, f"cannot load the job's result: {exc!r}"),
                        )
                else:
                    job._finish(JobStatus.FAILED, error=error_from_info(job.name, value))
                return
            reason = worker.death_reason()
            self._pool.discard(worker)
            if job._over_memory:
                msg = (
                    f"its processes used {job._over_memory / 2**20:.0f} MiB, more than its reservation "
                    f"ram={res.ram} ({(res.ram_bytes or 0) / 2**20:.0f} MiB), and were killed; raise ResourceConfig.ram"
                )
                job._note(msg)
                job._finish(JobStatus.FAILED, error=WorkerDiedError(job.name, msg))
                return
            if job._cancelled:
                job._finish(JobStatus.CANCELLED, error=JobCancelledError(job.name, "cancelled while running"))
                return
            if self._closed:
                job._finish(
                    JobStatus.FAILED, error=JobError(job.name, "LocalClient was shut down while it ran")
                )
                return
            deaths += 1
            if deaths > res.max_retries_preemption:
                msg = (
                    f"its worker (pid {worker.pid}) {reason}; it died {deaths} times "
                    f"(ResourceConfig.max_retries_preemption={res.max_retries_preemption})"
                )
                job._note(msg)
                job._finish(JobStatus.FAILED, error=WorkerDiedError(job.name, msg))
                return
            job._note(f"worker pid {worker.pid} {reason}; retrying ({deaths}/{res.max_retries_preemption})")

    def _await(self, job: LocalJobHandle, worker: WorkerProcess) -> tuple | None:
        """Wait for the worker's reply, streaming the job's log and holding it to its `ram` meanwhile."""
        limit = job.resources.ram_bytes if self.enforce_memory else None
        if not self.stream_logs and not limit:
            reply = worker.recv()
            return reply if isinstance(reply, tuple) else None
        partial = b""
        while True:
            reply = worker.recv(timeout=0.2)
            if reply is False and limit:
                used = _tree_rss(worker.pid)
                if used > limit:
                    job._over_memory = used
                    worker.kill()
            if not self.stream_logs:
                if reply is not False:
                    return reply
                continue
            data = job._read_log_from(job._streamed)
            job._streamed += len(data)
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            if reply is not False and partial:  # the job is over: flush its last, unterminated line
                lines.append(partial)
                partial = b""
            for line in lines:
                text = scrub(line.decode("utf-8", "replace"), job._secrets)
                sys.stdout.write(f"[{job.name}] {text}\n")
            if reply is not False:
                return reply

    # -- map ---------------------------------------------------------------------------------------------
    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        resources: ResourceConfig | None = None,
        max_workers: int | None = None,
        name: str | None = None,
    ) -> Iterator[Any]:
        """Yield `fn(item)` for every item, in order, computed on up to `max_workers` workers (default: as many
        as `resources` per worker fit in this client). A failing item raises `JobError` when reached."""
        if self._closed:
            raise RuntimeError("LocalClient was shut down; create a new client")
        res = resources if resources is not None else ResourceConfig.with_cpu()
        label = name or str(getattr(fn, "__name__", "map"))
        if res.hosts > 1:
            raise ValueError(f"map {label!r}: hosts={res.hosts} makes a gang, which is one job: use submit()")
        self.machine.check(res, what=f"map {label!r} (per worker)")
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
        ):
            raise ValueError(f"map(max_workers=...) must be an integer >= 1, got {max_workers!r}")
        fit = math.floor(self.machine.cpus / res.cpu + 1e-9) if res.cpu > 0 else math.ceil(self.machine.cpus)
        if res.ram_bytes:
            fit = min(fit, self.machine.memory // res.ram_bytes)
        workers = max(1, min(fit, max_workers or fit))
        if secret_values(res.env):
            self._pool.add_secrets(secret_values(res.env))
        env = {LOCAL_CPUS_ENV: f"{max(res.cpu, 1.0):g}"}
        return local_map(self._pool, fn, items, res, workers, label, env, dict(os.environ))

    # -- lifecycle ---------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the workers (killing running jobs) and delete captured log files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown()
        for t in list(self._threads):
            t.join(timeout=10)
        if self._logdir is not None:
            shutil.rmtree(self._logdir, ignore_errors=True)
        _live_clients.discard(self)


def _as_local_gang(
    fn: Callable[..., Any], args: tuple, kwargs: dict, res: ResourceConfig, *, what: str
) -> tuple[Callable[..., Any], tuple, dict, ResourceConfig]:
    """A gang job as one job: `run_local_gang` in a worker that reserves the CPUs and memory of every process
    (restarts of the gang happen inside it, within the job's retry budgets)."""
    from ._client import ResourcesUnavailableError
    from ._gang import run_local_gang

    if res.device != "cpu":
        raise ResourcesUnavailableError(
            f"{what} asks for a gang of hosts={res.hosts} with device={res.device!r}: the LocalClient runs "
            "gangs of CPU processes on this machine only; use a RayClient for accelerator gangs"
        )
    whole = res.replace(
        cpu=res.cpu * res.hosts,
        ram=None if res.ram_bytes is None else res.ram_bytes * res.hosts,
        hosts=1,
        max_retries_failure=0,
    )
    gang_args = (fn, args, kwargs, res.hosts, res.max_retries_failure, res.max_retries_preemption)
    return run_local_gang, gang_args, {}, whole


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


_live_clients: weakref.WeakSet[LocalClient] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for client in list(_live_clients):
        client.shutdown()
