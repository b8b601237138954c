"""`RayClient`: jobs and maps as Ray tasks. The one module that imports ray (lazily, at construction).

Example:
    >>> client = RayClient()                      # RAY_ADDRESS / SCHOONER_CLUSTER, else a new local Ray
    >>> client.submit(pow, 2, 10).result()
    1024
    >>> list(client.map(abs, [-1, -2, 3]))
    [1, 2, 3]

How `ResourceConfig` maps onto Ray: `cpu` -> `num_cpus`, `ram` -> `memory` (bytes), a GPU -> `num_gpus` plus
`accelerator_type`, a TPU slice -> the custom resource `TPU-{kind}-head` (one per slice, on its first
host) plus `TPU` chips for a single-host slice; `disk` has no Ray counterpart and is ignored.
`max_retries_preemption` -> `max_retries` (worker or node death); `max_retries_failure` reruns a raising
function inside its task, as the LocalClient's worker does, so both clients make exactly
`1 + max_retries_failure` attempts per start and `1 + max_retries_preemption` starts.
Environment variables with secret-looking names travel inside the task's arguments and are set by the
task itself, never through `runtime_env` (which Ray shows in its state API and logs); the others use
`runtime_env={"env_vars": ...}`, so they are in place when the worker process starts.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

from ._batching import BatchSizer
from ._client import (
    EventJobHandle,
    JobCancelledError,
    JobError,
    JobStatus,
    ResourcesUnavailableError,
    WorkerDiedError,
    error_from_info,
)
from ._gang import GangInfo, coordinator_address
from ._resources import ResourceConfig
from ._secrets import is_secret_name
from ._worker_pickle import register_for
from ._worker_ray import RemoteFailure, run_batch, run_job

_TARGET_BATCH_SECONDS = 0.05  # Ray's per-task overhead is higher than a local worker's round trip


def _address_from_env() -> str | None:
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    spec = os.environ.get("SCHOONER_CLUSTER", "").strip()
    if spec and spec not in ("local", "ray"):
        return spec
    return None


class RayJobHandle:
    """A job submitted to a `RayClient` (see `schooner.cluster.JobHandle`).

    Ray does not tell a queued task from a running one without its state API, so `status()` is RUNNING
    from submission until the task is final.
    """

    def __init__(self, client: RayClient, name: str, ref: Any) -> None:
        self.name = name
        self.ref = ref
        self._client = client
        self._status = JobStatus.RUNNING
        self._value: Any = None
        self._error: JobError | None = None
        self._logs = ""
        self._cancelled = False

    def __repr__(self) -> str:
        return f"RayJobHandle(name={self.name!r}, status={self.status().value})"

    def status(self) -> JobStatus:
        if not self._status.done:
            self.wait(timeout=0)
        return self._status

    def wait(self, timeout: float | None = None) -> JobStatus:
        if self._status.done:
            return self._status
        ray = self._client._ray
        ready, _ = ray.wait([self.ref], timeout=timeout)
        if ready:
            self._resolve()
        return self._status

    def result(self, timeout: float | None = None) -> Any:
        if not self.wait(timeout).done:
            raise TimeoutError(f"job {self.name!r} is still {self._status.value} after {timeout} s")
        if self._status is JobStatus.SUCCEEDED:
            return self._value
        assert self._error is not None
        raise self._error

    def cancel(self) -> None:
        if self._status.done:
            return
        self._cancelled = True
        self._client._ray.cancel(self.ref, force=True)

    def logs(self) -> str:
        """The job's output (scrubbed), once it finished; while it runs Ray streams it to the driver."""
        return self._logs

    def _resolve(self) -> None:
        ray = self._client._ray
        try:
            self._value, self._logs = ray.get(self.ref)
            self._status = JobStatus.SUCCEEDED
            return
        except BaseException as exc:  # noqa: BLE001 - translated into the client's errors below
            error = translate_error(ray, self.name, exc, cancelled=self._cancelled)
            if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, RemoteFailure):
                self._logs = exc.cause.logs
        self._error = error
        self._status = JobStatus.CANCELLED if isinstance(error, JobCancelledError) else JobStatus.FAILED


class RayGangHandle(EventJobHandle):
    """A gang (`ResourceConfig.hosts > 1`) on Ray: a placement group of one bundle per process spread over
    distinct nodes (`STRICT_SPREAD`), one task per bundle in a fresh worker (a runtime env of its own per
    start), process 0's coordinator address handed to every process. The first process to fail or die makes
    the handle cancel the others at once and restart the whole gang within the retry budgets; the value is
    process 0's. Same interface as `RayJobHandle`."""

    def __init__(self, client: RayClient, name: str, job: tuple, res: ResourceConfig) -> None:
        self.name = name
        self._client, self._job, self._res = client, job, res
        self._status = JobStatus.RUNNING
        self._value: Any = None
        self._error: JobError | None = None
        self._logs = ""
        self._cancelled = False
        self._refs: list[Any] = []
        self._done = threading.Event()
        self.starts = 0
        """How often the gang was started (1 + restarts)."""
        threading.Thread(target=self._drive, name=f"schooner-gang-{name}", daemon=True).start()

    def __repr__(self) -> str:
        return f"RayGangHandle(name={self.name!r}, hosts={self._res.hosts}, status={self._status.value})"

    def cancel(self) -> None:
        if self._done.is_set():
            return
        self._cancelled = True
        for ref in list(self._refs):
            with contextlib.suppress(Exception):
                self._client._ray.cancel(ref, force=True)

    def logs(self) -> str:
        """Process 0's output (scrubbed), once the gang finished."""
        return self._logs

    def _drive(self) -> None:
        failures = deaths = 0
        try:
            while True:
                self.starts += 1
                error = self._attempt()
                if error is None:
                    self._status = JobStatus.SUCCEEDED
                    return
                if self._cancelled or isinstance(error, JobCancelledError):
                    self._error, self._status = JobCancelledError(self.name, "cancelled"), JobStatus.CANCELLED
                    return
                died = isinstance(error, WorkerDiedError)
                deaths, failures = deaths + died, failures + (not died)
                if deaths > self._res.max_retries_preemption or failures > self._res.max_retries_failure:
                    self._error, self._status = error, JobStatus.FAILED
                    return
        except BaseException as exc:  # noqa: BLE001 - never leave the handle hanging
            self._error, self._status = JobError(self.name, f"gang driver error: {exc!r}"), JobStatus.FAILED
        finally:
            self._done.set()

    def _attempt(self) -> JobError | None:
        """One start of the gang; None when every process succeeded, else the first error."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup

        ray, res, client = self._client._ray, self._res, self._client
        fn, args, kwargs, secrets = self._job
        bundle = client._request(res)
        bundle = {k: v for k, v in bundle.items() if not k.startswith("accelerator_type")}
        pg = placement_group([bundle] * res.hosts, strategy="STRICT_SPREAD", name=f"{self.name}-gang")
        try:
            ray.get(pg.ready())
            where = ray.remote(coordinator_address).options(
                num_cpus=0, scheduling_strategy=InGroup(pg, placement_group_bundle_index=0)
            )
            coordinator = ray.get(where.remote())
            attempt = uuid.uuid4().hex[:12]
            plain = {k: v for k, v in res.env.items() if not is_secret_name(k)}
            self._refs = []
            for i in range(res.hosts):
                opts = client._options(res, f"{self.name}[{i}]")
                opts.update(max_retries=0, scheduling_strategy=InGroup(pg, placement_group_bundle_index=i))
                gang_env = GangInfo(i, res.hosts, coordinator, attempt).env()
                opts["runtime_env"] = {"env_vars": {**plain, **gang_env}}  # a fresh worker per start
                self._refs.append(client._job.options(**opts).remote(fn, args, kwargs, secrets, 0))
            pending = list(self._refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                try:
                    value, logs = ray.get(ready[0])
                except BaseException as exc:  # noqa: BLE001 - the first failure stops the gang
                    for ref in pending:
                        with contextlib.suppress(Exception):
                            ray.cancel(ref, force=True)
                    index = self._refs.index(ready[0])
                    return translate_error(ray, f"{self.name}[{index}]", exc, cancelled=self._cancelled)
                if ready[0] is self._refs[0]:
                    self._value, self._logs = value, logs
            return None
        finally:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)


def translate_error(ray: Any, name: str, exc: BaseException, *, cancelled: bool = False) -> JobError:
    """A Ray error as the client's `JobError` family."""
    rex = ray.exceptions
    if cancelled or isinstance(exc, rex.TaskCancelledError):
        return JobCancelledError(name, "cancelled")
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause
        if isinstance(cause, RemoteFailure):
            return error_from_info(name, cause.info)
        return JobError(name, f"{type(cause).__name__}: {cause}", exc.traceback_str, type(cause).__name__)
    died = (rex.WorkerCrashedError, rex.NodeDiedError, rex.OutOfMemoryError, rex.ObjectLostError,
            rex.LocalRayletDiedError)  # fmt: skip
    if isinstance(exc, died):
        return WorkerDiedError(name, f"its Ray worker died past its retries: {type(exc).__name__}: {exc}")
    if isinstance(exc, rex.RayError):
        return JobError(name, f"{type(exc).__name__}: {exc}")
    raise exc


class RayClient:
    """Runs jobs as tasks on a Ray cluster.

    Args:
        address: the cluster ('ray://head:10001', 'head:6379', 'auto'); default RAY_ADDRESS, then an address in
            SCHOONER_CLUSTER, else a new local Ray on this machine. If Ray is already initialised in this
            process, that connection is used as is.
        namespace: Ray namespace.
        runtime_env: job-wide Ray runtime environment.
        check_resources: fail at submit when no node could ever fit a request (turn off on autoscaling
            clusters, where a request may fit once nodes are added).
        **init_kwargs: passed to `ray.init` (e.g. `num_cpus`, `include_dashboard`, `object_store_memory`).
    """

    def __init__(
        self,
        address: str | None = None,
        namespace: str | None = None,
        runtime_env: dict | None = None,
        *,
        check_resources: bool = True,
        **init_kwargs: Any,
    ) -> None:
        self.address = address or _address_from_env() or "local"
        self.check_resources = check_resources
        self._init_args = (namespace, runtime_env, init_kwargs)
        self._ray: Any = None
        self._owns_ray = False
        self._connect_lock = threading.Lock()
        self._ids = itertools.count()
        self._nodes: tuple[float, list[dict[str, float]]] = (0.0, [])
        self._closed = False

    @property
    def started(self) -> bool:
        """Whether this client has connected to (or started) Ray yet: it does so on first use, so that an
        experiment whose steps are all cached, or a dry run, never waits for a cluster."""
        return self._ray is not None

    def connect(self) -> RayClient:
        """Connect now (start a local Ray when no address is set); idempotent. Every method that needs the
        cluster calls it."""
        if self._ray is not None:
            return self
        with self._connect_lock:
            if self._ray is None:
                self._connect()
        return self

    def _connect(self) -> None:
        self._check_open()
        namespace, runtime_env, init_kwargs = self._init_args
        local_no_uv_hook = self.address == "local" and "RAY_ENABLE_UV_RUN_RUNTIME_ENV" not in os.environ
        if local_no_uv_hook:
            # Under `uv run`, Ray would rebuild this project in a fresh venv for every local worker (tens of
            # seconds); workers on this machine already share our environment.
            os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
        import ray

        if local_no_uv_hook:  # in case ray was imported before we set the variable
            ray._private.ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
        if not ray.is_initialized():
            ray.init(address=self.address, namespace=namespace, runtime_env=runtime_env, **init_kwargs)
            self._owns_ray = True
        self._job = ray.remote(run_job)
        self._batch = ray.remote(run_batch)
        self._ray = ray

    def __repr__(self) -> str:
        if not self.started:
            return f"RayClient(address={self.address!r}, not connected yet)"
        return f"RayClient(nodes={len(self._node_resources())}, owns_ray={self._owns_ray})"

    def __enter__(self) -> RayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- resources ---------------------------------------------------------------------------------------
    def nodes(self, *, refresh: bool = False) -> list[dict[str, float]]:
        """The resources of each live node of the cluster (connects first; cached for 5 s unless `refresh`)."""
        if refresh:
            self._nodes = (0.0, [])
        return list(self._node_resources())

    def _node_resources(self) -> list[dict[str, float]]:
        self.connect()
        stamp, nodes = self._nodes
        if time.monotonic() - stamp > 5.0:
            nodes = [n["Resources"] for n in self._ray.nodes() if n.get("Alive")]
            self._nodes = (time.monotonic(), nodes)
        return nodes

    def _request(self, res: ResourceConfig) -> dict[str, float]:
        req: dict[str, float] = {"CPU": res.cpu}
        if res.ram:
            req["memory"] = float(res.ram)
        if res.device == "gpu":
            req["GPU"] = float(res.device_count)
            req[f"accelerator_type:{res.device_kind}"] = 0.001
        elif res.device == "tpu":
            req[f"TPU-{res.device_kind}-head"] = 1.0
        return req

    def check(self, resources: ResourceConfig, *, what: str = "job") -> None:
        """Raise `ResourcesUnavailableError` when no live node could ever run `resources`."""
        res = resources
        if res.device == "tpu" and res.hosts > 1:
            raise ResourcesUnavailableError(
                f"{what} asks for a gang of hosts={res.hosts} on TPU {res.device_kind!r}: the hosts of one TPU slice "
                "need slice-aware placement, which RayClient does not do yet; run TPU pods with one job per slice "
                "host group outside the gang mechanism, or use CPU/GPU hosts"
            )
        if res.device == "tpu" and res.slices > 1:
            raise ResourcesUnavailableError(
                f"{what} asks for slices={res.slices} TPU slices; RayClient schedules one task on one slice's "
                f"head host. Run one job per slice, or use slices=1"
            )
        if not self.check_resources:
            return
        nodes = self._node_resources()
        req = self._request(res)
        fields = {
            "CPU": f"cpu={res.cpu:g}",
            "memory": f"ram={res.ram}",
            "GPU": f"device_count={res.device_count} GPUs of device_kind={res.device_kind!r}",
        }
        for key, amount in req.items():
            best = max((n.get(key, 0.0) for n in nodes), default=0.0)
            if amount > best + 1e-9:
                label = fields.get(key, f"device_kind={res.device_kind!r} (Ray resource {key!r})")
                raise ResourcesUnavailableError(
                    f"{what} asks for {label} but the largest of the cluster's {len(nodes)} live node(s) has "
                    f"{best:g} {key}; lower the request, add such nodes, or pass check_resources=False to "
                    f"RayClient on an autoscaling cluster"
                )
        fitting = sum(all(n.get(k, 0.0) + 1e-9 >= v for k, v in req.items()) for n in nodes)
        if not fitting:
            raise ResourcesUnavailableError(
                f"{what} asks for {req} but no single node has all of it; lower the request or add a larger node"
            )
        if res.hosts > fitting:
            raise ResourcesUnavailableError(
                f"{what} asks for a gang of hosts={res.hosts} processes on distinct nodes each holding {req}, "
                f"but only {fitting} of the cluster's {len(nodes)} live node(s) can; add nodes or lower hosts"
            )

    def _options(self, res: ResourceConfig, name: str) -> dict:
        # Ray retries only deaths (of the worker or node); a raising function is rerun inside the task
        # (`run_job`, `run_batch`), so `max_retries_failure` means the same on both clients. Ray's own
        # `retry_exceptions` would spend `max_retries` on both kinds alike.
        opts: dict[str, Any] = {
            "name": name,
            "num_cpus": res.cpu,
            "max_retries": res.max_retries_preemption,
            "retry_exceptions": False,
        }
        if res.ram:
            opts["memory"] = res.ram
        if res.device == "gpu":
            opts["num_gpus"] = res.device_count
            opts["accelerator_type"] = res.device_kind
        elif res.device == "tpu":
            custom = {f"TPU-{res.device_kind}-head": 1.0}
            if res.tpu_chips <= 8:  # a single-host slice: hold its chips too
                custom["TPU"] = float(res.tpu_chips)
            opts["resources"] = custom
        plain = {k: v for k, v in res.env.items() if not is_secret_name(k)}
        if plain:
            opts["runtime_env"] = {"env_vars": plain}
        return opts

    # -- jobs --------------------------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        resources: ResourceConfig | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> RayJobHandle | RayGangHandle:
        """Run `fn(*args, **kwargs)` as a Ray task (a gang of them when `resources.hosts > 1`); see
        `schooner.cluster.Client.submit`."""
        self._check_open()
        self.connect()
        res = resources if resources is not None else ResourceConfig.with_cpu()
        name = name or f"{getattr(fn, '__name__', 'job')}-{next(self._ids)}"
        self.check(res, what=f"job {name!r}")
        register_for(
            (fn, args, kwargs),
            self._ray.cloudpickle.CloudPickler,
            self._ray.cloudpickle.register_pickle_by_value,
        )
        if res.hosts > 1:
            return self._submit_gang(fn, args, kwargs, res, name)
        secrets = {k: v for k, v in res.env.items() if is_secret_name(k)}
        opts = self._options(res, name)
        ref = self._job.options(**opts).remote(fn, args, kwargs, secrets, res.max_retries_failure)
        return RayJobHandle(self, name, ref)

    def _submit_gang(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, res: ResourceConfig, name: str
    ) -> RayGangHandle:
        secrets = {k: v for k, v in res.env.items() if is_secret_name(k)}
        return RayGangHandle(self, name, (fn, args, kwargs, secrets), res)

    # -- map ---------------------------------------------------------------------------------------------
    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        resources: ResourceConfig | None = None,
        max_workers: int | None = None,
        name: str | None = None,
    ) -> Iterator[Any]:
        """Yield `fn(item)` for every item in order. Items travel in batches sized from the measured time per
        item; at most two batches per worker are in flight, so memory stays bounded on long inputs."""
        self._check_open()
        self.connect()
        res = resources if resources is not None else ResourceConfig.with_cpu()
        label = name or str(getattr(fn, "__name__", "map"))
        if res.hosts > 1:
            raise ValueError(f"map {label!r}: hosts={res.hosts} makes a gang, which is one job: use submit()")
        self.check(res, what=f"map {label!r} (per task)")
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
        ):
            raise ValueError(f"map(max_workers=...) must be an integer >= 1, got {max_workers!r}")
        cpus = self._ray.cluster_resources().get("CPU", 1.0)
        fit = math.floor(cpus / res.cpu + 1e-9) if res.cpu > 0 else math.ceil(cpus)
        workers = max(1, min(fit, max_workers or fit))
        return self._map(fn, items, res, workers, label)

    def _map(
        self, fn: Callable, items: Iterable[Any], res: ResourceConfig, workers: int, label: str
    ) -> Iterator[Any]:
        ray = self._ray
        total = len(items) if isinstance(items, Sized) else None
        source = iter(items)
        register_for(fn, ray.cloudpickle.CloudPickler, ray.cloudpickle.register_pickle_by_value)
        fn_ref = ray.put(fn)
        secrets = {k: v for k, v in res.env.items() if is_secret_name(k)}
        task = self._batch.options(**self._options(res, label))
        inflight: deque[tuple[Any, int, int]] = deque()  # (ref, first index, count)
        pulled, exhausted = 0, False
        sizer = BatchSizer(_TARGET_BATCH_SECONDS, total=total)
        try:
            while True:
                while not exhausted and len(inflight) < 2 * workers:
                    batch = list(itertools.islice(source, sizer.size(workers, pulled)))
                    if not batch:
                        exhausted = True
                        break
                    ref = task.remote(fn_ref, batch, secrets, res.max_retries_failure)
                    inflight.append((ref, pulled, len(batch)))
                    pulled += len(batch)
                if not inflight:
                    return
                ref, first, count = inflight.popleft()
                try:
                    out, seconds = ray.get(ref)
                except BaseException as exc:  # noqa: BLE001
                    raise translate_error(ray, f"{label}[{first}:{first + count}]", exc) from None
                sizer.observe(seconds, count)
                for offset, (status, value) in enumerate(out):
                    if status != "ok":
                        raise error_from_info(f"{label}[{first + offset}]", value)
                    yield value
        finally:
            for ref, _, _ in inflight:  # abandoned (error or early exit): free the cluster
                ray.cancel(ref)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("RayClient was shut down; create a new client")

    def shutdown(self) -> None:
        """Disconnect; stops the local Ray if this client started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_ray and self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
