"""Run by test_writer.py in a subprocess: write a record folder slowly so a test can SIGKILL it mid-write."""

from __future__ import annotations

import sys
import time

from schooner.data import Dataset


def slow_shard(records):
    # Pause halfway through every shard: a kill then lands while a shard's temp file is half written.
    records = list(records)
    half = len(records) // 2
    yield from records[:half]
    time.sleep(float(sys.argv[3]))
    yield from records[half:]


if __name__ == "__main__":
    out, resume, pause = sys.argv[1], sys.argv[2] == "resume", float(sys.argv[3])
    ds = Dataset.from_source("python-code", num_shards=10).map_shard(slow_shard, name="slow")
    m = ds.write_jsonl(out, skip_existing=resume, client="inline", progress=False)
    print("records", m["records"])
