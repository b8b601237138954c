"""Gather a Delphi suite's registration, or its held-out scores, from a prefix into one JSON file to commit.

    uv run python experiments/scaling/delphi_register.py forecasts PREFIX OUT.json --device "..."
    uv run python experiments/scaling/delphi_register.py scores PREFIX OUT.json --registration NAME.json

PREFIX is the suite's `SCHOONER_PREFIX` (the folder holding its `scaling/delphi-*` steps); it is only read.

`forecasts` (after `SCHOONER_DELPHI_PHASE=forecast`, before any held-out run): the Delphi fit, every
`scaling/delphi-forecast-{k}x` forecast (with its bootstrap replicates), the downstream forecasts and each
sweep run's final validation loss, with the commit they were made at. Committing that file is the
registration: git's history shows it existed before the runs it forecasts.

`scores` (after the held-out runs): every `...-score-s{seed}` step's score, the seed spread per budget and the
downstream scores, naming the registration file they score.

Refuses to write where OUT exists (a registration is never rewritten), where a step it needs is missing or not
finished, where a step is found twice under the prefix (a prefix holding two suites' steps: give the suite its
own prefix), or where a file holds NaN or Infinity; a refusal writes nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from schooner.cluster import records, storage

KEY = "[0-9a-f]" * 8
"""A step folder's name ends in its key's first 8 hex digits (`{name}-{key[:8]}`)."""


def _once(pattern: str) -> list[str]:
    """The folders matching `pattern`, refusing a step name found under two keys (two suites' steps)."""
    found = sorted(glob.glob(pattern))
    names = [folder.rsplit("/", 1)[1].rsplit("-", 1)[0] for folder in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        shown = [f for f in found if f.rsplit("/", 1)[1].rsplit("-", 1)[0] == twice[0]]
        raise SystemExit(
            f"{twice[0]} is found {len(shown)} times ({shown[:4]}): the prefix holds more than one suite: "
            "give each its own"
        )
    return found


def _one(pattern: str, what: str) -> str:
    """The one folder matching `pattern` (a step's name under one key; `_once` refuses two)."""
    found = _once(pattern)
    if not found:
        raise SystemExit(f"{what}: no folder matches {pattern}; has that phase run?")
    return found[0]


def _read(path: str) -> Any:
    def refuse(constant: str) -> Any:
        raise SystemExit(
            f"{path} holds {constant}, which is not JSON: the step that wrote it is broken; rerun it"
        )

    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def _finished(folder: str) -> str:
    record = records.read_step_record(folder) or {}
    if record.get("state") != records.StepState.SUCCESS:
        raise SystemExit(f"{folder}: its step is {record.get('state')}, not SUCCESS; finish the phase first")
    return folder


def _commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))  # this checkout's commit, wherever it is run from
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=here
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=here
    )
    return f"main at {head.stdout.strip()}" + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def forecasts(prefix: str, device: str) -> dict[str, Any]:
    """The registration record of the suite under `prefix`."""
    fit_dir = _finished(_one(f"{prefix}/scaling/delphi-fit-{KEY}", "the fit"))
    fit = _read(f"{fit_dir}/fit.json")
    guesses = {}
    for folder in _once(f"{prefix}/scaling/delphi-forecast-*x-{KEY}"):
        k = folder.rsplit("/", 1)[1].split("-")[2]
        guesses[k] = _read(f"{_finished(folder)}/forecast.json")
    if not guesses:
        raise SystemExit(
            f"no scaling/delphi-forecast-*x step under {prefix}: run SCHOONER_DELPHI_PHASE=forecast"
        )
    down_dir = _one(f"{prefix}/scaling/delphi-downstream-{KEY}", "the downstream fit")
    sweep = _finished(_one(f"{prefix}/scaling/delphi-{KEY}", "the sweep results"))
    losses = {}
    for _, row in storage.read_json_lines(f"{sweep}/runs.jsonl", what="the sweep results"):
        losses[row["name"].rsplit("/", 1)[1]] = round(float(row["loss"]), 5)
    return {
        "what": (
            "Delphi-suite loss and downstream forecasts registered before any held-out run (issue 38). The "
            "held-out runs must train on the same backend: compute_dtype 'auto' is float32 on a CPU, bfloat16 "
            "on an accelerator."
        ),
        "code": _commit(),
        "device": device,
        "budgets": sorted({float(r["budget"]) for r in fit["runs"]}) if "runs" in fit else None,
        "fit": {"delphi": fit["delphi"]},
        "forecasts": {k: guesses[k] for k in sorted(guesses, key=lambda s: int(s.rstrip("x")))},
        "downstream": _read(f"{_finished(down_dir)}/downstream.json"),
        "sweep_final_validation_loss": dict(sorted(losses.items())),
    }


def scores(prefix: str, registration: str, multiple: int | None = None) -> dict[str, Any]:
    """The held-out scores of the suite under `prefix`, against the registration file `registration`: of every
    held-out multiple scored so far, or of `multiple` alone (a suite's 10x runs scored before its 30x finish)."""
    rows = []
    which = "*" if multiple is None else str(multiple)
    for folder in _once(f"{prefix}/scaling/delphi-forecast-{which}x-score-s*-{KEY}"):
        seed = int(folder.split("-score-s")[1].split("-")[0])
        score = _read(f"{_finished(folder)}/score.json")
        rows.append({"step": folder.rsplit("/", 1)[1].rsplit("-", 1)[0], "seed": seed, **score})
    if not rows:
        raise SystemExit(
            f"no scaling/delphi-forecast-{which}x-score-s* step under {prefix}: have the held-out runs run?"
        )
    spread = {}
    for budget in sorted({r["budget"] for r in rows}):
        actual = [r["actual"] for r in rows if r["budget"] == budget]
        mean = float(np.mean(actual))
        predicted = next(r["predicted"] for r in rows if r["budget"] == budget)
        spread[f"{budget:.3g}"] = {
            "seeds": len(actual),
            "mean": mean,
            "std_pct": float(100 * np.std(actual, ddof=1) / mean) if len(actual) > 1 else None,
            "range": [min(actual), max(actual)],
            "mean_error_pct": 100 * (predicted - mean) / mean,
        }
    # each downstream-score step scores the held-out runs trained when it ran (one per call that trained some):
    # per (budget, seed) the newest row, for the budgets scored above
    down: dict[tuple[float, int], dict[str, Any]] = {}
    budgets = {r["budget"] for r in rows}
    for path in sorted(glob.glob(f"{prefix}/scaling/delphi-downstream-score-{KEY}"), key=os.path.getmtime):
        for row in _read(f"{_finished(path)}/score.json"):
            if row["budget"] in budgets:
                down[(row["budget"], row["seed"])] = row
    return {
        "what": "Held-out runs scored against their registered forecasts; error_pct = (predicted - actual) / actual x 100.",
        "registration": registration,
        "code": _commit(),
        "scores": rows,
        "seed_spread": spread,
        "downstream": [down[k] for k in sorted(down)] or None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what", choices=["forecasts", "scores"], help="the registration, or the held-out scores"
    )
    parser.add_argument("prefix", help="the suite's SCHOONER_PREFIX (read only)")
    parser.add_argument("out", help="the JSON file to write (OUT; refused if it exists)")
    parser.add_argument("--device", default="", help="where the sweep trained (forecasts)")
    parser.add_argument("--registration", default="", help="the registration file these score (scores)")
    parser.add_argument(
        "--multiple", type=int, default=None, help="only the runs at this multiple, e.g. 10 (scores)"
    )
    args = parser.parse_args(argv)
    if os.path.exists(args.out):
        raise SystemExit(
            f"{args.out} exists: a registration or score file is never rewritten; choose another name"
        )
    prefix = args.prefix.rstrip("/")
    if not os.path.isdir(prefix):
        raise SystemExit(
            f"no folder at {args.prefix}: give the suite's SCHOONER_PREFIX (the folder holding scaling/delphi-*)"
        )
    if args.what == "forecasts":
        if not args.device:
            raise SystemExit(
                "forecasts: say where the sweep trained, e.g. --device 'the 2-core CPU machine (float32)'"
            )
        record = forecasts(prefix, args.device)
    else:
        if not args.registration:
            raise SystemExit("scores: name the registration file they score, --registration delphi-....json")
        record = scores(prefix, args.registration, args.multiple)
    text = (
        json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n"
    )  # refused before a file is opened
    tmp = f"{args.out}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
