"""The lease on a step's output folder: one runner at a time runs a step; dead runners are taken over.

`{output}/.schooner/lease.json` names its holder (owner id, host, pid and the pid's start time) and a
heartbeat time that the holder refreshes every few seconds. A lease is *stale* when its heartbeat is
older than its `ttl`, or at once when its holder ran on this host and that process is gone (kill -9,
OOM): a rerun after a crash does not wait for the ttl.

Acquiring is an exclusive create. Taking over a stale lease is an exclusive create of a marker named
after the stale lease's content (`lease.json.takeover-<hash>`): of several runners that see the same
stale lease, exactly one wins and replaces it; the others see the new live lease and wait. Whoever
acquires re-reads the status file before running, so a step finished meanwhile is never rerun.
Clocks: heartbeats of runners on other hosts are compared with this host's clock; keep clocks in sync
(NTP) and the ttl well above the skew.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass

from schooner.cluster.records import meta_path
from schooner.cluster.storage import Storage

DEFAULT_TTL_S = 60.0
"""Seconds without a heartbeat after which a lease held from another host is stale."""
DEFAULT_HEARTBEAT_S = 5.0

_HOST = socket.gethostname()


def _process_start(pid: int) -> float | None:
    """The start time of process `pid` on this host, or None when there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # exists, owned by someone else
        return -1.0


@functools.cache
def _my_start() -> float:
    return _process_start(os.getpid()) or 0.0


@dataclass(frozen=True)
class LeaseInfo:
    """A parsed lease file."""

    owner: str
    run_id: str
    host: str
    pid: int
    pid_start: float
    heartbeat: float
    ttl: float

    def holder_alive_here(self) -> bool | None:
        """Whether the holding process is alive, when it ran on this host; None for other hosts."""
        if self.host != _HOST:
            return None
        start = _process_start(self.pid)
        if start is None:
            return False
        return start < 0 or abs(start - self.pid_start) < 1.0

    def is_stale(self, now: float | None = None) -> bool:
        """True when the holder is known dead or has not heartbeated within `ttl`."""
        now = time.time() if now is None else now
        if now - self.heartbeat > self.ttl:
            return True
        return self.holder_alive_here() is False

    def describe(self) -> str:
        age = max(0.0, time.time() - self.heartbeat)
        return f"run {self.run_id} on {self.host} pid {self.pid} (heartbeat {age:.0f}s ago)"


def parse_lease(text: str | None) -> LeaseInfo | None:
    if not text:
        return None
    try:
        return LeaseInfo(**json.loads(text))
    except (ValueError, TypeError):
        return None


class Lease:
    """This runner's (attempted) lease on one output folder."""

    def __init__(
        self, storage: Storage, output_path: str, *, owner: str, run_id: str, ttl: float = DEFAULT_TTL_S
    ) -> None:
        self.storage = storage
        self.path = meta_path(output_path, "lease.json")
        self.owner = owner
        self.run_id = run_id
        self.ttl = ttl
        self.held = False
        self.took_over = False

    def _text(self) -> str:
        info = LeaseInfo(self.owner, self.run_id, _HOST, os.getpid(), _my_start(), time.time(), self.ttl)
        return json.dumps(asdict(info), allow_nan=False)

    def read(self) -> LeaseInfo | None:
        """The lease file now (None when free or unreadable)."""
        return parse_lease(self.storage.read_text(self.path))

    def try_acquire(self) -> tuple[bool, LeaseInfo | None]:
        """Take the lease if it is free or stale. Returns (acquired, the live lease of another holder)."""
        if self.storage.create_exclusive(self.path, self._text()):
            self.held = True
            return True, None
        raw = self.storage.read_text(self.path)
        cur = parse_lease(raw)
        if raw is None or cur is None:
            return False, None  # released just now (or being written): try again
        if cur.owner == self.owner:
            self.held = True
            return True, None
        if not cur.is_stale():
            return False, cur
        marker = f"{self.path}.takeover-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"
        if self.storage.create_exclusive(marker, self.owner):
            if self.storage.read_text(self.path) == raw:
                self.storage.write_text(self.path, self._text())
                self.held = self.took_over = True
                return True, None
            self.storage.remove(marker)  # the stale lease was replaced meanwhile: nothing to take over
        return False, None

    def heartbeat(self) -> bool:
        """Refresh the heartbeat; False when the lease was lost (taken over by another runner)."""
        cur = self.read()
        if cur is None or cur.owner != self.owner:
            self.held = False
            return False
        self.storage.write_text(self.path, self._text())
        return True

    def still_held(self) -> bool:
        cur = self.read()
        return cur is not None and cur.owner == self.owner

    def release(self, *, checked: bool = False) -> None:
        """Give the lease up (after the status file is final) and remove takeover markers.

        `checked`: the caller has just confirmed `still_held()` (skips one read).
        """
        if not self.held:
            return
        self.held = False
        if checked or self.still_held():
            self.storage.remove(self.path)
        if self.took_over:  # only takers create markers (a loser removes its own at once)
            for marker in self.storage.glob(self.path + ".takeover-*"):
                self.storage.remove(marker)
