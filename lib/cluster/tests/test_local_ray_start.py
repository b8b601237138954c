"""`schooner cluster up --local-nodes` (issue 36): `ray start` timing out under load is retried and, when it
keeps timing out, the error says why and what to do; the nodes listen on loopback only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from schooner.cluster import LocalNode, LocalRayCluster, _local_ray

TIMEOUT_TEXT = "Exception: The current node timed out during startup. This could happen because ..."


def _fake_ray(tmp_path: Path, failures: int) -> Path:
    """A `ray` command that times out `failures` times (as `ray start` does under load), then succeeds; each
    call's arguments go to calls.txt, and the Ray settings of its environment to env.txt."""
    script = tmp_path / "ray"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls.txt\n'
        f'echo "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=$RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" >> {tmp_path}/env.txt\n'
        f"n=$(wc -l < {tmp_path}/calls.txt)\n"
        f'if [ "$n" -le {failures} ]; then echo "{TIMEOUT_TEXT}"; exit 1; fi\n'
        "exit 0\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_start_that_times_out_is_retried(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_local_ray, "RETRY_PAUSE_S", 0.01)
    monkeypatch.setattr(LocalRayCluster, "ray_command", str(_fake_ray(tmp_path, 3)))
    cluster = LocalRayCluster([LocalNode("head")], state_dir=str(tmp_path / "state")).start()
    try:
        calls = (tmp_path / "calls.txt").read_text().splitlines()
        assert len(calls) == 4
    finally:
        cluster.stop()


def test_a_start_that_keeps_timing_out_says_why_and_what_to_do(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_local_ray, "RETRY_PAUSE_S", 0.01)
    monkeypatch.setattr(LocalRayCluster, "ray_command", str(_fake_ray(tmp_path, 100)))
    with pytest.raises(RuntimeError) as err:
        LocalRayCluster([LocalNode("head")], state_dir=str(tmp_path / "state")).start()
    text = str(err.value)
    assert f"timed out {_local_ray.START_ATTEMPTS} times" in text
    assert "load average" in text and "30 s" in text and "fewer nodes" in text


def test_every_node_is_told_to_use_loopback(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(LocalRayCluster, "ray_command", str(_fake_ray(tmp_path, 0)))
    cluster = LocalRayCluster([LocalNode("head"), LocalNode("w")], state_dir=str(tmp_path / "state")).start()
    try:
        assert cluster.address.startswith("127.0.0.1:")
        calls = (tmp_path / "calls.txt").read_text().splitlines()
        assert len(calls) == 2 and "--node-ip-address 127.0.0.1" in calls[0]
        # a worker node joins the head's loopback address: Ray takes its own address from it
        assert f"--address {cluster.address}" in calls[1] and "--node-ip-address" not in calls[1]
        envs = (tmp_path / "env.txt").read_text().splitlines()
        assert envs == ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="]
    finally:
        cluster.stop()


_RESOLVE = """
import json, os, sys
from ray._private import ray_constants, services
for args, env_value in json.loads(sys.argv[1]):
    # what `ray start` reads from its environment when it imports Ray (ray_constants' own definition)
    os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
    if env_value:
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = env_value
    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
        ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
    )
    args = args.split()
    if "--node-ip-address" in args:  # ray start: resolve_ip_for_localhost(the given address)
        print(services.resolve_ip_for_localhost(args[args.index("--node-ip-address") + 1]))
    elif "--head" in args:  # ray start --head without it: this machine's address
        print(services.get_node_ip_address())
    else:  # ray start --address A without it: the address this machine has as seen from A
        print(services.get_node_ip_address(args[args.index("--address") + 1]))
"""


def test_every_node_gets_a_loopback_address_from_ray_itself(tmp_path: Path, monkeypatch) -> None:
    """`ray start --node-ip-address 127.0.0.1` alone gives the node the machine's network address (Ray
    "resolves" loopback to a reachable address), and with it every server binds all interfaces. What Ray's
    own resolution makes of each node's command and environment is checked here, with the installed Ray."""
    import json
    import subprocess
    import sys

    monkeypatch.setattr(LocalRayCluster, "ray_command", str(_fake_ray(tmp_path, 0)))
    cluster = LocalRayCluster(
        [LocalNode("head"), LocalNode("w1"), LocalNode("w2")], state_dir=str(tmp_path / "state")
    ).start()
    address = cluster.address
    try:
        calls = (tmp_path / "calls.txt").read_text().splitlines()
        envs = [line.split("=", 1)[1] for line in (tmp_path / "env.txt").read_text().splitlines()]
    finally:
        cluster.stop()
    assert len(calls) == len(envs) == 3
    cases = [
        (call.replace(str(address), "127.0.0.1:6379"), env) for call, env in zip(calls, envs, strict=True)
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    got = subprocess.run(
        [sys.executable, "-c", _RESOLVE, json.dumps(cases)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    for (call, env_value), address_given in zip(cases, got, strict=True):
        assert address_given == "127.0.0.1", (
            f"Ray gives the node of `ray {call}` (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER={env_value!r}) the "
            f"address {address_given}"
        )


def _is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address on an IPv6 socket (`::ffff:127.0.0.1`, as gRPC binds)."""
    import ipaddress

    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_loopback_addresses_are_told_apart_from_every_interface() -> None:
    assert all(map(_is_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.2"]))
    assert not any(map(_is_loopback, ["::", "0.0.0.0", "192.0.2.2", "::ffff:192.0.2.2"]))


def _listening(temp_dir: str) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening socket of the processes of a local cluster (found by
    its temp folder in their command lines, and their children)."""
    import psutil

    mine: dict[int, str] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if temp_dir in " ".join(p.info["cmdline"] or []):
                mine[p.pid] = p.info["name"]
                mine.update({c.pid: c.name() for c in p.children(recursive=True)})
        except psutil.Error:
            pass
    return {
        (c.laddr.ip, c.laddr.port, mine[c.pid])
        for c in psutil.net_connections("inet")
        if c.status == "LISTEN" and c.pid in mine
    }


@pytest.mark.slow
def test_a_real_local_cluster_listens_on_loopback_only(tmp_path: Path) -> None:
    """A head and a worker node started for real; their sockets are read while they start (a loaded machine
    can miss Ray's 30 s start limit, after the GCS and raylets are already listening) and once up."""
    import threading
    import time

    cluster = LocalRayCluster([LocalNode("head"), LocalNode("w")], state_dir=str(tmp_path / "s"))
    seen: set[tuple[str, int, str]] = set()
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            cluster.start()
            outcome.append(None)
        except RuntimeError as e:
            outcome.append(e)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            seen |= _listening(cluster.temp_dir)
            time.sleep(0.3)
        if outcome == [None]:
            time.sleep(3)  # the agents a node starts after it registers
            seen |= _listening(cluster.temp_dir)
    finally:
        cluster.stop()
    if not seen:
        pytest.skip(f"no Ray process got as far as listening here: {outcome}")
    names = {name for _, _, name in seen}
    assert "gcs_server" in names and "raylet" in names, seen
    exposed = sorted((ip, port, name) for ip, port, name in seen if not _is_loopback(ip))
    assert exposed == [], f"Ray servers listening beyond loopback: {exposed}"
