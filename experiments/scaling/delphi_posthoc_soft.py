"""A check after the fact, not a forecast: would a length-normalised choice loss have held where the registered
`choice_loss` forecast missed (docs/scaling.md, the v5e suite's downstream section)?

    uv run python experiments/scaling/delphi_posthoc_soft.py PREFIX

From each cloze evaluation's per-document records (`tasks/*.jsonl`: each choice's log-probability and length in
bytes) of the sweep (`scaling/delphi-cloze/*`) and the held-out runs (`scaling/delphi-heldout/*-cloze-*`) under
PREFIX, it computes -ln p(right | choices) with raw and with per-byte log-probabilities, fits each on the sweep
with `fit_delphi` as the suite fits its soft metrics, and prints the forecast at 1e14 and 3e14 against each
held-out seed. Nothing here was registered: it reads runs that already exist.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import numpy as np

from schooner.train.scaling import ScalingRun, fit_delphi, read_runs


def choice_losses(path: str) -> dict[str, float]:
    """Mean -ln p(right | choices) of one evaluation's documents, from raw and from per-byte log-probabilities."""
    with open(path) as f:
        docs = [json.loads(line) for line in f]
    out = {}
    for name, scale in (("raw", lambda lp, nb: lp), ("per_byte", lambda lp, nb: lp / nb)):
        losses = []
        for d in docs:
            lp = scale(np.asarray(d["logprobs"], float), np.asarray(d["norm_bytes"], float))
            top = lp.max()
            losses.append(-(lp[d["gold"]] - top - math.log(np.exp(lp - top).sum())))
        out[name] = float(np.mean(losses))
    return out


def main(prefix: str) -> None:
    (sweep_dir,) = [p for p in glob.glob(f"{prefix}/scaling/delphi-*") if os.path.exists(f"{p}/runs.jsonl")]
    meta = {r.name.split("/")[-1]: r for r in read_runs(sweep_dir)}
    sweep = {}
    for d in glob.glob(f"{prefix}/scaling/delphi-cloze/*"):
        sweep[os.path.basename(d).rsplit("-", 1)[0]] = choice_losses(glob.glob(f"{d}/tasks/*.jsonl")[0])
    held = {}
    for d in sorted(glob.glob(f"{prefix}/scaling/delphi-heldout/*-cloze-*")):
        held[os.path.basename(d).split("-cloze")[0]] = choice_losses(glob.glob(f"{d}/tasks/*.jsonl")[0])
    for key in ("raw", "per_byte"):
        runs = [
            ScalingRun(budget=meta[n].budget, tokens=meta[n].tokens, params=meta[n].params, loss=m[key])
            for n, m in sweep.items()
        ]
        fit = fit_delphi(runs, samples=1000, skip_unbracketed=True)
        print(f"{key}: {fit.law}; dropped {[d['budget'] for d in fit.dropped]}")
        for name, m in held.items():
            largest = max(r.budget for r in runs)
            f = fit.forecast(largest * float(name.split("x")[0]))
            lo, hi = f["interval"]["low"], f["interval"]["high"]
            inside = lo <= m[key] <= hi
            print(f"  {name}: forecast {f['loss']:.4f} [{lo:.4f}, {hi:.4f}], actual {m[key]:.4f}, "
                  f"error {100 * (f['loss'] - m[key]) / m[key]:+.2f}%, inside {inside}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SCHOONER_PREFIX", "schooner-output"))
