"""IsoFLOP sweeps as steps: a `train_lm` step per (budget, size), optional evaluation steps, and a results
step that collects each run's FLOPs, parameters, tokens and final validation loss and bits per byte.

    >>> sweep = isoflop_sweep("scaling/python", budgets=[1e12, 3e12, 1e13], data={docs: 0.2, code: 0.8})  # doctest: +SKIP

Every run shares the tokenized inputs (the `data` handles); each is an ordinary, cached `train_lm` step, so
adding a budget reruns nothing that is done. The results step's folder holds `runs.jsonl` (one
`ScalingRun` per line, plus the run's shape and hyperparameters, and the `warnings` the recipe gave about its
budget's grid) and `isoflops.png`; its result lists those warnings per budget, so a reader of the results sees a
one-sided grid or runs below `min_steps` without the declaring process's log.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, records, step, storage

from ._law import ScalingRun
from ._recipe import Recipe, ScalingRecipe

__all__ = ["SweepRun", "isoflop_runs", "isoflop_sweep", "read_runs", "run_loss"]

VERSION = "isoflop-results-v3"  # v2: the recipe's grid warnings per run and per budget; v3: each run's data
_CPU = ResourceConfig.with_cpu()
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepRun:
    """One planned run of a sweep: its recipe and its steps."""

    recipe: Recipe
    train: StepHandle
    evaluation: StepHandle | None = None
    warnings: tuple[str, ...] = ()
    """What the recipe warned of about its budget's grid (`ScalingRecipe.isoflop_grid`: a grid on one side
    of the prior optimum, runs below `min_steps`); also logged when the runs are declared."""


def isoflop_runs(
    name: str,
    *,
    budgets: Iterable[float],
    data: Mapping[Any, float],
    sizes_per_budget: int = 5,
    recipe: ScalingRecipe | None = None,
    spread: float = 2.0,
    evaluate: Callable[[str, StepHandle], StepHandle] | None = None,
    seeds: Sequence[int] | None = None,
    **train_kwargs: Any,
) -> list[SweepRun]:
    """The runs of an isoFLOP sweep: per budget, `sizes_per_budget` family members around the recipe's prior
    optimum (`ScalingRecipe.isoflop_grid`), each a `train_lm` step named `{name}/{budget}-w{width}`, with the
    grid's warnings about its budget (`SweepRun.warnings`).

    Args:
        evaluate: builds an evaluation step from (name, train handle), e.g. with
            `schooner.eval.steps.evaluate`; its `results.json` then gives the loss. None: the train step's own
            final validation (`eval/loss` in `metrics.jsonl`).
        seeds: train every grid point once per seed (`train_lm`'s `seed`: initialisation and data order), so
            a budget's parabola is fitted through repeated runs and its vertex holds less of one run's seed
            noise. Seed 0's runs keep the plain names (`{name}/{budget}-w{width}`: the same steps as a sweep
            without `seeds`, so adding seeds to a finished sweep trains only the new runs); the others are
            named `{name}/{budget}-w{width}-s{seed}`. None: one run per point at `train_kwargs`'
            seed (train_lm's default 0).
        train_kwargs: more `train_lm` arguments (validation, tokenizer, seed, eval_max_tokens, resources...).

    Raises:
        ValueError: `seeds` empty, repeated or not integers, or given beside a `seed` in `train_kwargs`.
    """
    from schooner.train.steps import train_lm

    recipe = recipe or ScalingRecipe()
    train_kwargs.setdefault("checkpoint_every", None)  # one checkpoint, at the end
    per_seed = _seeded(seeds, train_kwargs)
    runs = []
    for budget in budgets:
        grid, warnings = recipe._isoflop_grid(float(budget), sizes_per_budget, spread)
        for message in warnings:
            logger.warning(message)
        for r in grid:
            for suffix, seed_kwargs in per_seed:
                run_name = f"{name}/{budget:.2e}-w{r.width}{suffix}"
                train = train_lm(run_name, **r, datasets=dict(data), **seed_kwargs, **train_kwargs)
                ev = evaluate(f"{run_name}-eval", train) if evaluate is not None else None
                runs.append(SweepRun(recipe=r, train=train, evaluation=ev, warnings=tuple(warnings)))
    return runs


def _seeded(seeds: Sequence[int] | None, train_kwargs: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`(name suffix, train_lm seed kwargs)` per seed: `[("", {})]` without `seeds` (train_kwargs' own seed)."""
    if seeds is None:
        return [("", {})]
    if isinstance(seeds, numbers.Integral | str):  # seeds=2 for "two seeds": a count where a list belongs
        raise ValueError(
            f"isoflop sweep: seeds is the list of seeds, got {seeds!r}; for {seeds} seeds per point give "
            f"seeds=range({seeds}) (or e.g. seeds=[0, 1])"
        )
    # any integer (np.arange(2)'s np.int64 too), kept as a plain int so the step keys are seeds=[0, 1]'s
    seeds = [int(s) if isinstance(s, numbers.Integral) and not isinstance(s, bool) else s for s in seeds]
    if "seed" in train_kwargs:
        raise ValueError(
            f"isoflop sweep: give the seeds once, as seeds={seeds} or as seed={train_kwargs['seed']}, not both"
        )
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int)]
    if not seeds or bad or len(set(seeds)) < len(seeds):
        raise ValueError(
            f"isoflop sweep: seeds must be distinct integers, at least one; got {seeds!r} (e.g. seeds=[0, 1])"
        )
    return [("" if seed == 0 else f"-s{seed}", {"seed": seed}) for seed in seeds]


@dataclass(frozen=True)
class SweepResultsConfig:
    """Config of the sweep-results step."""

    runs: list
    """`[{"budget": C, "name": str, "train": handle, "evaluation": handle or None, "warnings": [str]}, ...]`."""
    metric: str = "eval/loss"
    """The `metrics.jsonl` key read when a run has no evaluation step."""


def isoflop_sweep(
    name: str,
    *,
    budgets: Iterable[float],
    data: Mapping[Any, float],
    sizes_per_budget: int = 5,
    recipe: ScalingRecipe | None = None,
    spread: float = 2.0,
    evaluate: Callable[[str, StepHandle], StepHandle] | None = None,
    resources: ResourceConfig | None = _CPU,
    seeds: Sequence[int] | None = None,
    **train_kwargs: Any,
) -> StepHandle:
    """An isoFLOP sweep (Hoffmann et al. 2022, approach 2's design) as steps; returns the results step.

    See `isoflop_runs` for the arguments; `resources` is where each training run goes (None: in the
    runner's process). The results step runs in the runner's process (it only reads small files); its
    result holds `runs`, `budgets`, the `best_loss` per budget and the recipe's `warnings` per budget.
    """
    runs = isoflop_runs(
        name, budgets=budgets, data=data, sizes_per_budget=sizes_per_budget, recipe=recipe, spread=spread,
        evaluate=evaluate, resources=resources, seeds=seeds, **train_kwargs,
    )  # fmt: skip
    return sweep_results(name, runs)


def sweep_results(name: str, runs: Iterable[SweepRun]) -> StepHandle:
    """The results step of runs declared by `isoflop_runs` (the step `isoflop_sweep` returns for the same
    arguments): for an experiment that needs the runs too (to score each one), so the grid is declared, and
    its warnings logged, once. `runs` may be any of them (those of some budgets, for a fit on those only).

    Raises:
        ValueError: no runs, or a run given twice (it would count twice in the results and the fit).
        TypeError: an item that is not a `SweepRun` (a training step handle: give the `SweepRun`).
    """
    runs = list(runs)
    if not runs:
        raise ValueError(f"sweep_results({name!r}): no runs; give the runs isoflop_runs declared")
    for r in runs:
        if not isinstance(r, SweepRun):
            raise TypeError(
                f"sweep_results({name!r}): runs must be the SweepRun items isoflop_runs returns, got "
                f"{type(r).__name__} {getattr(r, 'name', r)!r}"
            )
    names = [r.train.name for r in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"sweep_results({name!r}): {twice[0]} is given twice"
            + (f" ({len(twice)} runs are)" if len(twice) > 1 else "")
            + "; give each run once (joined lists of runs overlap?)"
        )
    config = SweepResultsConfig(
        runs=[
            {
                "budget": r.recipe.budget,
                "name": r.train.name,
                "train": r.train,
                "evaluation": r.evaluation,
                "warnings": list(r.warnings),
            }
            for r in runs
        ]
    )
    return step(
        name, _collect, config, version=VERSION,
        description=f"isoFLOP sweep: {len(runs)} runs over {len({r.recipe.budget for r in runs})} budgets",
    )  # fmt: skip


def run_loss(
    train_path: str,
    evaluation_path: str | None = None,
    metric: str = "eval/loss",
    *,
    final_step: int | None = None,
) -> dict[str, Any]:
    """The final validation `loss` (and `bpb` when known) of a finished run, and the `step` it was measured
    at: the evaluation step's `results.json` averages when given (the step of the checkpoint it scored), else
    the last `metric` row of the run's `metrics.jsonl`.

    Raises ValueError when the run's step record says it has not succeeded, or when `final_step` is given and
    the loss is not of that step (a run still training, or an evaluation of an earlier checkpoint).
    """
    import re

    _check_finished(train_path)
    if evaluation_path is not None:
        results = storage.read_json(f"{evaluation_path}/results.json")
        avg = results["average"]
        found = re.search(r"step-(\d+)$", str(results.get("checkpoint", "")).rstrip("/"))
        out: dict[str, Any] = {
            "loss": float(avg["loss"]),
            "step": int(found.group(1)) if found else None,
            **({"bpb": float(avg["bpb"])} if avg.get("bpb") is not None else {}),
        }
        where = f"{evaluation_path}/results.json (checkpoint {results.get('checkpoint')})"
        scored = str(results.get("checkpoint", "")).rstrip("/")
        if found and scored.rsplit("/", 1)[0] != train_path.rstrip("/"):
            raise ValueError(f"{where} is not a checkpoint of the run {train_path}")
    else:
        last = None
        for row in records.read_metrics(train_path):
            if metric in row:
                last = row
        if last is None:
            raise ValueError(
                f"{train_path}/metrics.jsonl has no {metric!r}: was the run given validation data?"
            )
        bpb_key = metric.rsplit("/", 1)[0] + "/bpb"
        out = {
            "loss": float(last[metric]),
            "step": last.get("step"),
            **({"bpb": float(last[bpb_key])} if bpb_key in last else {}),
        }
        where = f"{train_path}/metrics.jsonl's last {metric!r}"
    if final_step is not None and out["step"] != final_step:
        raise ValueError(
            f"{where} is at step {out['step']}, not the run's last step {final_step}: the run has not finished, "
            "or the evaluation scored an earlier checkpoint; score the finished run's final checkpoint"
        )
    return out


def _check_finished(train_path: str) -> None:
    """Refuse a run whose step status (the step runner's, read through `schooner.cluster.records`) is not
    SUCCESS."""
    status = records.step_status(train_path)
    if status is None:
        return  # a run trained outside the step runner: the final-step check still applies
    if status.state != records.StepState.SUCCESS:
        raise ValueError(
            f"{train_path}: the training step is {status.state.value}, not finished (its step status); wait "
            "for it to succeed before reading its loss"
        )


def run_counts(train_path: str) -> dict[str, Any]:
    """N, D, FLOPs and shape of a finished run, from the model it actually trained (`run.json`): the exact
    counts of `schooner.model`, with the vocabulary `train_lm` fitted to the tokenizer."""
    from schooner.model import config_from_dict, flops_per_token, num_parameters
    from schooner.train._run_info import recorded_data

    info = storage.read_json(f"{train_path}/run.json")
    model = config_from_dict(info["model_config"])
    cfg = info["config"]
    seq_len = recorded_data(cfg)["seq_len"]
    batch, steps = cfg["batch_size"], cfg["num_train_steps"]
    if not isinstance(batch, int):
        raise ValueError(
            f"{train_path}: a batch-size schedule is not supported by the scaling fits; got {batch!r}"
        )
    tokens = int(batch) * seq_len * int(steps)
    return {
        "params": num_parameters(model),
        "tokens": tokens,
        "flops": flops_per_token(model, seq_len) * tokens,
        "width": model.hidden_dim,
        "layers": model.num_layers,
        "batch_size": int(batch),
        "steps": int(steps),
        "learning_rate": cfg["optimizer"]["learning_rate"],
    }


def _cache_id(path: str) -> str:
    """A token cache's identity by content (its manifest's `content_sha256`), never its path."""
    from schooner.tokenize import TokenCache

    try:
        manifest = TokenCache.open(path).manifest
    except Exception as e:  # a cache gone or unreadable: the identity says so, and compares unequal
        return f"unreadable: {type(e).__name__}: {e}"
    return str(manifest.get("content_sha256") or f"no content_sha256 in {path}/manifest.json")


def run_data(train_path: str) -> dict[str, Any]:
    """What a finished run trained and was evaluated on, by content: `{"tokenizer": fingerprint, "train":
    {cache content sha256: weight}, "validation": {name: cache content sha256}}` from its `run.json` (the
    validation sets the run scored: its own, or the `validation/` caches beside its components). A forecast
    records its fitted runs' and a score compares the target run's: a loss on other data, tokens or
    evaluation sets is not the loss the law predicts."""
    from schooner.train._evaluate import default_validation
    from schooner.train._run_info import recorded_data

    info = storage.read_json(f"{train_path}/run.json")
    data = recorded_data(info["config"])
    components = data["components"]
    validation = data["validation"]
    if validation is None:
        validation = default_validation(components)
    validation = {**validation, **data["evals"]}
    return {
        "tokenizer": info.get("tokenizer_fingerprint"),
        "train": {_cache_id(p): w for p, w in sorted(components.items())},
        "validation": {name: _cache_id(p) for name, p in sorted(validation.items())},
    }


def read_run_data(path: str) -> list[dict[str, Any] | None]:
    """Each run's `run_data` from a sweep-results folder's `runs.jsonl` (None for a row that has none)."""
    return [row.get("data") for row in _sweep_rows(path)]


def _sweep_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a sweep-results folder's `runs.jsonl` (or of that file); a file without rows is refused: a
    fit or a comparison needs runs (with none, the fit step failed on an IndexError)."""
    return [row for _n, row in _numbered_rows(path)[1]]


def _numbered_rows(path: str) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """The `runs.jsonl` file of `path` and its `(line number, row)`s (at least one)."""
    file = path if path.endswith(".jsonl") else f"{path.rstrip('/')}/runs.jsonl"
    rows = list(storage.read_json_lines(file, what="sweep results"))
    if not rows:
        raise ValueError(
            f"sweep results: {file} holds no runs; give the output of a finished isoflop_sweep step (one row "
            "per run it collected), or collect the sweep again"
        )
    return file, rows


def _collect(config: SweepResultsConfig, output_path: str) -> dict[str, Any]:
    from ._plots import plot_isoflops

    os.makedirs(output_path, exist_ok=True)
    rows, runs = [], []
    warnings: dict[str, list[str]] = {}
    for entry in config.runs:
        counts = run_counts(entry["train"])
        scores = run_loss(entry["train"], entry.get("evaluation"), config.metric, final_step=counts["steps"])
        run = ScalingRun(
            budget=float(entry["budget"]), params=float(counts["params"]), tokens=float(counts["tokens"]),
            loss=scores["loss"], flops=float(counts["flops"]), name=entry["name"], bpb=scores.get("bpb"),
        )  # fmt: skip
        runs.append(run)
        notes = list(entry.get("warnings", []))
        rows.append(
            {
                **run.to_dict(),
                **{k: v for k, v in counts.items() if k not in ("params", "tokens", "flops")},
                "warnings": notes,
                "data": run_data(entry["train"]),
            }
        )
        budget_notes = warnings.setdefault(f"{run.budget:.3g}", [])
        budget_notes.extend(n for n in notes if n not in budget_notes)
    runs_path = f"{output_path}/runs.jsonl"
    storage.write_text(
        runs_path,
        "".join(
            storage.dumps_json(r, indent=None, where=f"{runs_path}:{i}") + "\n" for i, r in enumerate(rows, 1)
        ),
    )
    plot_isoflops(runs, f"{output_path}/isoflops.png")
    best: dict[str, float] = {}
    for r in runs:
        key = f"{r.budget:.3g}"
        best[key] = min(best.get(key, float("inf")), r.loss)
    return {
        "runs": len(runs),
        "budgets": sorted({r.budget for r in runs}),
        "best_loss": best,
        "warnings": {k: v for k, v in warnings.items() if v},
    }


def read_runs(path: str) -> list[ScalingRun]:
    """The runs of a sweep-results folder (its `runs.jsonl`), or of a `runs.jsonl` file.

    Raises:
        ValueError: no runs, a bad line, or a row without a run's fields or with a bad value; the message
            names `file:line` (and the missing fields) and the fix.
    """
    file, rows = _numbered_rows(path)
    required = [f.name for f in dataclasses.fields(ScalingRun) if f.default is dataclasses.MISSING]
    runs = []
    for n, row in rows:
        where = f"sweep results: {file}:{n}"
        missing = [k for k in required if k not in row]
        if missing:
            run = f" (run {row['name']!r})" if row.get("name") else ""
            has = (
                f"its fields are {', '.join(map(str, row)) or 'none'}"
                if len(missing) == len(required)
                else ""
            )
            raise ValueError(
                f"{where}{run} lacks {', '.join(missing)}{f' ({has})' if has else ''}: a run row holds "
                f"{', '.join(required)}; give the runs.jsonl an isoflop_sweep step wrote (or collect the sweep "
                "again)"
            )
        try:
            runs.append(ScalingRun.from_dict(row))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return runs
