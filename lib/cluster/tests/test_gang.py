"""Gangs (`ResourceConfig(hosts=N)`): N processes of one job that start together, know each other
(`current_gang()`), and restart whole when one fails or dies. Checked with real multi-process JAX (CPU, gloo
collectives): a sum over 8 devices spread over 2 processes equals the sum in one process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from schooner.cluster import JobError, LocalClient, ResourceConfig, ResourcesUnavailableError, current_gang


def whoami() -> tuple[int, int, str]:
    g = current_gang()
    assert g is not None
    return g.process_id, g.num_processes, g.coordinator


def jax_sum_over_processes(devices_per_process: int) -> list[float]:
    """Every device holds its global index; the jitted sum crosses processes through gloo."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    g = current_gang()
    if g is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(g.coordinator, g.num_processes, g.process_id, initialization_timeout=120)
    assert jax.local_device_count() == devices_per_process, "XLA_FLAGS must be set before jax is imported"
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    x = jax.make_array_from_callback(
        (jax.device_count(), 2),
        NamedSharding(mesh, P("data")),
        lambda idx: jnp.full((1, 2), float(idx[0].start)),
    )
    total = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P()))(x)
    return [float(v) for v in jax.device_get(total)]


def jax_devices() -> int:
    import jax

    return jax.device_count()


def die_once(marker_dir: str) -> int:
    """Process 1 SIGKILLs itself on the gang's first start; the restarted gang succeeds."""
    g = current_gang()
    assert g is not None
    starts = Path(marker_dir) / f"starts-{g.process_id}"
    with open(starts, "a") as f:
        f.write(f"{g.attempt}\n")
    if g.process_id == 1 and len(starts.read_text().splitlines()) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return g.process_id


def raise_in_one(marker_dir: str) -> None:
    g = current_gang()
    assert g is not None
    with open(Path(marker_dir) / f"starts-{g.process_id}", "a") as f:
        f.write("x\n")
    if g.process_id == 1:
        raise ValueError("process 1 fails on purpose")
    import time

    time.sleep(60)  # would hold the gang forever if the others were not stopped


def test_a_gang_knows_its_members_and_returns_process_zeros_value(local_client: LocalClient) -> None:
    got = local_client.submit(whoami, resources=ResourceConfig.with_cpu(1, hosts=2)).result(timeout=120)
    assert got[0] == 0 and got[1] == 2 and got[2].startswith("127.0.0.1:")
    assert local_client.submit(current_gang).result(timeout=60) is None  # a plain job is no gang


def jax_env(devices_per_process: int) -> dict[str, str]:
    """A job with its own `env` gets a fresh worker, so jax sees the device count at import (a warm worker that
    already imported jax for an earlier test would keep its own)."""
    return {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
        "JAX_PLATFORMS": "cpu",
    }


@pytest.mark.slow
def test_multi_process_jax_equals_one_process(local_client: LocalClient) -> None:
    pytest.importorskip("jax", reason="jax is not a dependency of schooner-cluster (the exact guard's env)")
    local_client.submit(jax_devices).result(timeout=120)  # a warm worker that has imported jax already
    one = local_client.submit(jax_sum_over_processes, 8, resources=ResourceConfig(env=jax_env(8)))
    one = one.result(timeout=300)
    gang = ResourceConfig.with_cpu(1, hosts=2, env=jax_env(4))
    two = local_client.submit(jax_sum_over_processes, 4, resources=gang)
    assert two.result(timeout=300) == one == [28.0, 28.0]  # 0 + 1 + ... + 7 per column


def test_a_member_that_dies_restarts_the_whole_gang(local_client: LocalClient, tmp_path: Path) -> None:
    res = ResourceConfig.with_cpu(1, hosts=2, max_retries_preemption=1)
    assert local_client.submit(die_once, str(tmp_path), resources=res).result(timeout=180) == 0
    starts1 = (tmp_path / "starts-1").read_text().split()
    starts0 = (tmp_path / "starts-0").read_text().split()
    assert len(starts1) == 2 and len(set(starts1)) == 2  # process 1 died, then ran in a new start
    assert starts0[-1] == starts1[-1]  # process 0 ran in that new start too


def test_a_member_that_raises_stops_the_others_at_once(local_client: LocalClient, tmp_path: Path) -> None:
    import time

    t0 = time.monotonic()
    job = local_client.submit(raise_in_one, str(tmp_path), resources=ResourceConfig.with_cpu(1, hosts=2))
    with pytest.raises(JobError, match="process 1 fails on purpose"):
        job.result(timeout=120)
    assert time.monotonic() - t0 < 50  # process 0 was not waited for (it sleeps 60 s)
    assert (tmp_path / "starts-1").read_text().count("x") == 1  # no retries asked for: one start


def test_a_gang_larger_than_the_machine_is_refused(local_client: LocalClient) -> None:
    with pytest.raises(ResourcesUnavailableError, match="cpu=64"):
        local_client.submit(whoami, resources=ResourceConfig.with_cpu(1, hosts=64))
    with pytest.raises(ValueError, match="a gang, which is one job"):
        list(local_client.map(abs, [1], resources=ResourceConfig.with_cpu(1, hosts=2)))


def members_append(config: dict, out: str) -> int:
    """Each process appends its id; process 1 raises after appending on the gang's first start."""
    g = current_gang()
    assert g is not None
    with open(os.path.join(out, "members.txt"), "a") as f:
        f.write(f"{g.process_id} {g.attempt}\n")
    marker = Path(config["marker"])
    if g.process_id == 1 and not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("first start fails after writing")
    return g.process_id


def test_a_gang_step_prepares_its_folder_once_per_start(local_client: LocalClient, tmp_path: Path) -> None:
    from schooner.cluster import StepRunner, step, using_client

    res = ResourceConfig.with_cpu(1, hosts=2, max_retries_failure=1)
    h = step("gang", members_append, {"marker": str(tmp_path / "marker")}, resources=res)
    with using_client(local_client):
        result = StepRunner(prefix=str(tmp_path / "out"), quiet=True).run([h])
    assert result.ok and result[h].result == 0
    lines = (Path(result[h].output_path) / "members.txt").read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in lines) == ["0", "1"]  # the failed start's lines are gone
    assert len({line.split()[1] for line in lines}) == 1
