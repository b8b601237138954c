"""One step on an object-store prefix that writes rows as separate objects, slowly; names differ per
attempt, so a rerun that kept a killed attempt's objects would hold more than ROWS of them. EXP_LOG (a
local file) gets a line each time the step starts."""

import os
import time
import uuid
from dataclasses import dataclass

import fsspec

from schooner.cluster import ResourceConfig, StepRunner, step

ROWS = int(os.environ.get("APP_ROWS", "20"))
DELAY = float(os.environ.get("APP_DELAY", "0.1"))


@dataclass(frozen=True)
class RowsConfig:
    rows: int


def write_rows(config: RowsConfig, out: str) -> dict:
    if os.environ.get("EXP_LOG"):
        with open(os.environ["EXP_LOG"], "a") as f:
            f.write(f"start {os.getpid()}\n")
    attempt = uuid.uuid4().hex[:8]
    fs, root = fsspec.core.url_to_fs(out)
    for i in range(config.rows):
        fs.pipe_file(f"{root}/rows/{attempt}-{i:04d}.json", b'{"row": %d}' % i)
        time.sleep(DELAY)
    return {"rows": len(fs.ls(f"{root}/rows", refresh=True))}


rows = step("rows", write_rows, RowsConfig(ROWS), resources=ResourceConfig.with_cpu())

if __name__ == "__main__":
    StepRunner().main([rows])
