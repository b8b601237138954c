"""Step runner overhead: a 1,000-step DAG of trivial steps, first run and no-op rerun.

    uv run python benchmarks/step_runner.py [--steps 1000] [--client-steps 200] [--prefix DIR] [--s3-steps N]

Prints, for steps run in the runner process and for steps submitted to the LocalClient:
- first run: wall time and per-step overhead against a peer measured in the same run (calling the step
  functions in a plain loop, and submitting the same functions straight to the LocalClient);
- no-op rerun (everything cached): wall time, split into building the handles and `StepRunner.run`,
  and its ratio to the floor of reading every step's status file once (target: the rerun under 2 s);
- with `--s3-steps N`, the same for in-process steps on an `s3://` prefix served by a real S3 API server (moto,
  its own process, on this machine): the no-op rerun against object storage beside the one on local disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, replace

from schooner.cluster import LocalClient, ResourceConfig, StepRunner, step, using_client
from schooner.cluster.storage import storage_for


@dataclass(frozen=True)
class NodeConfig:
    index: int
    layer: int
    inputs: tuple
    payload: str = "x" * 32


def trivial(config: NodeConfig, output_path: str) -> int:
    """The work: write one small file (what a tiny real step does)."""
    text = json.dumps({"index": config.index, "inputs": list(config.inputs)})
    if "://" in output_path:
        import fsspec

        with fsspec.open(f"{output_path}/out.json", "w") as f:
            f.write(text)
    else:
        with open(os.path.join(output_path, "out.json"), "w") as f:
            f.write(text)
    return config.index


def build(
    n: int, *, width: int = 100, seed: int = 0, resources: ResourceConfig | None = None, tag: str = "s"
):
    """n steps in layers of `width`; each step after the first layer reads 2 random steps of the layer above."""
    rng = random.Random(seed)
    layers: list[list] = []
    for i in range(n):
        layer = i // width
        if layer == len(layers):
            layers.append([])
        above = layers[layer - 1] if layer else []
        inputs = tuple(rng.sample(above, 2)) if len(above) >= 2 else ()
        layers[layer].append(
            step(f"bench/{tag}{i:04d}", trivial, NodeConfig(i, layer, inputs), resources=resources)
        )
    return [h for layer in layers for h in layer]


def bench(
    label: str, n: int, prefix: str, resources: ResourceConfig | None, client: LocalClient | None
) -> dict:
    tag = "c" if resources else "p"
    handles = build(n, resources=resources, tag=tag)
    runner = StepRunner(prefix=prefix, client=client, quiet=True)
    t0 = time.perf_counter()
    first = runner.run(handles)
    first_s = time.perf_counter() - t0
    assert first.ok and len(first.succeeded) == n

    t0 = time.perf_counter()
    handles2 = build(n, resources=resources, tag=tag)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = runner.run(handles2)
    rerun_s = time.perf_counter() - t0
    assert again.ok and len(again.cached) == n

    # Floor for the rerun: read each status file once, nothing else.
    storage = storage_for(prefix)
    t0 = time.perf_counter()
    for o in again.steps:
        json.loads(storage.read_text(f"{o.output_path}/.schooner/status.json") or "")
    floor_s = time.perf_counter() - t0
    if "://" in prefix:  # no peer for the first run on an object store: the rerun is what this measures
        print(f"\n[{label}] {n} steps")
        print(f"  first run        {first_s:8.2f} s   ({first_s / n * 1e3:.2f} ms/step)")
        _print_rerun(rerun_s, build_s, floor_s, n)
        return {"first_s": first_s, "rerun_s": rerun_s, "build_s": build_s}

    # Peer for the first run: the same functions without a runner.
    scratch = tempfile.mkdtemp(prefix="bench-peer-")
    # each config with its input handles replaced by their folders, as the runner hands it to the function
    configs = [
        replace(h.config, inputs=tuple(os.path.join(scratch, d.dir_name) for d in h.config.inputs))
        for h in handles
    ]
    t0 = time.perf_counter()
    if client is None:
        for i, c in enumerate(configs):
            os.makedirs(os.path.join(scratch, str(i)), exist_ok=True)
            trivial(c, os.path.join(scratch, str(i)))
    else:
        jobs = []
        for i, c in enumerate(configs):
            os.makedirs(os.path.join(scratch, str(i)), exist_ok=True)
            jobs.append(client.submit(trivial, c, os.path.join(scratch, str(i)), resources=resources))
        for j in jobs:
            j.result()
    peer_s = time.perf_counter() - t0
    shutil.rmtree(scratch, ignore_errors=True)

    per_step_ms = (first_s - peer_s) / n * 1e3
    print(f"\n[{label}] {n} steps")
    print(
        f"  first run        {first_s:8.2f} s   ({first_s / n * 1e3:.2f} ms/step; peer without runner "
        f"{peer_s:.2f} s = {peer_s / n * 1e3:.2f} ms/step; ratio {first_s / peer_s:.1f}x)"
    )
    print(f"  runner overhead  {per_step_ms:8.2f} ms/step (first run minus peer, per step)")
    _print_rerun(rerun_s, build_s, floor_s, n)
    return {"first_s": first_s, "rerun_s": rerun_s, "build_s": build_s, "peer_s": peer_s}


def _print_rerun(rerun_s: float, build_s: float, floor_s: float, n: int) -> None:
    print(
        f"  no-op rerun      {rerun_s:8.3f} s   run() alone; + {build_s:.3f} s building the handles "
        f"= {rerun_s + build_s:.3f} s  [target < 2 s: {'met' if rerun_s + build_s < 2 else 'MISSED'}]"
    )
    print(
        f"  rerun floor      {floor_s:8.3f} s   reading {n} status files; rerun/floor "
        f"{rerun_s / max(floor_s, 1e-9):.1f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--client-steps",
        type=int,
        default=1000,
        help="steps for the LocalClient variant (each is a job in a worker process)",
    )
    ap.add_argument("--prefix", default=None, help="default: a temporary folder, removed afterwards")
    ap.add_argument(
        "--s3-steps",
        type=int,
        default=0,
        help="also run N in-process steps on an s3:// prefix (a local S3 server)",
    )
    args = ap.parse_args()
    root = args.prefix or tempfile.mkdtemp(prefix="bench-steps-")
    try:
        bench("in-process steps", args.steps, os.path.join(root, "inproc"), None, None)
        if args.client_steps:
            with LocalClient() as client, using_client(client):
                bench(
                    "LocalClient steps",
                    args.client_steps,
                    os.path.join(root, "local"),
                    ResourceConfig.with_cpu(0.25),
                    client,
                )
        if args.s3_steps:
            from schooner.cluster.testing import S3Server

            with S3Server() as server:
                os.environ.update(server.env())
                bench("in-process steps on s3://", args.s3_steps, server.bucket("bench"), None, None)
    finally:
        if args.prefix is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
