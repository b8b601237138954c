"""Runs gang jobs on the Ray cluster in RAY_ADDRESS and prints their results as JSON (for test_multinode)."""

import json
import os
import signal
import sys
from pathlib import Path

from schooner.cluster import RayClient, ResourceConfig, current_gang


def jax_sum(devices_per_process: int) -> list[float]:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_process}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    g = current_gang()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(g.coordinator, g.num_processes, g.process_id, initialization_timeout=120)
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    x = jax.make_array_from_callback(
        (jax.device_count(), 2),
        NamedSharding(mesh, P("data")),
        lambda idx: jnp.full((1, 2), float(idx[0].start)),
    )
    total = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P()))(x)
    return [float(v) for v in jax.device_get(total)] + [float(g.process_id), float(jax.process_count())]


def die_once(marker_dir: str) -> str:
    import ray

    g = current_gang()
    starts = Path(marker_dir) / f"starts-{g.process_id}"
    with open(starts, "a") as f:
        f.write(f"{g.attempt}\n")
    if g.process_id == 1 and len(starts.read_text().splitlines()) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    me = ray.get_runtime_context().get_node_id()
    return next(n["NodeName"] for n in ray.nodes() if n["NodeID"] == me)


if __name__ == "__main__":
    client = RayClient(address=os.environ["RAY_ADDRESS"])
    gang = ResourceConfig.with_cpu(1, hosts=2, max_retries_preemption=1)
    out = {"sum": client.submit(jax_sum, 4, resources=gang).result(timeout=600)}
    job = client.submit(die_once, sys.argv[1], resources=gang)
    out["node"] = job.result(timeout=600)
    out["starts"] = job.starts
    print("RESULT", json.dumps(out))
    client.shutdown()
