"""The cluster boundary: a `Client` submits functions as jobs and maps functions over items."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

from ._resources import ResourceConfig

T = TypeVar("T")
R = TypeVar("R")


class JobStatus(enum.Enum):
    """Lifecycle of a job. PENDING and RUNNING are live; the rest are final."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobError(RuntimeError):
    """A job's function raised (or its worker died past its retries).

    `remote_traceback` holds the traceback as formatted where the job ran; it is part of `str(err)`.
    `cause_type` is the qualified name of the remote exception class.
    """

    def __init__(self, job_name: str, message: str, remote_traceback: str = "", cause_type: str = "") -> None:
        self.job_name = job_name
        self.remote_traceback = remote_traceback
        self.cause_type = cause_type
        text = f"job {job_name!r} failed: {message}"
        if remote_traceback:
            text += "\n\nRemote traceback:\n" + remote_traceback.rstrip()
        super().__init__(text)


def error_from_info(job_name: str, info: tuple) -> JobError:
    """A `JobError` from a worker's (type name, message, traceback text, pickled exception or None) tuple; the
    original exception becomes its `__cause__` when it could be sent back."""
    import contextlib
    import pickle

    type_name, message, tb, blob = info
    err = JobError(job_name, f"{type_name}: {message}", tb, cause_type=type_name)
    if blob is not None:
        with contextlib.suppress(Exception):  # the traceback text already carries everything
            err.__cause__ = pickle.loads(blob)
    return err


class WorkerDiedError(JobError):
    """The worker process or node running a job died (SIGKILL, OOM, preemption) more often than allowed."""


class JobCancelledError(JobError):
    """`result()` was asked of a job that was cancelled."""


class ResourcesUnavailableError(ValueError):
    """A job asks for more than the cluster can ever give (e.g. 64 CPUs on a 2-core machine)."""


class EventJobHandle:
    """What `LocalJobHandle` and `RayGangHandle` share: a job finished by a thread of the client, which sets
    `_status`, `_value` or `_error`, then `_done`."""

    name: str
    _status: JobStatus
    _value: Any
    _error: JobError | None
    _done: Any  # threading.Event

    def status(self) -> JobStatus:
        return self._status

    def wait(self, timeout: float | None = None) -> JobStatus:
        self._done.wait(timeout)
        return self._status

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} is still {self._status.value} after {timeout} s")
        if self._status is JobStatus.SUCCEEDED:
            return self._value
        assert self._error is not None
        raise self._error


@runtime_checkable
class JobHandle(Protocol):
    """A submitted job."""

    name: str

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job is final or `timeout` seconds pass; return its status then."""
        ...

    def status(self) -> JobStatus:
        """The job's status now, without blocking."""
        ...

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value; raises `JobError` (with the remote traceback) if it failed,
        `JobCancelledError` if cancelled, `TimeoutError` if not done within `timeout`."""
        ...

    def cancel(self) -> None:
        """Stop the job (kill its worker if it is running). Idempotent."""
        ...

    def logs(self) -> str:
        """What the job printed so far (stdout and stderr), with secret values scrubbed."""
        ...


@runtime_checkable
class Client(Protocol):
    """Runs functions somewhere: worker processes on this machine, or a Ray cluster."""

    def submit(
        self,
        fn: Callable[..., R],
        *args: Any,
        resources: ResourceConfig | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> JobHandle:
        """Start `fn(*args, **kwargs)` as a job with `resources` (default `ResourceConfig.with_cpu()`)."""
        ...

    def map(
        self,
        fn: Callable[[T], R],
        items: Iterable[T],
        *,
        resources: ResourceConfig | None = None,
        max_workers: int | None = None,
        name: str | None = None,
    ) -> Iterator[R]:
        """Apply `fn` to every item in parallel; yield results in the order of `items`.

        A failing item raises `JobError` when its result is reached (after retries per `resources`).
        """
        ...

    def check(self, resources: ResourceConfig, *, what: str = "job") -> None:
        """Raise `ResourcesUnavailableError` (naming `what` and the field) when `resources` can never run
        on this client: the step runner calls it for every step before anything runs."""
        ...

    def shutdown(self) -> None:
        """Release workers and connections. Idempotent."""
        ...
