"""Regenerate the decisions in `datatrove_decisions.jsonl`: for each fixed text (`id`, `text`), what
datatrove's own filters decide (`[keep, reason]`) for Gopher quality, Gopher repetition, FineWeb and C4 at
their default settings. `test_rules_datatrove.py` checks that `schooner.data.curation`'s rules decide the same,
without installing datatrove.

The texts (kept as they are) are 60 made-up texts stressing the rules (bullets, ellipses, stop words in
capitals, punctuation-only words, blank lines, citations, curly brackets) and 200 drawn from the embedded
Python docs and code, junk texts and pages of the offline crawl, cut at a line before 1,500 characters.

    python3 -m venv /tmp/dt && /tmp/dt/bin/pip install datatrove spacy nltk
    /tmp/dt/bin/python lib/data/tests/reference/make_datatrove_decisions.py [texts.jsonl]

With a `texts.jsonl` argument its rows (`id`, `text`) replace the texts.
"""

from __future__ import annotations

import json
import pathlib
import sys
from importlib.metadata import version

from datatrove.data import Document
from datatrove.pipeline.filters import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)

FIXTURE = pathlib.Path(__file__).with_name("datatrove_decisions.jsonl")
FILTERS = {
    "gopher_quality": GopherQualityFilter,
    "gopher_repetition": GopherRepetitionFilter,
    "fineweb": FineWebQualityFilter,
    "c4": C4QualityFilter,
}


def decide(text: str) -> dict[str, list]:
    out = {}
    for name, make in FILTERS.items():
        res = make().filter(Document(text=text, id="x"))
        out[name] = [True, None] if res is True else [bool(res[0]), res[1]]
    return out


def main() -> None:
    source = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [(r["id"], r["text"]) for r in rows if "text" in r]
    lines = [json.dumps({"datatrove": version("datatrove"), "spacy": version("spacy")})]
    lines += [json.dumps({"id": i, "text": t, **decide(t)}, ensure_ascii=False) for i, t in texts]
    FIXTURE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}: {len(texts)} texts")


if __name__ == "__main__":
    main()
