"""What the offline-input steps of `schooner.data.curation.steps` run: held-out documents of an embedded
source, the offline crawl and junk texts of `schooner.data.fixtures`."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from schooner.data import write_records
from schooner.data.fixtures import build_crawl, junk_records
from schooner.data.sources import iter_source

from ._step_io import read_all


@dataclass(frozen=True)
class HeldOutConfig:
    source: str = "python-docs"
    count: int = 40
    min_chars: int = 800
    seed: int = 0
    python: str = ""


def run_held_out_docs(config: HeldOutConfig, output_path: str) -> dict:
    def rank(r: dict) -> str:
        return hashlib.blake2b(f"{config.seed}:{r['id']}".encode(), digest_size=8).hexdigest()

    docs = sorted((r for r in iter_source(config.source) if len(r["text"]) >= config.min_chars), key=rank)
    picked = [{**r, "source": f"{config.source}-heldout"} for r in docs[: config.count]]
    manifest = write_records(picked, output_path, format="jsonl", num_shards=1)
    return {"records": manifest["records"], "ids": [r["id"] for r in picked[:5]]}


@dataclass(frozen=True)
class CrawlStepConfig:
    crawl: Any
    plant_from: Any = ()
    plant: int = 0


def run_crawl(config: CrawlStepConfig, output_path: str) -> dict:
    crawl = config.crawl
    if config.plant:
        docs = list(read_all(config.plant_from))[: config.plant]
        texts = tuple("\n".join(p for p in d["text"].split("\n\n")[:3]) for d in docs)
        crawl = dataclasses.replace(crawl, plant=texts)
    info = build_crawl(output_path, crawl)
    return {k: v for k, v in info.items() if k != "config"}


@dataclass(frozen=True)
class JunkConfig:
    count: int = 400
    seed: int = 1


def run_offline_junk(config: JunkConfig, output_path: str) -> dict:
    recs = junk_records(config.count, config.seed)
    manifest = write_records(recs, output_path, format="jsonl", num_shards=1)
    kinds: dict[str, int] = {}
    for r in recs:
        kinds[r["metadata"]["kind"]] = kinds.get(r["metadata"]["kind"], 0) + 1
    return {"records": manifest["records"], "kinds": kinds}
