"""The worker process of `LocalClient`: runs jobs and batches of `map` items sent over a socket.

Run as a plain script (`python _worker.py FD`), not through the package, so a worker starts in the time
the interpreter and cloudpickle take to import (the parent's package `__init__` may grow heavy), and the
main-module re-import of `multiprocessing` spawn never happens. The framing helpers at the top are shared
with the parent side (`_pool.py`), which imports this module; keep it stdlib + cloudpickle only.

Protocol (one pickled tuple per frame, parent -> worker):
    ("init", sys_path)                                    extend sys.path like the parent's
    ("map", batch_id, fn_key, fn_bytes | None, items_bytes, env, retries)
    ("job", job_id, payload_bytes, env, log_path, retries)
    ("exit",)
Replies (worker -> parent):
    ("map", batch_id, results_bytes, seconds)   results: list of ("ok", value) | ("err", ErrorInfo tuple)
    ("job", job_id, "ok" | "err", value_bytes | ErrorInfo tuple)
An ErrorInfo tuple is (qualified type name, message, formatted traceback, pickled exception or None).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

_HEADER = struct.Struct("!Q")
_SMALL = 1 << 16


def send_frame(sock: socket.socket, obj: object) -> None:
    """Pickle `obj` and send it with a length prefix."""
    data = pickle.dumps(obj, protocol=5)
    if len(data) < _SMALL:
        sock.sendall(_HEADER.pack(len(data)) + data)
    else:
        sock.sendall(_HEADER.pack(len(data)))
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = sock.recv_into(view[pos:], n - pos)
        if got == 0:
            return None
        pos += got
    return buf


def recv_frame(sock: socket.socket) -> Any:
    """The next frame's object, or None when the other side closed (or died)."""
    try:
        head = _recv_exact(sock, _HEADER.size)
        if head is None:
            return None
        body = _recv_exact(sock, _HEADER.unpack(head)[0])
    except (ConnectionResetError, OSError):
        return None
    return None if body is None else pickle.loads(body)


def error_info(exc: BaseException) -> tuple[str, str, str, bytes | None]:
    """A picklable description of `exc`: type name, message, remote traceback and the exception if it pickles."""
    import cloudpickle

    tp = type(exc)
    name = tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    frames = exc.__traceback__
    if frames is not None and frames.tb_frame.f_code is _call_with_retries.__code__:
        frames = frames.tb_next  # start at the user's function, not at our call of it
    tb = "".join(traceback.format_exception(tp, exc, frames))
    try:
        blob = cloudpickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt (required init args)
    except Exception:
        blob = None
    return name, str(exc), tb, blob


def _dumps(obj: object) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        import cloudpickle

        return cloudpickle.dumps(obj)


class _Env:
    """Apply environment variables for one job or batch (None unsets one) and put the old values back after."""

    def __init__(self, env: Mapping[str, str | None] | None) -> None:
        self.env = env or {}
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc: object) -> None:
        for k, old in self.saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def _call_with_retries(fn: Callable[..., Any], args: tuple, kwargs: dict, retries: int) -> Any:
    for attempt in range(retries + 1):
        try:
            return "ok", fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, never swallowed
            if isinstance(exc, KeyboardInterrupt | SystemExit) or attempt == retries:
                return "err", error_info(exc)
    raise AssertionError("unreachable")


def _run_batch(fns: dict, msg: tuple) -> tuple:
    import cloudpickle

    _, batch_id, fn_key, fn_bytes, items_bytes, env, retries = msg
    if fn_bytes is not None:
        if len(fns) > 8:
            fns.clear()
        fns[fn_key] = cloudpickle.loads(fn_bytes)
    fn = fns[fn_key]
    items = pickle.loads(items_bytes)
    start = time.perf_counter()
    with _Env(env):
        results = [_call_with_retries(fn, (item,), {}, retries) for item in items]
    seconds = time.perf_counter() - start
    try:
        blob = _dumps(results)
    except Exception as exc:  # one result does not pickle: report it per item, keep the others
        out = []
        for status, value in results:
            try:
                _dumps(value)
                out.append((status, value))
            except Exception:
                out.append(
                    ("err", error_info(TypeError(f"result {type(value).__name__} is not picklable: {exc}")))
                )
        blob = _dumps(out)
    return ("map", batch_id, blob, seconds)


def _run_job(msg: tuple) -> tuple:
    import cloudpickle

    _, job_id, payload, env, log_path, retries = msg
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    value: Any  # the result, then its pickle; or error_info(...) when the job failed
    try:
        with _Env(env):
            try:
                fn, args, kwargs = cloudpickle.loads(payload)
            except BaseException as exc:  # noqa: BLE001
                status, value = "err", error_info(exc)
            else:
                status, value = _call_with_retries(fn, args, kwargs, retries)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    if status == "ok":
        try:
            value = _dumps(value)
        except Exception as exc:
            status, value = (
                "err",
                error_info(TypeError(f"job result {type(value).__name__} is not picklable: {exc}")),
            )
    return ("job", job_id, status, value)


def _watch_parent(parent_pid: int) -> None:
    # A busy worker cannot notice its socket closing. When the parent is gone (kill -9 of the driver), kill
    # this worker's whole process group at once: the job and every process it started, so nothing keeps
    # writing into a step folder that the next run is about to empty and rerun.
    import signal

    while True:
        time.sleep(0.05)
        if os.getppid() != parent_pid:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            finally:
                os._exit(1)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # this file's folder holds package-private modules; never let them shadow others
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    fns: dict = {}
    while True:
        msg = recv_frame(sock)
        if msg is None or msg[0] == "exit":
            return
        if msg[0] == "init":
            for p in msg[1]:
                if p not in sys.path:
                    sys.path.append(p)
            continue
        reply = _run_batch(fns, msg) if msg[0] == "map" else _run_job(msg)
        send_frame(sock, reply)


if __name__ == "__main__":
    main()
