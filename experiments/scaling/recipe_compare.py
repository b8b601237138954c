"""The new recipe against today's (issue 38's goal "the new recipe's isoFLOP optima lower in loss than today's
recipe at every budget they share"): an isoFLOP sweep at the same budgets with both recipes, on the same data.

    uv run python experiments/scaling/recipe_compare.py --max-concurrent 2           # 1e11, 3e11, 1e12
    SCHOONER_COMPARE_BUDGETS=3e10,1e11,3e11,1e12 uv run python experiments/scaling/recipe_compare.py

- the new recipe: `HorizonRecipe`, AdamH with the token-horizon rule and the horizon family, exactly the
  Delphi suite's (`experiments/scaling/delphi_recipe.RECIPE`);
- today's recipe: `ScalingRecipe`, AdamW with weight decay 0.1 and the `ModelFamily` rules, configured as the
  earlier suite configures it (`experiments/scaling/isoflop_python.py`: widths every 8, heads of 8, the grid
  centred on 100 tokens per parameter), with the vocabulary (1024) and sequence length (64) of the new one
  and its widths from 8 like the horizon family's (not 16: see `OLD`). Every hyperparameter of each comes
  from its own rules.

Both train on the Delphi suite's data steps (`experiments/scaling/delphi_data.py`: the site-packages text,
the 1024-token BPE, the same validation split), and each run's loss is its final validation loss on the
whole validation split, so the losses are comparable per token. Per budget of `BUDGETS`
(`SCHOONER_COMPARE_BUDGETS`, the one list to change), `SIZES` models of each family with the same spread in
N around each recipe's prior optimum. The steps, all cached under the prefix:

1. the data steps of the Delphi suite (shared with it: a prefix that holds them trains no tokenizer);
2. `scaling/compare/horizon/{budget}-w{width}` and `scaling/compare/adamw/{budget}-w{width}`: the runs,
   trained budget by budget, smallest first (an interrupted run leaves whole budgets);
3. `scaling/compare/horizon`, `scaling/compare/adamw`: the sweep results (`sweep_results` of the runs);
4. `scaling/compare`: per recipe and budget the Delphi parabola's minimum L* (`budget_optima`, the per-budget
   fit of `fit_delphi`; a budget whose runs do not bracket a minimum gets no L* and the reason), the table
   (budget, new L*, old L*, difference, which is lower) in `compare.json` and `compare.md`, and
   `recipe-compare.png` (both recipes' isoFLOP curves); with `--update-docs`, `main` copies the plot and
   `compare.json` to docs/images/scaling/. The goal is checked at the budgets where both recipes have an
   optimum (`goal_checked_at`); the others are listed (`goal_not_checkable_at`).

`--dry-run` lists only the data steps: the runs are declared once the data exist (as in the Delphi suite).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from experiments.scaling.delphi_data import DATA, VOCAB, tokens
from experiments.scaling.delphi_recipe import RECIPE as HORIZON_RECIPE
from experiments.scaling.delphi_recipe import SEQ_LEN
from schooner.cluster import StepRunner, step, storage
from schooner.train.scaling import (
    ModelFamily,
    ScalingRecipe,
    ScalingRun,
    budget_optima,
    isoflop_runs,
    read_runs,
    sweep_results,
)

BUDGETS = tuple(
    sorted(float(b) for b in os.environ.get("SCHOONER_COMPARE_BUDGETS", "1e11,3e11,1e12").split(","))
)
"""The shared budgets (FLOPs), smallest first: the one list to change."""
SIZES = int(os.environ.get("SCHOONER_COMPARE_SIZES", "6"))
SPREAD = 1.7
"""The same grid design for both recipes (the Delphi suite's spread in N)."""

NEW = HORIZON_RECIPE
OLD = ScalingRecipe(
    family=ModelFamily(vocab_size=VOCAB, min_width=8, head_dim=8, width_step=8),
    tokens_per_param=100,
    seq_len=SEQ_LEN,
)
"""Today's AdamW recipe as `isoflop_python.py` configures it, at the new recipe's vocabulary and seq_len, its
widths from 8 like the horizon family's: from 16 (isoflop_python.py's, for a 512-token vocabulary) its best run
at 3e10 and 1e11 FLOPs was the smallest, width 16, and the parabola found no minimum."""
RECIPES = {"horizon": NEW, "adamw": OLD}
TRAIN = dict(eval_max_tokens=None, checkpoint_every=None, resources=None)
"""Whole validation split, one checkpoint at the end, in the runner's process (as the Delphi suite)."""
VERSION = "recipe-compare-v2"


def _sweep_kwargs(recipe: ScalingRecipe, budgets: tuple[float, ...]) -> dict[str, Any]:
    return dict(budgets=budgets, data=DATA, sizes_per_budget=SIZES, recipe=recipe, spread=SPREAD, **TRAIN)


def sweep_name(key: str) -> str:
    return f"scaling/compare/{key}"


runs = {k: isoflop_runs(sweep_name(k), **_sweep_kwargs(r, BUDGETS)) for k, r in RECIPES.items()}
sweeps = {k: sweep_results(sweep_name(k), runs[k]) for k in RECIPES}


@dataclass(frozen=True)
class CompareConfig:
    """Config of the comparison step: the two sweep-results steps (paths when the step runs)."""

    new: Any
    old: Any
    budgets: tuple[float, ...]


def _optima(sweep_runs: list[ScalingRun], budgets: tuple[float, ...]) -> dict[float, dict[str, Any]]:
    """Per budget the Delphi parabola's optimum (`budget_optima` on that budget's runs) or why there is none."""
    out = {}
    for b in budgets:
        mine = [r for r in sweep_runs if math.isclose(r.budget, b, rel_tol=1e-6)]
        best = min(mine, key=lambda r: r.loss) if mine else None
        row: dict[str, Any] = {"runs": len(mine), "best_run": best.to_dict() if best else None}
        try:
            (o,) = budget_optima(mine)
            row.update(loss=o.loss, tokens=o.tokens, params=o.params, parabola=o.parabola.to_dict())
        except ValueError as e:
            row["error"] = str(e)
        out[b] = row
    return out


def compare_rows(new: dict[float, dict], old: dict[float, dict]) -> list[dict[str, Any]]:
    """The table: per budget both L* and the new recipe's difference in percent of the old L*."""
    rows = []
    for b in sorted(new):
        n, o = new[b].get("loss"), old[b].get("loss")
        row = {"budget": b, "new_loss": n, "old_loss": o, "diff_pct": None, "lower": None}
        if n is not None and o is not None:
            row["diff_pct"] = 100.0 * (n - o) / o
            row["lower"] = "new" if n < o else "old"
        # the best single run of each (a check on the parabolas, and the only comparison where one has none)
        nb, ob = new[b].get("best_run"), old[b].get("best_run")
        row["new_best"] = nb["loss"] if nb else None
        row["old_best"] = ob["loss"] if ob else None
        row["best_diff_pct"] = 100.0 * (nb["loss"] - ob["loss"]) / ob["loss"] if nb and ob else None
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], new: dict, old: dict) -> str:
    def cell(x: float | None) -> str:
        return "no minimum" if x is None else f"{x:.4f}"

    def pct(x: float | None) -> str:
        return "" if x is None else f"{x:+.2f}%"

    lines = [
        "| budget | new L* (horizon, AdamH) | old L* (AdamW) | new - old | lower | new best run | old best run "
        "| new - old (best runs) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['budget']:.3g} | {cell(r['new_loss'])} | {cell(r['old_loss'])} | {pct(r['diff_pct'])} "
            f"| {r['lower'] or ''} | {cell(r['new_best'])} | {cell(r['old_best'])} | {pct(r['best_diff_pct'])} |"
        )
    for label, optima in (("new", new), ("old", old)):
        for b, o in optima.items():
            if "error" in o:
                lines.append(f"\n{label} at {b:.3g}: {o['error']}")
    return "\n".join(lines) + "\n"


def _plot(new_runs: list[ScalingRun], old_runs: list[ScalingRun], new: dict, old: dict, path: str) -> None:
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    from schooner.train.scaling import Parabola

    fig = Figure(figsize=(12, 4.5))
    ax_iso, ax_opt = fig.subplots(1, 2)
    budgets = sorted(new)
    colors = colormaps["viridis"](np.linspace(0.0, 0.85, max(len(budgets), 1)))
    for color, b in zip(colors, budgets, strict=True):
        for label, runs_, optima, marker, style in (
            ("horizon (AdamH)", new_runs, new, "o", "-"),
            ("AdamW", old_runs, old, "s", "--"),
        ):
            mine = sorted(
                (r for r in runs_ if math.isclose(r.budget, b, rel_tol=1e-6)), key=lambda r: r.tokens
            )
            if not mine:
                continue
            ax_iso.plot(
                [r.tokens for r in mine], [r.loss for r in mine], marker, color=color, ms=4, mfc="none"
            )
            o = optima[b]
            if "parabola" in o:
                p = Parabola(**{k: o["parabola"][k] for k in ("budget", "c2", "c1", "c0")})
                d = np.geomspace(mine[0].tokens / 1.2, mine[-1].tokens * 1.2, 100)
                ax_iso.plot(d, p(d), style, color=color, alpha=0.8, label=f"{label}, C = {b:.2g}")
                ax_iso.plot([o["tokens"]], [o["loss"]], "*", color=color, ms=12, markeredgecolor="k")
            else:
                ax_iso.plot(
                    [r.tokens for r in mine], [r.loss for r in mine], style, color=color, alpha=0.5,
                    label=f"{label}, C = {b:.2g} (no minimum)",
                )  # fmt: skip
    ax_iso.set(
        xscale="log", xlabel="training tokens D", ylabel="final validation loss (nats/token)",
        title="isoFLOP curves: horizon o, solid; AdamW s, dashed (* = L*)",
    )  # fmt: skip
    ax_iso.legend(fontsize=7)
    for label, optima, marker in (("horizon (AdamH)", new, "o-"), ("AdamW", old, "s--")):
        pts = [(b, o["loss"]) for b, o in sorted(optima.items()) if "loss" in o]
        if pts:
            ax_opt.plot(*zip(*pts, strict=True), marker, label=label)
    ax_opt.set(xscale="log", xlabel="compute C (FLOPs)", ylabel="L* (parabola minimum)", title="optima")
    ax_opt.legend(fontsize=8)
    for ax in (ax_iso, ax_opt):
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal (the new recipe's optimum lower at every shared budget), checked where both recipes
    have an optimum; the budgets where one has none are listed, not counted either way."""
    shared = [r for r in rows if r["lower"] is not None]
    return {
        "goal_met": bool(shared) and all(r["lower"] == "new" for r in shared),
        "goal_checked_at": [r["budget"] for r in shared],
        "goal_not_checkable_at": [r["budget"] for r in rows if r["lower"] is None],
    }


def _compare(config: CompareConfig, output_path: str) -> dict[str, Any]:
    new_runs, old_runs = read_runs(str(config.new)), read_runs(str(config.old))
    new, old = _optima(new_runs, config.budgets), _optima(old_runs, config.budgets)
    rows = compare_rows(new, old)
    storage.makedirs(output_path)
    result = {
        "rows": rows,
        "new": {f"{b:.3g}": o for b, o in new.items()},
        "old": {f"{b:.3g}": o for b, o in old.items()},
        **goal(rows),
    }
    storage.write_text(f"{output_path}/compare.json", json.dumps(result, indent=1, sort_keys=True))
    storage.write_text(f"{output_path}/compare.md", markdown(rows, new, old))
    _plot(new_runs, old_runs, new, old, f"{output_path}/recipe-compare.png")
    return {k: result[k] for k in ("rows", "goal_met", "goal_checked_at", "goal_not_checkable_at")}


compare = step(
    "scaling/compare",
    _compare,
    CompareConfig(new=sweeps["horizon"], old=sweeps["adamw"], budgets=BUDGETS),
    version=VERSION,
    description=f"horizon recipe against AdamW recipe at {len(BUDGETS)} budgets",
)


def _longest(run: Any) -> float:
    return -run.recipe.flops / run.recipe.params  # time goes with tokens x layers, about FLOPs / N


def main() -> None:
    update_docs = "--update-docs" in sys.argv  # copy the plot and the table's JSON into docs/ (this repo's)
    if update_docs:
        sys.argv.remove("--update-docs")
    runner = StepRunner()
    data = runner.main([tokens])
    if data.dry_run:
        return
    for b in BUDGETS:  # budget by budget, smallest first, both recipes: partial results are whole budgets
        # the longest runs first, so that the last one does not leave the other slots idle
        todo = sorted((r for k in RECIPES for r in runs[k] if math.isclose(r.recipe.budget, b)), key=_longest)
        runner.main([r.train for r in todo])
    done = runner.main([compare])
    out = done[compare].output_path
    print(storage.read_text(f"{out}/compare.md"))
    print(json.dumps({k: v for k, v in done[compare].result.items() if k != "rows"}))
    if update_docs:
        os.makedirs("docs/images/scaling", exist_ok=True)
        for src, dst in (
            ("recipe-compare.png", "recipe-compare.png"),
            ("compare.json", "recipe-compare.json"),
        ):
            shutil.copyfile(f"{out}/{src}", f"docs/images/scaling/{dst}")


if __name__ == "__main__":
    main()
