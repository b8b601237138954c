"""The Delphi suite (issue 38): an isoFLOP sweep with the token-horizon recipe and AdamH on text that is never
repeated, the Delphi fit, forecasts registered before their held-out runs (three seeds at 10x and 30x the
largest fitted budget), and downstream forecasts of a multiple-choice task.

    uv run python experiments/scaling/delphi_suite.py                      # the sizing below (about 45 min here)
    SCHOONER_DELPHI_BUDGETS=1e11,3e11,1e12,3e12,1e13 uv run python experiments/scaling/delphi_suite.py

SCHOONER_DELPHI_PHASE=data stops after the data steps (to pack them for another machine:
experiments/scaling/device/); =sweep stops after the sweep and its task scores; =forecast after the fits and the registered
forecasts (to run the held-out runs later, e.g. on the accelerator the sweep ran on: experiments/scaling/device/);
=heldout runs the held-out runs and scores the loss forecasts, without the task scores and downstream fit (which
need the sweep's checkpoints). SCHOONER_DELPHI_DOWNSTREAM=0 leaves the downstream fit out of the forecast phase
too (sweep records without checkpoints, as a lent machine brings back). SCHOONER_DELPHI_TRAIN_HELD_OUT=10 trains
only the 10x held-out runs of a registration that holds more (SCHOONER_DELPHI_HELD_OUT=10,30: the 30x runs
train later, against the same registered forecasts).
Every step is cached under the prefix (a rerun does only what is missing; adding a budget reruns nothing
done). In order:

1. `data/site-packages`, `tokenizers/site-packages-bpe-1k`, `tokenized/site-packages-bpe1k`: the installed
   packages' Python source and docs, deduplicated (120 MB of text, 51M tokens; no run reads more than a
   fraction of it, so nothing is repeated), a 1024-token BPE and the token caches
   (`experiments/scaling/delphi_data.py`); `tasks/site-packages-cloze`: "which line comes next" with four
   choices, from files past the training cut (`cloze.py`).
2. `scaling/delphi`: per budget of `BUDGETS` (the one list to change), `SIZES` models of the horizon family
   around the recipe's prior optimum, each a `train_lm` step (AdamH, the token-horizon rule), with its final
   loss on the whole validation split (`SCHOONER_DELPHI_SWEEP_SEEDS=n`: n seeds of each, `-s1`... beside seed
   0's, so each budget's parabola averages seed noise); `scaling/delphi-cloze/*`: each run scored on the task
   by `schooner.eval.steps.evaluate`.
3. `scaling/delphi-fit`: approaches 2 and 3, variable projection and the Delphi fit (parabolas in log
   tokens, L(C) = E + A C^-alpha through the optima, bootstrap over budgets); `scaling/delphi-downstream`:
   the soft task metrics fitted against compute the same way, and the sigmoid from soft to hard.
4. `scaling/delphi-forecast-{10,30}x`: the Delphi forecast of the compute-optimal run at 10x and 30x,
   written (with the downstream forecasts) before the held-out runs are declared; then the held-out runs
   `scaling/delphi-heldout/{k}x-s{seed}` (seeds 0, 1, 2), their task scores, and `...-score-s{seed}` steps
   scoring each forecast (error, inside the interval, registered before the run).
5. `scaling/delphi-summary`: one JSON and the plots (docs/scaling.md shows them).

Sizing: the full suite of the issue (about two hours on an idle 2-core machine at the 2.5e10 FLOP/s the old
1e14 run reached) is `SCHOONER_DELPHI_BUDGETS=1e11,3e11,1e12,3e12,1e13`; the default here fits in about
45 minutes of a machine shared by six processes (about 4e9 FLOP/s measured).
"""

from __future__ import annotations

import json
import os

from experiments.scaling.delphi_data import DATA, cloze, tokenizer, tokens
from experiments.scaling.delphi_recipe import RECIPE, RULE, SEQ_LEN  # noqa: F401 (RULE: the suite's names)
from schooner.cluster import StepRunner
from schooner.eval import Task
from schooner.eval.steps import evaluate
from schooner.train.scaling import (
    isoflop_runs,
    sweep_results,
)

BUDGETS = tuple(
    float(b)
    for b in os.environ.get("SCHOONER_DELPHI_BUDGETS", "3.75e9,7.5e9,1.5e10,3e10,6e10,1.2e11").split(",")
)
"""The fitted budgets (FLOPs): the one list to change."""


def _multiples(variable: str, default: str) -> tuple[int, ...]:
    """The comma-separated positive integers of the environment variable `variable` (`default` if unset)."""
    text = os.environ.get(variable, default)
    parts = [k.strip() for k in text.split(",")]
    if not all(k.isascii() and k.isdigit() and int(k) > 0 for k in parts):
        raise ValueError(
            f"{variable}={text!r}: give multiples as comma-separated positive integers, e.g. 10,30"
        )
    return tuple(int(k) for k in parts)


HELD_OUT = _multiples("SCHOONER_DELPHI_HELD_OUT", "10,30")
"""Held-out budgets as multiples of the largest fitted one."""
TRAIN_HELD_OUT = _multiples("SCHOONER_DELPHI_TRAIN_HELD_OUT", ",".join(map(str, HELD_OUT)))
"""The held-out multiples whose runs train now (default: all of `HELD_OUT`). Every multiple of `HELD_OUT` is
still forecast and registered, so the same registration serves runs trained in later sessions (the CPU suite's
30x runs take hours)."""
if not set(TRAIN_HELD_OUT) <= set(HELD_OUT):
    raise ValueError(
        f"SCHOONER_DELPHI_TRAIN_HELD_OUT={os.environ['SCHOONER_DELPHI_TRAIN_HELD_OUT']!r}: each multiple must be one of "
        f"SCHOONER_DELPHI_HELD_OUT={','.join(map(str, HELD_OUT))} (the registered ones), e.g. {HELD_OUT[0]}"
    )
SEEDS = tuple(range(int(os.environ.get("SCHOONER_DELPHI_SEEDS", "3"))))
SIZES = int(os.environ.get("SCHOONER_DELPHI_SIZES", "6"))
_sweep_seeds = os.environ.get("SCHOONER_DELPHI_SWEEP_SEEDS", "1")
if not _sweep_seeds.isdigit() or int(_sweep_seeds) < 1:
    raise ValueError(
        f"SCHOONER_DELPHI_SWEEP_SEEDS={_sweep_seeds!r}: a count of runs per sweep point (seeds 0..n-1), 1 or more, "
        "e.g. 2 (the held-out runs' seeds are SCHOONER_DELPHI_SEEDS)"
    )
SWEEP_SEEDS = int(_sweep_seeds)
"""Runs per sweep point (seeds 0..n-1): more than 1 averages seed noise out of each budget's vertex; seed 0's
runs stay the same steps, so raising it on a finished sweep trains only the new seeds."""
_spread = os.environ.get("SCHOONER_DELPHI_SPREAD", "1.7")
try:
    SPREAD = float(_spread)
except ValueError:
    SPREAD = float("nan")
if not SPREAD > 1:
    raise ValueError(
        f"SCHOONER_DELPHI_SPREAD={_spread!r}: the ratio between neighbouring sizes of a budget's grid, a number > 1, "
        "e.g. 1.3 (narrower: a grid over less of the isoFLOP curve, where a parabola fits it better)"
    )
"""The isoFLOP grid's ratio between neighbouring sizes (`isoflop_runs(spread=)`): six sizes at 1.7 span about 14x in
D. A run of both grids (the same width at a budget) is the same step."""
CHECKPOINT_EVERY = int(os.environ.get("SCHOONER_DELPHI_CHECKPOINT_EVERY", "0")) or None
"""Checkpoint every N steps (0: only at the end). Runtime-only (not in any step's key): set it where a call is
cut off, so a rerun resumes the runs from their last checkpoint (experiments/scaling/device/run.sh: 1000)."""
TRAIN = dict(
    eval_max_tokens=None, checkpoint_every=CHECKPOINT_EVERY, resources=None, data_in_memory_bytes=512 * 2**20
)
"""Whole validation split (no sampling noise), checkpoints as above, in the runner's process, the training
tokens held in memory (about 100 MiB a run; runtime-only: the batches and the keys are the same, and a tiny
model's step no longer waits on reads)."""

sweep_kwargs = dict(budgets=BUDGETS, data=DATA, sizes_per_budget=SIZES, recipe=RECIPE, spread=SPREAD, **TRAIN)
if SWEEP_SEEDS > 1:  # without it, the sweep's steps are the ones it always had
    sweep_kwargs["seeds"] = tuple(range(SWEEP_SEEDS))
runs = isoflop_runs("scaling/delphi", **sweep_kwargs)
sweep = sweep_results("scaling/delphi", runs)  # isoflop_sweep's step, the grid declared (and warned of) once


def cloze_task_def(cloze_path: str) -> Task:
    return Task(name="sp_cloze", path=f"{cloze_path}/cloze.jsonl", layout="examples", delimiter="")


def cloze_eval(name: str, run, cloze_path: str):
    """The run's final checkpoint scored on the cloze task."""
    return evaluate(
        name, checkpoint=run, tokenizer=tokenizer, seq_len=SEQ_LEN, tasks=[cloze_task_def(cloze_path)],
        task_batch_size=32,
    )  # fmt: skip


def main() -> None:
    runner = StepRunner()
    data = runner.main([tokens, cloze])
    if data.dry_run or os.environ.get("SCHOONER_DELPHI_PHASE") == "data":  # the data steps only
        return
    cloze_path = data[cloze].output_path
    evals = [
        cloze_eval(f"scaling/delphi-cloze/{r.train.name.split('/')[-1]}", r.train, cloze_path) for r in runs
    ]
    if os.environ.get("SCHOONER_DELPHI_PHASE") == "sweep":
        done = runner.main([sweep, *evals])
        print(json.dumps(done[sweep].result, indent=1))
        return
    # The task scores of the sweep runs are needed only by the downstream fit: they run beside the held-out
    # runs, after the loss forecasts are registered (held_out_phase)
    runner.main([sweep])
    from experiments.scaling.delphi_heldout import held_out_phase

    held_out_phase(runner, sweep, runs, evals, cloze_path)


if __name__ == "__main__":
    main()
