"""A DAG for a multi-node Ray cluster: where each step ran, and a resumable step that survives its node.

Knobs (environment): MN_ROWS (rows the resumable step writes, default 12), MN_DELAY (seconds per row,
default 0.5).
"""

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from schooner.cluster import ResourceConfig, StepRunner, step

ROWS = int(os.environ.get("MN_ROWS", "12"))
DELAY = float(os.environ.get("MN_DELAY", "0.5"))


def _node_name() -> str:
    import ray

    me = ray.get_runtime_context().get_node_id()
    return next(n["NodeName"] for n in ray.nodes() if n["NodeID"] == me)


@dataclass(frozen=True)
class Where:
    label: str
    after: Any = None


def where(config: Where, out: str) -> dict:
    with open(os.path.join(out, "node.txt"), "w") as f:
        f.write(_node_name())
    return {"node": _node_name()}


@dataclass(frozen=True)
class Rows:
    rows: int
    after: Any = None


def rows_on_a_tpu_host(config: Rows, out: str) -> dict:
    """Resumable: rows already in rows.txt are kept (a ledger), the rest appended one by one."""
    with open(os.path.join(out, "attempts.txt"), "a") as f:
        f.write(_node_name() + "\n")
    path = os.path.join(out, "rows.txt")
    done = 0
    if os.path.exists(path):
        with open(path) as f:
            done = len(f.read().splitlines())
    for i in range(done, config.rows):
        with open(path, "a") as f:
            f.write(json.dumps({"row": i}) + "\n")
        time.sleep(DELAY)
    with open(path) as f:
        return {"rows": len(f.read().splitlines()), "resumed_at": done}


first = step("mn/first", where, Where("first"), resources=ResourceConfig.with_cpu())
tpu = step("mn/on-tpu", where, Where("tpu", first), resources=ResourceConfig.with_tpu("v5p-8"))
rows = step(
    "mn/rows",
    rows_on_a_tpu_host,
    Rows(ROWS, tpu),
    resources=ResourceConfig.with_tpu("v5p-8", max_retries_preemption=2),
    resumable=True,
)
last = step("mn/last", where, Where("last", rows), resources=ResourceConfig.with_cpu())

if __name__ == "__main__":
    StepRunner().main([last])
