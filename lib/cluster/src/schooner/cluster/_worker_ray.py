"""What runs inside a Ray worker for `RayClient`: the job with its output captured and scrubbed, and map batches.

Kept free of ray imports (and importable on its own) so it pickles by reference and loads fast in workers.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._secrets import scrub, secret_values
from ._worker import _call_with_retries, _Env

_LOG_CAP = 16 * 2**20


class RemoteFailure(Exception):
    """The job's function raised; carries its `error_info` tuple and the job's (scrubbed) output."""

    def __init__(self, info: tuple, logs: str) -> None:
        super().__init__(info, logs)
        self.info = info
        self.logs = logs

    def __str__(self) -> str:
        return f"{self.info[0]}: {self.info[1]}"


@contextlib.contextmanager
def _captured_output() -> Iterator[Callable[[], str]]:
    """Send fds 1 and 2 to a file for the job; copy it, scrubbed, to the worker's own output as it grows (Ray
    streams that to the driver), and yield a function returning everything captured so far."""
    secrets = secret_values()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd, path = tempfile.mkstemp(prefix="schooner-ray-job-", suffix=".log")
    os.unlink(path)  # read through `fd` only: nothing is left behind even when the worker is killed
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    stop = threading.Event()
    pos = [0]

    def pump(final: bool = False) -> None:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - pos[0], pos[0]) if size > pos[0] else b""
        cut = len(data) if final else data.rfind(b"\n") + 1
        if cut:
            os.write(saved[0], scrub(data[:cut].decode("utf-8", "replace"), secrets).encode())
            pos[0] += cut

    def loop() -> None:
        while not stop.wait(0.2):
            pump()

    tail = threading.Thread(target=loop, daemon=True)
    tail.start()

    def text() -> str:
        size = os.fstat(fd).st_size
        start = max(0, size - _LOG_CAP)
        return scrub(os.pread(fd, size - start, start).decode("utf-8", "replace"), secrets)

    try:
        yield text
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        stop.set()
        tail.join()
        pump(final=True)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        os.close(fd)


def run_job(
    fn: Callable[..., Any], args: tuple, kwargs: dict, secret_env: dict[str, str], retries: int = 0
) -> tuple[Any, str]:
    """Run one job, rerunning it here up to `retries` times when it raises (exactly as the LocalClient's
    worker does: Ray itself retries only a worker's death); return (value, logs) or raise `RemoteFailure`."""
    with _Env(secret_env), _captured_output() as logs:
        status, value = _call_with_retries(fn, args, kwargs, retries)
        failure = RemoteFailure(value, "") if status != "ok" else None
        out = logs()
    if failure is not None:
        failure.logs = out
        failure.args = (failure.info, out)
        raise failure
    return value, out


def run_batch(
    fn: Callable[[Any], Any], items: list, secret_env: dict[str, str], retries: int
) -> tuple[list, float]:
    """Run a map batch; per item ("ok", value) or ("err", error_info), and the seconds it took."""
    start = time.perf_counter()
    with _Env(secret_env), _captured_output():  # output reaches Ray's logs scrubbed, like a job's
        out = [_call_with_retries(fn, (item,), {}, retries) for item in items]
    return out, time.perf_counter() - start
