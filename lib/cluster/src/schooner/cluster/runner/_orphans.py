"""No orphans: processes that in-process steps start do not outlive a driver killed with SIGKILL.

A step without `resources` runs inside the driver, so the processes it starts (`subprocess.run`, a data
loader's workers, a server) are the driver's children, in its process group. A worker of the local client
kills its own process group when its parent dies, but the driver cannot do that for itself: kill -9 leaves it
no last word, and its children, re-parented to init, kept running and writing into the step's folder.

So while in-process steps run, a small guard process watches the driver (`python -I .../_orphans.py PID
SESSION`, standard library only; the first in-process step waits up to `READY_TIMEOUT_S` until it has looked
once). Every `SCAN_S` it lists the driver's descendants that started after the guard did, in the driver's
session (from /proc: parent links, start times, session ids). When its stdin closes without the word "stop"
(the driver died), it kills those that still run and their own descendants; then, once the driver's exit is
complete (waiting at most `EXIT_WAIT_S`), also the processes of the driver's session started since the guard
that were re-parented to init or to the child subreaper that the guard itself went to (under a subreaper
parent, that parent's own children of the session started since the guard too). Processes in another session
(the local client's workers, a local Ray: each has its own watchdog; a child started with
`start_new_session=True`) are left alone. On Ctrl-C and SIGTERM the runner asks it to kill them ("kill"); at
the end of a run it says "stop" (processes a step left running on purpose stay).

Linux only (/proc); elsewhere there is no guard. A process started and detached (a new session, a double
fork) within the last `SCAN_S` before the driver died can escape it. The guard says nothing unless it fails:
then on the driver's stderr, and it goes on (a failed look is tried again; the driver's death still acts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

SCAN_S = 0.2
READY_TIMEOUT_S = 10.0
EXIT_WAIT_S = 5.0
"""How long the guard waits, after the driver's stdin closed, for the driver's exit to complete."""


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, start time in clock ticks, session id) of a process, or None when it is gone or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[1]), int(fields[19]), int(fields[3])


def _processes() -> dict[int, tuple[int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def _descendants(roots: set[int], procs: dict[int, tuple[int, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _kill_all(seen: dict[int, int]) -> None:
    """SIGKILL every process of `seen` (pid -> start time) that still runs, and its descendants now."""
    procs = _processes()
    alive = {p for p, start in seen.items() if p in procs and procs[p][1] == start}
    for pid in alive | _descendants(alive, procs):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class _Guard:
    """The guard's state and its steps (see the module); `guard` is its loop."""

    def __init__(self, driver: int, session: int) -> None:
        self.driver, self.session, self.me = driver, session, os.getpid()
        self.since = (_stat(self.me) or (0, 0, 0))[1]
        self.seen: dict[int, int] = {}
        self._said: set[str] = set()

    def scan(self) -> None:
        procs = _processes()
        for pid in _descendants({self.driver}, procs) - {self.me}:
            # Started since the guard, in the driver's session (a client's workers and a local Ray have
            # sessions of their own, and their own watchdogs).
            if procs[pid][1] >= self.since and procs[pid][2] == self.session:
                self.seen.setdefault(pid, procs[pid][1])

    def sweep(self, reapers: set[int]) -> None:
        """Also the orphans of the driver's session started since the guard, now children of `reapers`."""
        self.scan()
        for pid, (ppid, start, sid) in _processes().items():
            if ppid in reapers and sid == self.session and start >= self.since and pid != self.me:
                self.seen.setdefault(pid, start)

    def attempt(self, what: str, fn: Callable[[], None], tries: int = 1) -> None:
        """`fn()`; an error is said once on stderr (the driver's, which the guard inherits) and the guard
        goes on: a guard that died of one failed look would leave every child it watches running."""
        for i in range(tries):
            try:
                fn()
                return
            except Exception as e:
                import traceback

                text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                if text not in self._said:
                    self._said.add(text)
                    with contextlib.suppress(OSError):
                        sys.stderr.write(
                            f"schooner: the orphan guard (pid {self.me}) of driver {self.driver} failed to "
                            f"{what} (it {'goes on' if i + 1 == tries else 'tries again'}):\n{text}"
                        )
                        sys.stderr.flush()
                if i + 1 < tries:
                    time.sleep(SCAN_S)

    def wait_for_the_exit(self) -> set[int]:
        """Wait (at most EXIT_WAIT_S) until the driver's exit is complete; where its orphans went."""
        # Its stdin closes when its last thread drops its files, early in that thread's exit; its children
        # are re-parented (to init, or to the nearest child subreaper) later in the same exit, each when the
        # thread that started it is done. Between the two, /proc lists the driver and a child may already be
        # re-parented: neither the driver's descendant nor, had the sweep waited for a driver gone from
        # /proc, anyone's. So wait until the driver is gone (a zombie or reaped) and the guard itself (a
        # child of the driver too) has been re-parented: its new parent is where the other orphans went.
        deadline = time.monotonic() + EXIT_WAIT_S
        while time.monotonic() < deadline and (_stat(self.driver) is not None or os.getppid() == self.driver):
            time.sleep(0.01)
        # The sweep runs even when the wait ran out (an exit stuck in the kernel): 1 and where the guard went.
        return {1, os.getppid()}


def guard(driver: int, session: int) -> None:
    """The guard's loop (see the module): watch `driver` (of `session`), kill its new descendants when it
    dies."""
    g = _Guard(driver, session)
    word: list[bytes] = []

    def read() -> None:
        word.append(sys.stdin.buffer.readline().strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready = False
    while reader.is_alive():
        g.attempt("list the driver's processes", g.scan)
        if not ready:  # the driver waits for this before it runs a step (unbuffered: nothing left to flush)
            with contextlib.suppress(OSError):
                os.write(sys.stdout.fileno(), b"ready\n")
            ready = True
        reader.join(SCAN_S)
    if word and word[0] == b"stop":
        return
    if word and word[0] == b"kill":  # the driver lives and asks: its descendants, those seen now too
        g.attempt("list the driver's processes", g.scan, tries=3)
    else:  # the driver died (stdin closed): those seen go now, those re-parented once its exit is complete
        g.attempt("list the driver's processes", g.scan)
        g.attempt("kill the processes the driver's steps started", lambda: _kill_all(g.seen))
        reapers = g.wait_for_the_exit()
        g.attempt("list the driver's orphans", lambda: g.sweep(reapers), tries=3)
    g.attempt("kill the processes the driver's steps started", lambda: _kill_all(g.seen), tries=3)


class OrphanGuard:
    """The driver's side: start the guard once, `kill()` what in-process steps started, `stop()` it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._started or not os.path.isdir("/proc"):
                return
            self._started = True
            try:
                # This file alone (standard library only, -I: no site, no environment): it starts fast.
                self._proc = subprocess.Popen(
                    # The session from here: a guard that starts after the driver died can't read it.
                    [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), str(os.getsid(0))],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=None,  # the driver's: silent unless the guard fails, then said where the run shows
                    start_new_session=True,  # Ctrl-C at the terminal does not stop it first
                    close_fds=True,
                )
            except OSError as e:  # e.g. no fork under a process or memory limit: said, and the run goes on
                sys.stderr.write(
                    f"schooner: no orphan guard ({e}): processes that in-process steps start may outlive this "
                    "driver if it is killed with SIGKILL\n"
                )
            if self._proc is not None and self._proc.stdout is not None:
                ready = threading.Thread(target=self._proc.stdout.readline, daemon=True)
                ready.start()
                # Never a hang; a guard that starts later still acts (the session is in its argv).
                ready.join(READY_TIMEOUT_S)

    def _say(self, word: bytes) -> None:
        with self._lock:
            proc, self._proc, self._started = self._proc, None, False
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(word + b"\n")
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self) -> None:
        """Kill every process that in-process steps started and that still runs."""
        self._say(b"kill")

    def stop(self) -> None:
        """The run ended: the guard goes, the processes stay."""
        self._say(b"stop")


if __name__ == "__main__":
    guard(int(sys.argv[1]), int(sys.argv[2]))
