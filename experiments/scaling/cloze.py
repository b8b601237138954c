"""A multiple-choice task built from text no run trains on: which line comes next?

Each document takes one held-out file of the installed packages (`site_packages.held_out_files`: the files
past the training corpus' cut), a context of its lines ending at a line break (at most `context_chars`), and
four choices for the next line: the true one and three lines of the same length band drawn from other
held-out files. A model that knows Python and its docs puts more probability on the true line. The rows use
`schooner.eval`'s "examples" layout (`{"contexts": [ctx], "continuations": [4 lines], "gold": k}`), so the
public `evaluate` step scores them (`acc`, `prob_norm`, `logprob`, and per document each choice's
log-probability and byte length).

Deterministic: a function of the held-out files and the config's seed.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster import StepHandle, step

from .site_packages import SitePackagesConfig, check_installed, current_installed, held_out_files

__all__ = ["ClozeConfig", "build_cloze", "cloze_task"]

VERSION = "site-packages-cloze-v2"  # v2: the held-out files of site-packages-v2
CHOICES = 4


@dataclass(frozen=True)
class ClozeConfig:
    """Config of the `cloze_task` step."""

    skip_bytes: int
    """The training corpus' `max_bytes`: only files past it are used."""
    documents: int = 400
    context_chars: int = 300
    min_line: int = 20
    max_line: int = 80
    """The answer line's length in characters (stripped of its newline)."""
    seed: int = 0
    installed: str = field(default_factory=current_installed)
    """The installed distributions' digest the held-out files come from (`site_packages.installed_digest`)."""


def _lines(text: str, cfg: ClozeConfig) -> list[int]:
    """Indices of the lines that can be answers: the right length, not blank, with context before them."""
    lines = text.split("\n")
    out, pos = [], 0
    for i, line in enumerate(lines):
        if i > 0 and pos >= 40 and cfg.min_line <= len(line.strip()) <= cfg.max_line:
            out.append(i)
        pos += len(line) + 1
    return out


def build_cloze(files: list[dict[str, Any]], cfg: ClozeConfig) -> list[dict[str, Any]]:
    """The task's rows from held-out records (`{"id", "text"}`)."""
    rng = random.Random(cfg.seed)
    order = list(range(len(files)))
    rng.shuffle(order)
    candidates = []
    for k in order:
        lines = files[k]["text"].split("\n")
        ok = _lines(files[k]["text"], cfg)
        if ok:
            candidates.append((files[k]["id"], lines, ok))
    if len(candidates) < cfg.documents + CHOICES:
        raise ValueError(
            f"cloze_task: {len(candidates)} held-out files have usable lines; {cfg.documents} documents asked: "
            "lower documents or the training corpus' max_bytes"
        )
    pool = [(src, lines[i].strip()) for src, lines, ok in candidates[cfg.documents :] for i in ok]
    rows = []
    for src, lines, ok in candidates[: cfg.documents]:
        i = rng.choice(ok)
        context = "\n".join(lines[:i]) + "\n"
        context = context[-cfg.context_chars :]
        cut = context.find("\n")
        context = context[cut + 1 :] if 0 <= cut < len(context) - 1 else context
        answer = lines[i].strip()
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        others: list[str] = []
        while len(others) < CHOICES - 1:
            _, line = pool[rng.randrange(len(pool))]
            if line != answer and line not in others and abs(len(line) - len(answer)) <= 15:
                others.append(line)
        gold = rng.randrange(CHOICES)
        choices = [indent + c for c in others]
        choices.insert(gold, indent + answer)
        rows.append({"contexts": [context], "continuations": choices, "gold": gold, "source": src})
    return rows


def _write(cfg: ClozeConfig, output_path: str) -> dict[str, Any]:
    check_installed(cfg.installed, "the cloze task")
    files = held_out_files(SitePackagesConfig(max_bytes=cfg.skip_bytes, installed=cfg.installed))
    rows = build_cloze(files, cfg)
    os.makedirs(output_path, exist_ok=True)
    with open(f"{output_path}/cloze.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return {"documents": len(rows), "held_out_files": len(files), "path": f"{output_path}/cloze.jsonl"}


def cloze_task(
    name: str, *, skip_bytes: int, documents: int = 400, seed: int = 0, installed: str | None = None
) -> StepHandle:
    """A step writing `cloze.jsonl` (see the module docstring). `installed`: default this interpreter's
    distributions' digest."""
    cfg = ClozeConfig(
        skip_bytes=skip_bytes, documents=documents, seed=seed, installed=installed or current_installed()
    )
    return step(name, _write, cfg, version=VERSION, description="which line comes next, on held-out files")
