"""RayClient specifics on the real local Ray: resource mapping, environment, logs kept free of secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schooner.cluster import JobStatus, RayClient, ResourceConfig, ResourcesUnavailableError

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

SECRET = "rk-live-77c1d0a9b8e2f3"


def assigned_resources() -> dict:
    import ray

    return dict(ray.get_runtime_context().get_assigned_resources())


def test_resources_reach_ray_as_the_task_sees_them(ray_client):
    """Ray's own view from inside the task: what the scheduler reserved for it."""
    got = ray_client.submit(
        assigned_resources, resources=ResourceConfig.with_cpu(cpu=2, ram="256MiB")
    ).result(timeout=120)
    assert got["CPU"] == 2.0 and got["memory"] == 256 * 2**20
    half = ray_client.submit(assigned_resources, resources=ResourceConfig.with_cpu(cpu=0.5)).result(
        timeout=120
    )
    assert half["CPU"] == 0.5 and "memory" not in half


def test_accelerators_are_requested_under_rays_names(ray_client):
    """No GPU or TPU here: the refusal names the Ray resource the request maps to."""
    with pytest.raises(ResourcesUnavailableError, match="'TPU-v5p-8-head'"):
        ray_client.submit(abs, 1, resources=ResourceConfig.with_tpu("v5p-8"))
    with pytest.raises(ResourcesUnavailableError, match="device_count=2 GPUs"):
        ray_client.submit(abs, 1, resources=ResourceConfig.with_gpu("H100", count=2))


def test_secrets_travel_outside_runtime_env(ray_client):
    opts = ray_client._options(ResourceConfig.with_cpu(env={"HF_TOKEN": SECRET, "MODE": "fast"}), "j")
    assert opts["runtime_env"] == {"env_vars": {"MODE": "fast"}}


def test_multislice_is_refused_clearly(ray_client):
    with pytest.raises(ResourcesUnavailableError, match="slices=2"):
        ray_client.submit(abs, 1, resources=ResourceConfig.with_tpu("v5p-8", slices=2))


def flaky_job(marker: str) -> str:
    if not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError("first attempt fails")
    return "second attempt"


def test_exceptions_are_retried_per_resources(ray_client, tmp_path):
    res = ResourceConfig.with_cpu(max_retries_failure=1)
    assert (
        ray_client.submit(flaky_job, str(tmp_path / "m"), resources=res).result(timeout=120)
        == "second attempt"
    )


def print_secret_and_env() -> str:
    print(f"the key is {os.environ['SCHOONER_RAY_API_KEY']}", flush=True)
    return os.environ["SCHOONER_RAY_MODE"]


def test_secret_never_reaches_ray_log_files(ray_client):
    import ray

    res = ResourceConfig.with_cpu(env={"SCHOONER_RAY_API_KEY": SECRET, "SCHOONER_RAY_MODE": "loud"})
    job = ray_client.submit(print_secret_and_env, resources=res)
    assert job.result(timeout=120) == "loud"
    assert job.status() is JobStatus.SUCCEEDED
    assert "the key is ***" in job.logs()
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    leaked = [p for p in session.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"secret found in {leaked}"


def test_existing_connection_is_reused(ray_client):
    again = RayClient()  # ray is initialised in this process: connect to it, do not start another
    assert not again.started  # lazily: nothing happens until it is used
    assert again.submit(abs, -3).result(timeout=120) == 3
    assert again.started and again._owns_ray is False
    assert again.submit(abs, -5).result(timeout=60) == 5
    again.shutdown()  # does not stop the shared instance
    assert ray_client.submit(abs, -6).result(timeout=60) == 6


def test_a_second_process_connects_through_the_environment(ray_client):
    import subprocess
    import sys

    import ray

    address = ray._private.worker._global_node.address  # the shared local cluster's GCS address
    script = (
        "from schooner.cluster import RayClient, current_client\n"
        "client = current_client()\n"
        "assert isinstance(client, RayClient), client\n"
        "value = client.submit(abs, -7).result(timeout=120)  # connects (lazily) through the environment\n"
        "import ray\n"
        "print('gcs', ray.get_runtime_context().gcs_address, 'result', value)\n"
        "client.shutdown()\n"
    )
    env = {**os.environ, "SCHOONER_CLUSTER": address}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"gcs {address} result 7" in out.stdout  # it joined the running cluster, not a new local one


_TWO_NODES = """
import sys
from ray.cluster_utils import Cluster
from schooner.cluster import ConfigError, RayClient, ResourceConfig, StepRunner, step

def write(config, out):
    open(out + "/x.txt", "w").write("x")
    return 1

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
try:
    client = RayClient(address=cluster.address)
    h = step("w", write, {"n": 1}, resources=ResourceConfig.with_cpu())
    try:
        StepRunner(prefix=sys.argv[1], client=client, quiet=True).run([h])
        print("NOT REFUSED")
    except ConfigError as e:
        print("REFUSED", e)
    result = StepRunner(prefix=sys.argv[1], client=client, quiet=True, shared_prefix=True).run([h])
    print("SHARED", result[h].state)
    client.shutdown()
finally:
    cluster.shutdown()
"""


@pytest.mark.slow
def test_a_local_prefix_is_refused_on_a_cluster_of_several_nodes(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", _TWO_NODES, str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout and "the Ray cluster has 2 nodes" in out.stdout, out.stdout
    assert "SHARED succeeded" in out.stdout
