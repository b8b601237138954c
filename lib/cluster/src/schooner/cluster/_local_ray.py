"""A real multi-node Ray cluster on this machine: a head and worker nodes, each its own raylet.

`schooner cluster up --local-nodes 3` (and the test fixture) start them with Ray's own command line
(`ray start --head`, then `ray start --address HEAD` per worker node), each node in its own process group
with its own CPU count and custom resources (e.g. a fake TPU slice label), so a node can be killed with
SIGKILL like a preempted machine. Token authentication is on: a random token in the cluster's state folder
(`RAY_AUTH_TOKEN_PATH`), which drivers get through `env()`.

This module runs Ray's command line in subprocesses and never imports ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_STATE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "schooner", "local-ray")
"""Where `schooner cluster up` keeps the state of the local cluster (its token, nodes and logs)."""


@dataclass(frozen=True)
class LocalNode:
    """One node of a `LocalRayCluster`."""

    name: str
    """The Ray node name (`ray start --node-name`); also how `kill_node` finds it."""
    cpus: float = 1.0
    """CPUs it offers to tasks; 0 for a head that runs none (only the cluster's control processes)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources, e.g. `{"TPU-v5p-8-head": 1, "TPU": 4}` to make it look like a TPU host."""
    pgid: int | None = None
    """The process group of its Ray processes once started."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"LocalNode.name must be letters, digits, '-', '_' or '.', got {self.name!r}")
        if not self.cpus >= 0:
            raise ValueError(
                f"LocalNode {self.name!r}: cpus must be >= 0 (0: it runs no steps), got {self.cpus!r}"
            )
        bad = {k: v for k, v in self.resources.items() if not isinstance(v, int | float) or v < 0}
        if bad:
            raise ValueError(f"LocalNode {self.name!r}: resources must be numbers >= 0, got {bad}")


class LocalRayCluster:
    """Start, inspect, break and stop a multi-node Ray cluster on this machine.

    Example:
        >>> with LocalRayCluster([LocalNode("head"), LocalNode("tpu", resources={"TPU-v5p-8-head": 1})]) as c:
        ...     client = RayClient(address=c.address)        # with c.env() in os.environ  # doctest: +SKIP
        ...     c.kill_node("tpu")                           # a preempted host            # doctest: +SKIP

    Args:
        nodes: the nodes (the first is the head), or a count of 1-CPU nodes named `node-0`, `node-1`, ...
        state_dir: the folder for its token, state file, logs and Ray's session files (a fresh temporary
            folder by default; `schooner cluster up` uses `~/.cache/schooner/local-ray`).
        start_timeout: seconds a node may take to come up (Ray's start is slow on a loaded 2-core machine).
    """

    ray_command: str | None = None
    """The `ray` executable (default: the one beside this Python)."""

    def __init__(
        self,
        nodes: int | Sequence[LocalNode] = 3,
        *,
        state_dir: str | None = None,
        start_timeout: float = 180.0,
    ) -> None:
        if isinstance(nodes, int):
            if nodes < 1:
                raise ValueError(f"LocalRayCluster needs at least one node, got {nodes}")
            nodes = [LocalNode(f"node-{i}") for i in range(nodes)]
        names = [n.name for n in nodes]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"LocalRayCluster: node names must be unique and at least one, got {names}")
        self.nodes: list[LocalNode] = list(nodes)
        self._own_state = state_dir is None
        if state_dir is None:
            import tempfile

            state_dir = tempfile.mkdtemp(prefix="sray-", dir="/tmp")
        self.state_dir = os.path.abspath(state_dir)
        self.start_timeout = start_timeout
        self.address: str | None = None
        self.port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------
    @property
    def token_path(self) -> str:
        return os.path.join(self.state_dir, "auth_token")

    @property
    def temp_dir(self) -> str:
        """Ray's session folder. Ray puts Unix sockets there, whose paths may not exceed 107 bytes, so a
        state folder with a long path gets a short one under /tmp (removed again by `stop`)."""
        inside = os.path.join(self.state_dir, "ray")
        if len(inside) <= 40:
            return inside
        return os.path.join("/tmp", "schooner-ray-" + hashlib.sha1(self.state_dir.encode()).hexdigest()[:10])

    def env(self) -> dict[str, str]:
        """What a driver (or any process) needs to connect: the address and the token."""
        if self.address is None:
            raise RuntimeError("LocalRayCluster is not started; call start() first")
        return {
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
            # Every node runs in this machine's environment: no need for Ray to rebuild it under `uv run`.
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }

    def start(self) -> LocalRayCluster:
        """Start the head, then every worker node; idempotent."""
        if self.address is not None:
            return self
        os.makedirs(self.state_dir, exist_ok=True)
        os.makedirs(self.temp_dir, exist_ok=True)
        if not os.path.exists(self.token_path):
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        self.port = _free_port()
        self.address = f"{LOOPBACK}:{self.port}"  # a local cluster is reached from this machine only
        try:
            head = self.nodes[0]
            self.nodes[0] = self._start_node(head, head=True)
            for i, node in enumerate(self.nodes[1:], start=1):
                self.nodes[i] = self._start_node(node, head=False)
        except BaseException:
            self.stop()
            raise
        self.save()
        return self

    def add_node(self, node: LocalNode) -> None:
        """Start one more worker node (or restart a killed one under its name)."""
        if self.address is None:
            raise RuntimeError("LocalRayCluster is not started; call start() first")
        others = [n for n in self.nodes if n.name != node.name]
        self.nodes = [*others, self._start_node(node, head=False)]
        self.save()

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of node `name` (its raylet, agents and workers), like a host that dies."""
        node = self._node(name)
        if node.pgid is not None:
            _kill_group(node.pgid)
        self.nodes = [n if n.name != name else LocalNode(n.name, n.cpus, n.resources) for n in self.nodes]
        self.save()

    def stop(self) -> None:
        """Kill every node (workers first, the head last) and, for a temporary state folder, remove it."""
        for node in reversed(self.nodes):
            if node.pgid is not None:
                _kill_group(node.pgid)
        self.nodes = [LocalNode(n.name, n.cpus, n.resources) for n in self.nodes]
        self.address = None
        if self.temp_dir != os.path.join(self.state_dir, "ray"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.state_dir, "cluster.json"))

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state (for `schooner cluster down/status` in another process) ---------------------------------------
    def save(self) -> None:
        state = {"address": self.address, "port": self.port, "nodes": [asdict(n) for n in self.nodes]}
        tmp = os.path.join(self.state_dir, ".cluster.json.tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1, allow_nan=False)
        os.replace(tmp, os.path.join(self.state_dir, "cluster.json"))

    @classmethod
    def load(cls, state_dir: str) -> LocalRayCluster:
        """The cluster `schooner cluster up` started with this state folder."""
        path = os.path.join(state_dir, "cluster.json")
        try:
            with open(path) as f:
                state = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no local Ray cluster is recorded in {state_dir}; start one with `schooner cluster up`"
            ) from None
        cluster = cls([LocalNode(**n) for n in state["nodes"]], state_dir=state_dir)
        cluster.address, cluster.port = state["address"], state["port"]
        return cluster

    def alive(self) -> dict[str, bool]:
        """Per node: whether its processes are running."""
        return {n.name: n.pgid is not None and _group_alive(n.pgid) for n in self.nodes}

    # -- internals ---------------------------------------------------------------------------------------------
    def _node(self, name: str) -> LocalNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r}; the nodes are {[n.name for n in self.nodes]}")

    def _start_node(self, node: LocalNode, *, head: bool) -> LocalNode:
        ray = self.ray_command or os.path.join(os.path.dirname(sys.executable), "ray")
        cmd = [
            ray,
            "start",
            "--node-name",
            node.name,
            "--num-cpus",
            f"{node.cpus:g}",
            "--disable-usage-stats",
        ]
        if node.resources:
            cmd += ["--resources", json.dumps(dict(node.resources))]
        if head:
            cmd += [
                "--node-ip-address", LOOPBACK,
                "--head",
                "--port", str(self.port),
                "--temp-dir", self.temp_dir,
                "--include-dashboard", "false",
                "--ray-client-server-port", str(_free_port()),
                "--dashboard-agent-listen-port", str(_free_port()),
            ]  # fmt: skip
        else:
            cmd += ["--address", str(self.address)]
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }
        env.pop("RAY_ADDRESS", None)
        # Every node on loopback, so that Ray's servers listen there only (an exposed Ray job API runs anyone's
        # code). `--node-ip-address 127.0.0.1` alone does not do it: `ray start` replaces a loopback address
        # by the machine's network address (`services.resolve_ip_for_localhost`), and the GCS, raylets and
        # agents then listen on every interface. Ray keeps loopback when "clusters" are off
        # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, its single-machine mode): the head starts so. A worker node
        # refuses that mode, so it gets no address: `ray start --address 127.0.0.1:PORT` takes the address the
        # machine has as seen from the head's, which is loopback.
        if head:
            env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        else:
            env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        log = os.path.join(self.state_dir, f"start-{node.name}.log")
        for attempt in range(1, START_ATTEMPTS + 1):
            if attempt > 1:
                time.sleep(RETRY_PAUSE_S * (attempt - 1))  # let the load that slowed it pass
            with open(log, "w") as out:
                # Its own session: every process `ray start` leaves behind shares this process group.
                proc = subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
                try:
                    code = proc.wait(timeout=self.start_timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    raise TimeoutError(
                        f"Ray node {node.name!r} did not start within {self.start_timeout:g} s; see {log}"
                    ) from None
            if code == 0:
                return LocalNode(node.name, node.cpus, node.resources, pgid=proc.pid)
            _kill_group(proc.pid)
            with open(log) as f:
                text = f.read()
            # `ray start` gives a raylet 30 s (not configurable) to register; a loaded machine can exceed it.
            tail = "".join(text.splitlines(keepends=True)[-15:])
            if "timed out during startup" not in text:
                raise RuntimeError(f"`ray start` for node {node.name!r} failed (exit {code}); {log}:\n{tail}")
        raise RuntimeError(
            f"`ray start` for node {node.name!r} timed out {START_ATTEMPTS} times: Ray gives a node's raylet 30 s "
            f"to register (a limit `ray start` does not let us change), and this machine is busy (load average "
            f"{_load()} on {os.cpu_count()} cores). Start it again when the machine is quieter, start fewer nodes "
            f"(--local-nodes), or stop other work; see {log}"
        )


def _load() -> str:
    with contextlib.suppress(OSError):
        return f"{os.getloadavg()[0]:.1f}"
    return "unknown"


LOOPBACK = "127.0.0.1"
START_ATTEMPTS = 5
"""Starts of one node before giving up, when `ray start` times out waiting for its raylet."""
RETRY_PAUSE_S = 5.0
"""Pause before the second start of a node (twice that before the third, ...)."""


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group and every descendant that left it (Ray's workers are the raylet's children)."""
    import psutil

    members = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):  # a process that ended meanwhile: ProcessLookupError
            if os.getpgid(p.pid) == pgid:
                members.append(p)
    for p in list(members):
        with contextlib.suppress(psutil.Error):
            members += p.children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for p in members:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(members, timeout=10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def wait_for_nodes(client: Any, count: int, timeout: float = 120.0) -> None:
    """Block until a connected `RayClient` sees `count` live nodes."""
    deadline = time.monotonic() + timeout
    while len(client.nodes(refresh=True)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(client.nodes())} of {count} Ray nodes are alive after {timeout:g} s"
            )
        time.sleep(0.5)
