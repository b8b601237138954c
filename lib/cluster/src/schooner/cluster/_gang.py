"""Gangs: one job run as `ResourceConfig.hosts` processes, one per host, started together or not at all.

Multi-host training needs N processes that start together and know each other: each calls
`jax.distributed.initialize(coordinator, num_processes, process_id)`. A client runs a job with `hosts=N`
as such a gang, each process with its place in the environment (`current_gang()` reads it):

    SCHOONER_PROCESS_ID      0 .. N-1
    SCHOONER_NUM_PROCESSES   N
    SCHOONER_COORDINATOR     host:port of process 0's coordinator service
    SCHOONER_GANG_ATTEMPT    an id of this start of the gang (a restart gets a new one)

If any process fails or dies, the client kills the others at once (none is left blocked in a collective)
and restarts the whole gang, within the job's retries; the job's value is process 0's return value.

`LocalClient` runs a gang as fresh child processes of one worker (CPU jobs); `RayClient` as one task per
bundle of a placement group spread over distinct nodes (`STRICT_SPREAD`), each in a fresh worker process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROCESS_ID_ENV = "SCHOONER_PROCESS_ID"
NUM_PROCESSES_ENV = "SCHOONER_NUM_PROCESSES"
COORDINATOR_ENV = "SCHOONER_COORDINATOR"
ATTEMPT_ENV = "SCHOONER_GANG_ATTEMPT"


@dataclass(frozen=True)
class GangInfo:
    """This process's place in its gang."""

    process_id: int
    num_processes: int
    coordinator: str
    """`host:port` where process 0 serves the coordination service (e.g. for `jax.distributed`)."""
    attempt: str
    """An id of this start of the gang: the same in every process of it, new on a restart."""

    def env(self) -> dict[str, str]:
        return {
            PROCESS_ID_ENV: str(self.process_id),
            NUM_PROCESSES_ENV: str(self.num_processes),
            COORDINATOR_ENV: self.coordinator,
            ATTEMPT_ENV: self.attempt,
        }


def current_gang() -> GangInfo | None:
    """This process's place in a gang (a job with `ResourceConfig(hosts=N)`, N > 1), or None.

    Example:
        >>> current_gang() is None   # not inside a gang here
        True
    """
    if NUM_PROCESSES_ENV not in os.environ:
        return None
    return GangInfo(
        int(os.environ[PROCESS_ID_ENV]),
        int(os.environ[NUM_PROCESSES_ENV]),
        os.environ[COORDINATOR_ENV],
        os.environ.get(ATTEMPT_ENV, ""),
    )


def coordinator_address() -> str:
    """`host:port` for a gang's coordinator, run on the host of process 0: this host's outward address and
    a free port (no ray import: it runs inside a Ray task as well)."""
    import socket

    host = "127.0.0.1"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outward interface
        host = str(s.getsockname()[0])
    return f"{host}:{free_port()}"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class GangMemberFailed(RuntimeError):
    """A process of a gang raised; the others were stopped."""


class GangMemberDied(GangMemberFailed):
    """A process of a gang died (killed, OOM); the others were stopped."""


def run_local_gang(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    hosts: int,
    retries_failure: int = 0,
    retries_preemption: int = 0,
) -> Any:
    """Run `fn(*args, **kwargs)` as `hosts` fresh processes on this machine (what a LocalClient job with
    `hosts > 1` runs in its worker). Returns process 0's value. The first failure stops the others; the
    gang restarts whole, up to `retries_failure` times after a raise and `retries_preemption` times after a
    process died; then the last error is raised with that process's traceback."""
    import shutil

    import cloudpickle

    folder = tempfile.mkdtemp(prefix="schooner-gang-")
    payload = os.path.join(folder, "payload.pkl")
    with open(payload, "wb") as f:
        cloudpickle.dump((fn, args, kwargs), f)
    failures = deaths = 0
    try:
        while True:
            attempt = os.path.join(folder, uuid.uuid4().hex[:12])
            os.makedirs(attempt)
            try:
                return _supervise(_start_members(payload, attempt, hosts), attempt)
            except GangMemberDied as e:
                deaths += 1
                if deaths > retries_preemption:
                    raise
                print(f"[schooner] {e}; restarting the gang ({deaths}/{retries_preemption})", flush=True)
            except GangMemberFailed as e:
                failures += 1
                if failures > retries_failure:
                    raise
                print(f"[schooner] {e.args[0].splitlines()[0]}; restarting the gang", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _start_members(payload: str, folder: str, hosts: int) -> list[subprocess.Popen]:
    gang = GangInfo(0, hosts, f"127.0.0.1:{free_port()}", os.path.basename(folder))
    code = "import sys; from schooner.cluster._gang import member_main; member_main(sys.argv[1], sys.argv[2])"
    procs = []
    for i in range(hosts):
        env = {**os.environ, **GangInfo(i, hosts, gang.coordinator, gang.attempt).env()}
        out = os.path.join(folder, f"result-{i}.pkl")
        procs.append(subprocess.Popen([sys.executable, "-c", code, payload, out], env=env))
    return procs


def _supervise(procs: list[subprocess.Popen], folder: str) -> Any:
    """Wait for every member; on the first failure kill the rest and raise its error."""
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                path = os.path.join(folder, f"result-{i}.pkl")
                error = GangMemberFailed if os.path.exists(path) else GangMemberDied
                code = codes[i]
                assert code is not None  # `failed` holds only members that exited
                raise error(_failure_text(i, code, path))
            if all(c == 0 for c in codes):
                return _read_result(os.path.join(folder, "result-0.pkl"))[1]
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


def _read_result(path: str) -> tuple[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)


def _failure_text(i: int, code: int, path: str) -> str:
    if os.path.exists(path):
        _status, info = _read_result(path)
        return f"gang process {i} raised {info[0]}: {info[1]}\n{info[2]}"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"gang process {i} was killed by {signal.Signals(-code).name}; the others were stopped"
    return f"gang process {i} exited with status {code}; the others were stopped"


def member_main(payload: str, out: str) -> None:
    """One process of a local gang: run the job, leave ('ok', value) or ('err', error info) in `out`."""
    import cloudpickle

    from ._worker import error_info

    with open(payload, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    try:
        result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor
        result, code = ("err", error_info(exc)), 1
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        try:
            cloudpickle.dump(result, f)
        except Exception as exc:  # noqa: BLE001 - an unpicklable value is the job's error
            f.seek(0)
            f.truncate()
            cloudpickle.dump(("err", error_info(TypeError(f"result is not picklable: {exc}"))), f)
            code = 1
    os.replace(tmp, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: collectives' threads must not hold the exit
