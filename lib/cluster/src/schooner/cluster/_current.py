"""Which client runs jobs now: a context manager, else the environment, else the embedded local client."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ._client import Client

_lock = threading.Lock()
_stack: list[Client] = []
_default: Client | None = None

CLUSTER_ENV = "SCHOONER_CLUSTER"
"""`local` (default), `ray` (start a local Ray or use RAY_ADDRESS), or `ray://host:port` / `host:port`."""


def client_from_spec(spec: str | None, *, quiet: bool = False) -> Client:
    """Build a client from a spec string: '' / 'local' -> LocalClient; 'ray', 'auto' or a Ray address ->
    RayClient (which connects, or starts a local Ray, on first use).

    `quiet=False` makes the client stream every job's output here as it runs (the command line's default).
    """
    spec = (spec or "").strip()
    if spec in ("", "local"):
        from ._local import LocalClient

        return LocalClient(stream_logs=not quiet)
    if spec == "ray" or spec.startswith("ray://") or spec == "auto" or ":" in spec:
        from ._ray import RayClient

        kw: dict[str, Any] = {"log_to_driver": False} if quiet else {}
        return RayClient(address=None if spec == "ray" else spec, **kw)
    raise ValueError(
        f"{CLUSTER_ENV}={spec!r} is not a cluster spec; use 'local', 'ray', 'auto' or a Ray address like 'ray://host:10001'"
    )


def current_client() -> Client:
    """The innermost client set with `using_client`, else one built from SCHOONER_CLUSTER (cached), else local."""
    global _default
    with _lock:
        if _stack:
            return _stack[-1]
        if _default is None:
            _default = client_from_spec(os.environ.get(CLUSTER_ENV), quiet=True)
        return _default


@contextlib.contextmanager
def using_client(client: Client) -> Iterator[Client]:
    """Make `client` the current client inside the block (nestable, process-wide)."""
    with _lock:
        _stack.append(client)
    try:
        yield client
    finally:
        with _lock:
            _stack.remove(client)
