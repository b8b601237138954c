"""What a run records about itself (config, package versions, log files) and process-wide setup
(multi-host initialization, the persistent compilation cache)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax

logger = logging.getLogger("schooner.train")


def config_to_json(config: Any) -> dict[str, Any]:
    """A JSON-able dict of `config` (the model config through `schooner.model.config_to_dict`)."""
    from schooner.model import LlamaConfig, config_to_dict

    def conv(x: Any) -> Any:
        if isinstance(x, LlamaConfig):  # every model config (MoEConfig, registered ones) subclasses it
            return config_to_dict(x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            d = {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
            return {"class": type(x).__name__, **d}
        if isinstance(x, Mapping):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [conv(v) for v in x]
        return x

    return conv(config)


def package_versions() -> dict[str, str]:
    """Versions of the packages a run's results depend on."""
    from importlib import metadata

    out = {}
    for name in (
        "schooner-train",
        "schooner-model",
        "schooner-tokenize",
        "jax",
        "jaxlib",
        "haliax",
        "equinox",
        "optax",
        "tensorstore",
        "numpy",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


DISTRIBUTED_TIMEOUT_S = 300
"""How long a process waits for the others to join (`jax.distributed.initialize`) before it fails."""


def maybe_init_distributed() -> None:
    """Join the other processes of a multi-host run (once per process; every host runs the same program).

    In a gang (`ResourceConfig(hosts=N)`: `schooner.cluster.current_gang()`), the gang's coordinator, size and
    this process's id; elsewhere a launcher's `JAX_COORDINATOR_ADDRESS` (jax reads the rest). CPU collectives
    go through gloo. A process that dies is noticed by the others' heartbeats; in a gang the client stops
    and restarts the whole gang at once.
    """
    from schooner.cluster import current_gang

    gang = current_gang()
    if jax.distributed.is_initialized() or (gang is None and not os.environ.get("JAX_COORDINATOR_ADDRESS")):
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if gang is None:
        jax.distributed.initialize(initialization_timeout=DISTRIBUTED_TIMEOUT_S)
    else:
        jax.distributed.initialize(
            gang.coordinator,
            gang.num_processes,
            gang.process_id,
            initialization_timeout=DISTRIBUTED_TIMEOUT_S,
            heartbeat_timeout_seconds=60,
        )
    logger.info(
        f"process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local devices, "
        f"{jax.device_count()} in all"
    )


def is_primary() -> bool:
    """Whether this process writes the run's shared files (metrics, logs, plots, checkpoint commits)."""
    return jax.process_index() == 0


def enable_compilation_cache() -> None:
    # The persistent cache makes a repeated run skip compilation; SCHOONER_COMPILATION_CACHE=off disables.
    where = os.environ.get("SCHOONER_COMPILATION_CACHE", os.path.expanduser("~/.cache/schooner/jax"))
    # jax registers its options as attributes at import time; its Config class does not declare them.
    if where != "off" and not jax.config.jax_compilation_cache_dir:  # type: ignore[attr-defined]
        jax.config.update("jax_compilation_cache_dir", where)


_CURRENT_RUN: contextvars.ContextVar[RunLog | None] = contextvars.ContextVar(
    "schooner_train_run", default=None
)
"""The run whose code is executing: set by `RunLog` in the run's thread, carried into the threads a run starts
through `run_in_context` (threads start with an empty context)."""


def run_in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` bound to the caller's context, for a thread's target: its log lines then belong to the caller's run."""
    return functools.partial(contextvars.copy_context().run, fn)


class _OwnLines(logging.Filter):
    """Pass a record emitted in this run's context, or in no run's (unattributable lines go to every open log
    rather than none); drop another run's: several runs train at once as threads of one process."""

    def __init__(self, run: RunLog) -> None:
        super().__init__()
        self.run = run

    def filter(self, record: logging.LogRecord) -> bool:
        current = _CURRENT_RUN.get()
        return current is None or current is self.run


_OPEN_LOCK = threading.Lock()
_open_runs: list[RunLog] = []
_shared: dict[str, Any] = {"level": logging.NOTSET, "stream": None}
"""What the open runs share: the logger's level before the first opened, and the stderr handler (if the first
found nothing configured). Both are undone when the last one closes, not the first: a run that ends early
must not silence one still training."""


class RunLog:
    """Send `schooner.train` logs to `<run>/train.log` (process 0) and (if nothing else is configured) to
    stderr. The file gets the lines of this run only (those logged in its thread and the threads it starts
    with `run_in_context`), also when other runs train at once in the same process."""

    def __init__(self, run_dir: str) -> None:
        self._token = _CURRENT_RUN.set(self)
        self.handlers: list[logging.Handler] = []
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
        if jax.process_count() > 1:
            fmt = logging.Formatter(f"%(asctime)s %(levelname)s [process {jax.process_index()}] %(message)s")
        if "://" not in run_dir and is_primary():
            fh = logging.FileHandler(os.path.join(run_dir, "train.log"))
            fh.setFormatter(fmt)
            fh.addFilter(_OwnLines(self))
            self.handlers.append(fh)
        with _OPEN_LOCK:
            if not _open_runs:
                _shared["level"] = logger.level
                if logger.getEffectiveLevel() > logging.INFO:
                    logger.setLevel(logging.INFO)
                if not logging.getLogger().handlers and not logger.handlers:
                    sh = logging.StreamHandler(sys.stderr)
                    sh.setFormatter(fmt)
                    logger.addHandler(sh)
                    _shared["stream"] = sh
            _open_runs.append(self)
            for h in self.handlers:
                logger.addHandler(h)

    def close(self) -> None:
        with _OPEN_LOCK:
            for h in self.handlers:
                logger.removeHandler(h)
                h.close()
            if self in _open_runs:
                _open_runs.remove(self)
            if not _open_runs:
                if _shared["stream"] is not None:
                    logger.removeHandler(_shared["stream"])
                    _shared["stream"] = None
                logger.setLevel(_shared["level"])
        try:
            _CURRENT_RUN.reset(self._token)
        except ValueError:  # closed in another context than it was opened in
            _CURRENT_RUN.set(None)


def recorded_data(config: Mapping[str, Any]) -> dict[str, Any]:
    """`{"seq_len", "components": {input: weight}, "validation": {name: folder} | None, "evals": {...}}` of a
    run's config as `run.json` records it: a `TrainerConfig`, or the `TrainConfig` of schooner-train 0.x
    (`data.components`, `data.seq_len`, `data.validation`). `validation` None: the datasets' own."""
    if "data" in config:  # schooner-train 0.x
        data = config["data"]
        return {
            "seq_len": int(data["seq_len"]),
            "components": {str(k): float(v) for k, v in data["components"].items()},
            "validation": data.get("validation"),
            "evals": {},
        }
    return {
        "seq_len": int(config["seq_len"]),
        "components": {str(x): float(w) for x, w in config["datasets"]},
        "validation": config.get("validation"),
        "evals": dict(config.get("evals") or {}),
    }
