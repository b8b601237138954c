"""A real multi-node Ray cluster on this machine (head and worker raylets started with `ray start`): the
`schooner cluster` command, a DAG whose steps land where their resources ask, and a worker node killed with
SIGKILL mid-step. Slow: each node takes ~10-20 s to start on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schooner.cluster._local_ray import LocalNode, LocalRayCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).parent / "experiments_data"
TPU = {"TPU-v5p-8-head": 1, "TPU": 4}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalRayCluster]:
    nodes = [LocalNode("head", 1), LocalNode("tpu-a", 1, TPU), LocalNode("tpu-b", 1, TPU)]
    with LocalRayCluster(nodes, state_dir=str(tmp_path_factory.mktemp("ray"))) as c:
        yield c


def _driver(cluster: LocalRayCluster, prefix: Path, **env: str) -> subprocess.Popen:
    full = {**os.environ, **cluster.env(), "COLUMNS": "250", **env}
    full.pop("SCHOONER_PREFIX", None)
    cmd = [sys.executable, "-m", "schooner.cluster.cli", "run", str(HERE / "multinode.py"), "--prefix", str(prefix),
           "--cluster", "ray", "--shared-prefix"]  # fmt: skip
    return subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _folder(prefix: Path, name: str) -> Path:
    return next(prefix.glob(f"{name}-*"))


def test_steps_land_on_the_nodes_their_resources_ask_for(cluster: LocalRayCluster, tmp_path: Path) -> None:
    prefix = tmp_path / "out"
    proc = _driver(cluster, prefix, MN_DELAY="0")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert (_folder(prefix, "mn/on-tpu") / "node.txt").read_text() in ("tpu-a", "tpu-b")
    assert (_folder(prefix, "mn/rows") / "attempts.txt").read_text().split()[0] in ("tpu-a", "tpu-b")
    # The local prefix is refused without --shared-prefix: a real multi-node cluster has no shared disk.
    full = {**os.environ, **cluster.env()}
    refused = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", "run", str(HERE / "multinode.py"), "--prefix",
         str(tmp_path / "other"), "--cluster", "ray"],
        env=full, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and "the Ray cluster has 3 nodes" in refused.stdout


def test_a_worker_node_killed_mid_step_is_retried_elsewhere_and_resumes(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    prefix = tmp_path / "out"
    proc = _driver(cluster, prefix, MN_ROWS="16", MN_DELAY="0.5")
    deadline = time.monotonic() + 300
    rows_file = None
    while time.monotonic() < deadline:
        found = list(prefix.glob("mn/.rows-*.attempt-*/rows.txt"))  # the attempt's own folder
        if found and len(found[0].read_text().splitlines()) >= 4:
            rows_file = found[0]
            break
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    assert rows_file is not None, "the resumable step never started"
    victim = (rows_file.parent / "attempts.txt").read_text().split()[0]
    cluster.kill_node(victim)  # the TPU host running the step dies
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out  # the driver survived
    rows_file = _folder(prefix, "mn/rows") / "rows.txt"  # published whole once done
    attempts = (rows_file.parent / "attempts.txt").read_text().split()
    assert attempts[0] == victim and attempts[-1] != victim and len(attempts) == 2, attempts
    rows = [json.loads(x)["row"] for x in rows_file.read_text().splitlines()]
    assert rows == list(range(16))  # nothing lost, nothing counted twice
    record = json.loads((rows_file.parent / ".schooner" / "step.json").read_text())
    assert record["state"] == "SUCCESS" and record["result"]["resumed_at"] >= 4
    # The preemption is in the record: a start on the victim that died, then one elsewhere that returned.
    starts = [(s["node"], s["how"]) for s in record["starts"]]
    assert starts == [(victim, "died (worker or node lost)"), (attempts[-1], "returned")], starts
    cluster.add_node(LocalNode(victim, 1, TPU))  # back for the other tests


def test_the_cluster_command_starts_inspects_breaks_and_stops_a_cluster(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    cli = [sys.executable, "-m", "schooner.cluster.cli", "cluster"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cli, *args, "--state-dir", state], capture_output=True, text=True, timeout=300
        )

    up = run("up", "--local-nodes", "2")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "export RAY_ADDRESS=" in up.stdout and "export RAY_AUTH_TOKEN_PATH=" in up.stdout
        assert "the head (head) runs no steps" in up.stdout
        status = run("status").stdout
        assert status.count(": up,") == 3 and "head: up, 0 CPU (head, runs no steps)" in status, status
        # Jobs land on the worker nodes only, as the cluster itself reports where each one ran.
        env = {**os.environ, **LocalRayCluster.load(state).env()}
        placed = subprocess.run([sys.executable, "-c", _WHERE], env=env, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        assert placed.returncode == 0, placed.stdout + placed.stderr
        nodes = json.loads(placed.stdout.splitlines()[-1])
        assert nodes and set(nodes) <= {"node-0", "node-1"}, nodes
        assert run("kill-node", "node-1").returncode == 0
        status = run("status").stdout
        assert "node-0: up" in status and "node-1: DOWN" in status
        assert "already up" in run("up", "--local-nodes", "1").stdout
        head = run("kill-node", "head")
        assert head.returncode == 0 and "is the head" in head.stdout, head.stdout
        assert "kill a worker node instead (node-0, node-1)" in " ".join(head.stdout.split()), head.stdout
    finally:
        down = run("down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert run("status").returncode == 2  # nothing recorded any more


# Where six 1-CPU jobs ran: the node names Ray reports for them.
_WHERE = """
import json
from schooner.cluster import RayClient, ResourceConfig

def node():
    import time
    import ray
    time.sleep(0.3)
    me = ray.get_runtime_context().get_node_id()
    return next(n["NodeName"] for n in ray.nodes() if n["NodeID"] == me)

client = RayClient()
jobs = [client.submit(node, resources=ResourceConfig.with_cpu(1), name=f"where-{i}") for i in range(6)]
print(json.dumps(sorted({j.result() for j in jobs})))
"""


def test_a_gang_spreads_over_nodes_computes_as_one_process_and_restarts_whole(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    full = {**os.environ, **cluster.env()}
    proc = subprocess.run([sys.executable, str(HERE / "gang_driver.py"), str(tmp_path)], env=full,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert out["sum"] == [28.0, 28.0, 0.0, 2.0]  # 8 devices in 2 processes: the sum of one 8-device process
    assert out["starts"] == 2  # process 1 was killed once: the whole gang started again
    starts1 = (tmp_path / "starts-1").read_text().split()
    assert len(set(starts1)) == 2 and (tmp_path / "starts-0").read_text().split()[-1] == starts1[-1]
    assert out["node"] in {"head", "tpu-a", "tpu-b"}
