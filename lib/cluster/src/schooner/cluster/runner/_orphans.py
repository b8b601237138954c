"""No orphans: processes that in-process steps start do not outlive a driver killed with SIGKILL.

A step without `resources` runs inside the driver, so the processes it starts (`subprocess.run`, a data
loader's workers, a server) are the driver's children, in its process group. A worker of the local client
kills its own process group when its parent dies, but the driver cannot do that for itself: kill -9 leaves it
no last word, and its children, re-parented to init, kept running and writing into the step's folder.

So while in-process steps run, a small guard process watches the driver (`python -I .../_orphans.py PID`,
standard library only; the first in-process step waits until it has looked once). Every `SCAN_S` it lists
the driver's descendants that started after the guard did, in the driver's session (from /proc: parent
links, start times, session ids). When its stdin closes without the word "stop" (the driver died), it kills
those that still run and their own descendants, and the processes of the driver's session started since
the guard that were already re-parented to init. Processes in another session (the local client's workers,
a local Ray: each has its own watchdog; a child started with `start_new_session=True`) are left alone. On
Ctrl-C and SIGTERM the runner asks it to kill them ("kill"); at the end of a run it says "stop" (processes a
step left running on purpose stay).

Linux only (/proc); elsewhere there is no guard. A process started and detached (a new session, a double
fork) within the last `SCAN_S` before the driver died can escape it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

SCAN_S = 0.2
READY_TIMEOUT_S = 10.0


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


def guard(driver: int) -> None:
    """The guard's loop (see the module): watch `driver`, kill its new descendants when it dies."""
    me = os.getpid()
    since = (_stat(me) or (0, 0, 0))[1]
    session = (_stat(driver) or (0, 0, -1))[2]
    seen: dict[int, int] = {}
    word: list[bytes] = []

    def read() -> None:
        word.append(sys.stdin.buffer.readline().strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready = False

    def scan() -> dict[int, tuple[int, int, int]]:
        procs = _processes()
        for pid in _descendants({driver}, procs) - {me}:
            # Started since the guard, in the driver's session (a client's workers and a local Ray have
            # sessions of their own, and their own watchdogs).
            if procs[pid][1] >= since and procs[pid][2] == session:
                seen.setdefault(pid, procs[pid][1])
        return procs

    while True:
        procs = scan()
        if not ready:  # the driver waits for this before it runs a step
            with contextlib.suppress(OSError):
                sys.stdout.write("ready\n")
                sys.stdout.flush()
            ready = True
        reader.join(SCAN_S)
        if not reader.is_alive():
            if word and word[0] == b"stop":
                return
            # "kill", or the driver died (stdin closed). Also those started since the last scan and
            # already re-parented to init: in the driver's session, started since the guard.
            procs = scan()  # what started since the last look
            if driver not in procs:
                for pid, (ppid, start, sid) in _processes().items():
                    if ppid == 1 and sid == session and start >= since and pid != me:
                        seen.setdefault(pid, start)
            _kill_all(seen)
            return


class OrphanGuard:
    """The driver's side: start the guard once, `kill()` what in-process steps started, `stop()` it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._proc is not None or not os.path.isdir("/proc"):
                return
            with contextlib.suppress(OSError):
                # This file alone (standard library only, -I: no site, no environment): it starts fast.
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C at the terminal does not stop it first
                    close_fds=True,
                )
            if self._proc is not None and self._proc.stdout is not None:
                ready = threading.Thread(target=self._proc.stdout.readline, daemon=True)
                ready.start()
                ready.join(READY_TIMEOUT_S)  # a slow start leaves a short window, never a hang

    def _say(self, word: bytes) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
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
    guard(int(sys.argv[1]))
