"""What in-process steps print, scrubbed of secrets on its way to the terminal.

An in-process step (one without `resources`) prints into the runner's own terminal, through many doors:
`print` and `sys.stdout.write` (a secret may be split over two writes), `sys.stdout.buffer`, a `logging`
handler made before the run (it holds the old `sys.stderr`), a child process (`subprocess.run(["echo",
secret])` writes to file descriptor 1 itself). While such steps run, the runner therefore points file
descriptors 1 and 2 at pipes whose reader threads scrub what comes through and pass it on to the real
terminal, and wraps `sys.stdout`/`sys.stderr` too (for streams that are not file descriptors: a notebook, a
test's capture). Both hold back a tail that may be the start of a secret until the next write shows whether
it is (`StreamScrubber`).

Several in-process steps may run at once, in threads: the first installs, the last restores. A child that
outlives its step keeps writing through the scrubbing pipe, whose reader ends when the child does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from schooner.cluster._secrets import StreamScrubber

DRAIN_S = 2.0
"""How long restoring the terminal waits for the pipes to empty (a child still running keeps its pipe)."""


class _ScrubbingStream:
    """A text stream writing through `stream` with secret values replaced by '***' (held-back tails
    included, see `StreamScrubber`)."""

    def __init__(self, stream: Any, secrets: list[str]) -> None:
        self._stream = stream
        self._scrubber = StreamScrubber(secrets)
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            out = self._scrubber.feed(text)
        if out:
            self._stream.write(out)
        return len(text)

    def close_scrubber(self) -> None:
        with self._lock:
            rest = self._scrubber.close()
        if rest:
            with contextlib.suppress(Exception):
                self._stream.write(rest)
        with contextlib.suppress(Exception):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _FdPipe:
    """File descriptor `fd` pointed at a pipe; a thread scrubs what arrives and writes it to the old target."""

    def __init__(self, fd: int, secrets: list[str]) -> None:
        self.fd = fd
        self._saved = os.dup(fd)
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self._read = read
        self._scrubber = StreamScrubber([s.encode("utf-8") for s in secrets])
        self._thread = threading.Thread(target=self._pump, name=f"schooner-scrub-fd{fd}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._read, 65536)
                except OSError:
                    break
                if not data:
                    break
                self._write(self._scrubber.feed(data))
            self._write(self._scrubber.close())
        finally:
            os.close(self._read)
            os.close(self._saved)

    def _write(self, data: bytes) -> None:
        while data:
            try:
                n = os.write(self._saved, data)
            except OSError:
                return
            data = data[n:]

    def restore(self) -> None:
        """Point `fd` back at its old target (closing this end of the pipe); wait a while for the rest."""
        os.dup2(self._saved, self.fd)
        self._thread.join(DRAIN_S)


_lock = threading.Lock()
_users = 0
_state: tuple[Any, Any, list[_FdPipe]] | None = None


def _fd_of(stream: Any) -> int | None:
    with contextlib.suppress(Exception):
        return int(stream.fileno())
    return None


@contextlib.contextmanager
def scrubbed_output(secrets: list[str] | None) -> Iterator[None]:
    """While inside: what this process and its children print is scrubbed of `secrets` (see the module)."""
    global _users, _state
    if not secrets:
        yield
        return
    with _lock:
        if _users == 0:
            saved = (sys.stdout, sys.stderr)
            pipes: list[_FdPipe] = []
            for stream in saved:
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd in (1, 2):
                with contextlib.suppress(OSError):
                    os.fstat(fd)
                    pipes.append(_FdPipe(fd, secrets))
            sys.stdout = _ScrubbingStream(sys.stdout, secrets)
            sys.stderr = _ScrubbingStream(sys.stderr, secrets)
            _state = (saved[0], saved[1], pipes)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _state is not None:
                out, err, pipes = _state
                for wrapper in (sys.stdout, sys.stderr):
                    if isinstance(wrapper, _ScrubbingStream):
                        wrapper.close_scrubber()
                sys.stdout, sys.stderr = out, err
                for pipe in pipes:
                    pipe.restore()
                _state = None
