"""Run by test_writer.py in a subprocess: a shuffle and a write on real worker processes, slow enough that a
test can SIGKILL the whole process family while shards are half written."""

from __future__ import annotations

import sys
import time

from schooner.cluster import LocalClient
from schooner.data import Dataset


class SlowShard:
    """Pauses halfway through every shard: a kill then lands while a shard's temp file is half written."""

    def __init__(self, pause: float) -> None:
        self.pause = pause

    def __call__(self, records):
        records = list(records)
        half = len(records) // 2
        yield from records[:half]
        time.sleep(self.pause)
        yield from records[half:]


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    out, resume, pause = sys.argv[1], sys.argv[2] == "resume", float(sys.argv[3])
    ds = (
        Dataset.from_source("python-code", num_shards=6)
        .deduplicate("text", num_partitions=10, memory_budget=1 << 20)
        .map_shard(SlowShard(pause), name="slow")
    )
    with LocalClient(max_workers=2) as client:
        m = ds.write_jsonl(out, skip_existing=resume, client=client, progress=False)
    print("records", m["records"])
