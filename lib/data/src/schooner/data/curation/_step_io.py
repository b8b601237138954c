"""What the curation steps share when they run: their one input folder, all their input records, the
summary of a manifest a step returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from schooner.data._readers import read_shards
from schooner.data.step_inputs import input_locations


def one_folder(inputs: Any, what: str) -> str:
    locs = input_locations(inputs)
    if len(locs) != 1:
        raise ValueError(f"{what} takes one record folder, got {locs}")
    return locs[0]


def read_all(inputs: Any) -> Iterator[dict]:
    for loc in input_locations(inputs):
        yield from read_shards(loc)


def summary(manifest: dict) -> dict:
    return {"records": manifest["records"], "counters": manifest["counters"], "errors": manifest["errors"]}
