"""Warm worker processes for `LocalClient`, and admission of jobs by the CPUs, memory and devices they reserve.

Workers are separate interpreters (`python _worker.py`), each in its own session, talking over a socket,
so a crash or `kill -9` of a worker never takes the caller down, and `cancel()` can kill a worker with
everything it started. Their stdout/stderr is relayed line by line to this process's `sys.stdout` /
`sys.stderr` with secret values scrubbed (so worker output also shows in notebooks and pytest capture).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Literal

from . import _worker
from ._local_machine import Machine, gpu_matches
from ._resources import ResourceConfig
from ._secrets import scrub, secret_values

WORKER_FILE = _worker.__file__


class WorkerProcess:
    """One warm worker: a child interpreter running `_worker.main`, and our end of its socket."""

    def __init__(self, relay: _Relay, env: dict[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair()
        self.env = env or {}
        self.base_env = {**os.environ, **self.env}  # the environment it started with
        self.proc = subprocess.Popen(
            [sys.executable, "-u", WORKER_FILE, str(theirs.fileno()), str(os.getpid())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: cancel kills what the job started too
            env=self.base_env,
        )
        theirs.close()
        self.sock = ours
        self.pid = self.proc.pid
        self.map_fns: set[str] = set()  # map functions this worker already holds
        self.dead = False
        assert self.proc.stdout is not None and self.proc.stderr is not None  # PIPE
        relay.add(self.proc.stdout, "stdout")
        relay.add(self.proc.stderr, "stderr")
        self.send(("init", list(sys.path)))

    def fileno(self) -> int:
        return self.sock.fileno()

    def env_changes(self, caller_env: dict[str, str]) -> dict[str, str | None]:
        """What to set (None: unset) so the worker sees `caller_env`, the caller's environment when it submitted
        the work, plus the variables the worker was started with for its job (those win)."""
        changes: dict[str, str | None] = {
            k: v for k, v in caller_env.items() if k not in self.env and self.base_env.get(k) != v
        }
        changes.update({k: None for k in self.base_env if k not in caller_env and k not in self.env})
        return changes

    def send(self, msg: tuple) -> bool:
        """Send a frame; False when the worker is gone."""
        try:
            _worker.send_frame(self.sock, msg)
            return True
        except OSError:
            return False

    def recv(self, timeout: float | None = None) -> tuple | None | Literal[False]:
        """The next reply; None when the worker died; False when `timeout` passed first.

        A worker's death closes its socket, unless a process it started still holds it (a job that forks
        or leaves background processes): so the wait also checks, every second, whether the worker exited.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            if _readable(self.sock, left):
                break
            if self.exited_silently():
                self.dead = True
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return False
        msg = _worker.recv_frame(self.sock)
        if msg is None:
            self.dead = True
        return msg

    def exited_silently(self) -> bool:
        """The worker's process is gone and left nothing to read (its socket may still be open elsewhere)."""
        return self.proc.poll() is not None and not _readable(self.sock, 0)

    def death_reason(self) -> str:
        """How the worker ended, e.g. 'killed by SIGKILL' (waits briefly for its exit status)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (the worker and anything its job started)."""
        self.dead = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def close(self, grace: float = 1.0) -> None:
        """Ask the worker to exit; kill it if it has not after `grace` seconds."""
        if not self.dead:
            self.send(("exit",))
        self.dead = True
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.sock.close()


def _readable(sock: socket.socket, timeout: float) -> bool:
    sel = selectors.DefaultSelector()
    try:
        sel.register(sock, selectors.EVENT_READ)
        return bool(sel.select(timeout))
    finally:
        sel.close()


class _Relay:
    """One thread copying every worker's stdout/stderr, line by line and scrubbed, to ours."""

    def __init__(self, extra_secrets: Callable[[], list[str]]) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: list[tuple[IO[bytes], str]] = []
        self._lock = threading.Lock()
        self._extra_secrets = extra_secrets
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="schooner-local-relay", daemon=True)
        self._thread.start()

    def add(self, stream: IO[bytes], which: str) -> None:
        with self._lock:
            self._pending.append((stream, which))
        os.write(self._wake_w, b"x")

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)

    def _emit(self, which: str, data: bytes) -> None:
        text = scrub(data.decode("utf-8", "replace"), secret_values() + self._extra_secrets())
        target = getattr(sys, which)
        try:
            target.write(text)
            target.flush()
        except (ValueError, OSError, AttributeError):  # a closed capture stream (e.g. after a test ended)
            fallback = getattr(sys, f"__{which}__")
            if fallback is not None:
                with contextlib.suppress(ValueError, OSError):
                    fallback.write(text)

    def _loop(self) -> None:
        partial: dict[int, bytes] = {}
        while True:
            with self._lock:
                for stream, which in self._pending:
                    fd = stream.fileno()
                    os.set_blocking(fd, False)
                    self._sel.register(fd, selectors.EVENT_READ, (stream, which))
                    partial[fd] = b""
                self._pending.clear()
            if self._stop and len(self._sel.get_map()) <= 1:
                break
            events = self._sel.select(timeout=0.5 if self._stop or any(partial.values()) else None)
            if not events:  # a line left unterminated for a while (a progress bar, a prompt): show it
                for fd, rest in partial.items():
                    if rest:
                        self._emit(self._sel.get_key(fd).data[1], rest)
                        partial[fd] = b""
            for key, _ in events:
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                stream, which = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # the worker exited: flush what is left of its last line
                    if partial.get(key.fd):
                        self._emit(which, partial[key.fd])
                    partial.pop(key.fd, None)
                    self._sel.unregister(key.fd)
                    stream.close()
                    continue
                buf = partial[key.fd] + chunk
                cut = buf.rfind(b"\n") + 1  # scrub whole lines, so a secret never straddles two writes
                if cut:
                    self._emit(which, buf[:cut])
                partial[key.fd] = buf[cut:]
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


@dataclass(frozen=True)
class Reservation:
    """What one job (or one map worker) holds: its request, plus the GPUs / TPU it was given."""

    resources: ResourceConfig
    gpu_ids: tuple[str, ...] = ()
    tpu: bool = False

    def env(self) -> dict[str, str]:
        """Environment that confines the job to its devices."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids)} if self.gpu_ids else {}


class Waiter:
    """A `reserve` call queued for capacity."""

    __slots__ = ("event", "granted", "res")

    def __init__(self, res: ResourceConfig) -> None:
        self.res = res
        self.event = threading.Event()
        self.granted: Reservation | None = None


class Pool:
    """Warm workers plus the bookkeeping that keeps reserved CPUs, memory, GPUs and TPUs within capacity."""

    def __init__(self, machine: Machine) -> None:
        self.cpus = machine.cpus
        self.memory = machine.memory
        self._gpus = dict(zip(machine.gpu_ids, machine.gpus, strict=True))  # id -> model name
        self._free_gpus = list(machine.gpu_ids)
        self._tpu_free = machine.tpu_chips > 0
        self._cond = threading.Condition()
        self._used_cpu = 0.0
        self._used_ram = 0
        self._idle: list[WorkerProcess] = []
        self._live: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()
        self._waiters: list[Waiter] = []
        self._extra_secrets: set[str] = set()
        self._relay: _Relay | None = None
        self._closed = False

    # -- admission ---------------------------------------------------------------------------------------
    def _take(self, res: ResourceConfig) -> Reservation | None:
        """Reserve `res` if it fits now (call with the lock held)."""
        if self._closed or self._used_cpu + res.cpu > self.cpus + 1e-9:
            return None
        if res.ram_bytes is not None and self._used_ram + res.ram_bytes > self.memory:
            return None
        gpu_ids: tuple[str, ...] = ()
        if res.device == "gpu":
            fitting = [g for g in self._free_gpus if gpu_matches(res.device_kind or "", self._gpus[g])]
            if len(fitting) < res.device_count:
                return None
            gpu_ids = tuple(fitting[: res.device_count])
        if res.device == "tpu" and not self._tpu_free:
            return None
        self._used_cpu += res.cpu
        self._used_ram += res.ram_bytes or 0
        self._free_gpus = [g for g in self._free_gpus if g not in gpu_ids]
        if res.device == "tpu":  # a host's TPU chips serve one process at a time
            self._tpu_free = False
        return Reservation(res, gpu_ids, res.device == "tpu")

    def try_reserve(self, res: ResourceConfig) -> Reservation | None:
        """Reserve `res` if it fits now and nobody is queued for capacity (queued jobs go first)."""
        with self._cond:
            return None if self._waiters else self._take(res)

    def reserve(self, res: ResourceConfig, give_up: Callable[[], bool] = lambda: False) -> Reservation | None:
        """Block until `res` fits and reserve it; None when `give_up()` turned true (or the pool closed)."""
        return self.wait_for(self.enqueue(res), give_up)

    def enqueue(self, res: ResourceConfig) -> Waiter:
        """Take a place in the queue for `res` (granted at once when it fits and nobody is ahead).

        Waiters are served first-fit in arrival order when capacity frees up, each woken only when its own
        request was granted, so a thousand queued jobs cost nothing while they wait.
        """
        waiter = Waiter(res)
        with self._cond:
            got = None if self._waiters or self._closed else self._take(res)
            if got is not None:
                waiter.granted = got
                waiter.event.set()
            elif not self._closed:
                self._waiters.append(waiter)
            else:
                waiter.event.set()
        return waiter

    def wait_for(self, waiter: Waiter, give_up: Callable[[], bool] = lambda: False) -> Reservation | None:
        """Block until `waiter` is granted; None when `give_up()` turned true (or the pool closed)."""
        while True:
            waiter.event.wait(
                timeout=5.0
            )  # granted, cancel() or shutdown() set it; the timeout is a backstop
            with self._cond:
                if waiter.granted is not None:
                    if give_up() or self._closed:
                        granted, waiter.granted = waiter.granted, None
                        self._release(granted)
                        return None
                    return waiter.granted
                if self._closed or give_up():
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                        self._grant()  # it may have been blocking smaller requests behind it
                    return None
                waiter.event.clear()

    def _grant(self) -> None:
        """Hand freed capacity to queued requests, first fit in arrival order (lock held)."""
        for waiter in list(self._waiters):
            got = self._take(waiter.res)
            if got is not None:
                waiter.granted = got
                self._waiters.remove(waiter)
                waiter.event.set()

    def _release(self, r: Reservation) -> None:
        self._used_cpu = max(0.0, self._used_cpu - r.resources.cpu)
        self._used_ram = max(0, self._used_ram - (r.resources.ram_bytes or 0))
        self._free_gpus.extend(r.gpu_ids)
        if r.tpu:
            self._tpu_free = True
        self._grant()

    def unreserve(self, r: Reservation) -> None:
        with self._cond:
            self._release(r)

    def wake(self) -> None:
        """Let blocked `reserve` calls re-check `give_up` (e.g. after a cancel)."""
        with self._cond:
            for waiter in self._waiters:
                waiter.event.set()

    # -- workers -----------------------------------------------------------------------------------------
    def add_secrets(self, values: list[str]) -> None:
        """Also scrub these values (secret-looking entries of a job's `ResourceConfig.env`) from relayed output."""
        with self._cond:
            self._extra_secrets.update(values)

    def _secrets(self) -> list[str]:
        with self._cond:
            return sorted(self._extra_secrets, key=len, reverse=True)

    def checkout(self, env: dict[str, str] | None = None) -> WorkerProcess:
        """An idle warm worker, or a new one. A job with its own `env` gets a fresh worker started with it,
        so libraries that read the environment at import time (jax, torch, tokenizers) see it."""
        with self._cond:
            if self._closed:
                raise RuntimeError("LocalClient was shut down; create a new client")
            while self._idle and not env:
                w = self._idle.pop()
                if not w.dead and w.proc.poll() is None:
                    return w
            if self._relay is None:
                self._relay = _Relay(self._secrets)
            relay = self._relay
        w = WorkerProcess(relay, env)
        with self._cond:
            self._live.add(w)
        return w

    def checkin(self, w: WorkerProcess) -> None:
        """Return a worker after use; dead workers are dropped, surplus idle ones closed."""
        if w.dead or w.proc.poll() is not None:
            w.kill()
            return
        if w.env:  # its environment belongs to one job or map call
            w.close()
            return
        with self._cond:
            keep = not self._closed and len(self._idle) < max(1, int(self.cpus + 0.999))
            if keep:
                self._idle.append(w)
        if not keep:
            w.close()

    def discard(self, w: WorkerProcess) -> None:
        """Kill a worker whose state we no longer trust (it has work in flight nobody will collect)."""
        w.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=5)
        w.sock.close()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            live = list(self._live)
            for waiter in self._waiters:
                waiter.event.set()
        for w in idle:
            w.close()
        deadline = time.monotonic() + 1.0
        for w in live:
            if w.proc.poll() is None:
                if time.monotonic() > deadline:
                    w.kill()
                else:
                    w.close(grace=max(0.0, deadline - time.monotonic()))
        if self._relay is not None:
            self._relay.stop()
            self._relay = None
