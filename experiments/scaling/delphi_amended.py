"""An amended loss forecast of a Delphi suite's held-out runs: the Delphi law fitted on the suite's largest budgets
only, registered as its own forecast of the same target runs (same width) before they start.

    SCHOONER_DELPHI_AMEND_FROM=3e11 SCHOONER_DELPHI_AMEND_AT=30 SCHOONER_DELPHI_PHASE=forecast \\
        uv run python experiments/scaling/delphi_amended.py      # register (commit it), then the suite's runs
    SCHOONER_DELPHI_AMEND_FROM=3e11 SCHOONER_DELPHI_AMEND_AT=30 uv run python experiments/scaling/delphi_amended.py

with the suite's own settings in the environment (`SCHOONER_PREFIX`, `SCHOONER_DELPHI_BUDGETS`, ...), so the
sweep's runs and the held-out runs are the suite's cached steps.

Why (docs/scaling.md, "The two-seed CPU suite"): on the CPU suites the isoFLOP optima fall faster as compute grows
(the local slope d ln L / d ln C rises from 0.075 at 3e10-1e11 to 0.082 at 1e12-3e12), a curve the law
E + A C^-alpha cannot follow with E >= 0: it sits at E = 0, its slope is the whole range's average, and it
forecasts too high, which its backtest had shown (+1.2%) and the 10x runs confirmed (+1.2% to +1.7%). Fitted
on the budgets from `SCHOONER_DELPHI_AMEND_FROM` up, the law takes the slope where the optima are now. It is a
second registration, made after the 10x outcome and before the `SCHOONER_DELPHI_AMEND_AT` runs start; the
suite's own forecast of those runs stands beside it and is scored as registered.

Steps: `scaling/delphi-amend-{from}` (`sweep_results` of the runs at those budgets), its fit, the forecast
`scaling/delphi-amend-{from}-forecast-{k}x` of the suite's k x target (the suite's forecast's width), and one
`score_forecast` per held-out seed once the suite has trained them.
"""

from __future__ import annotations

import json
import os

from experiments.scaling import delphi_suite as suite
from experiments.scaling.delphi_heldout import held_out_run, loss_fit, loss_forecast, print_scores
from schooner.cluster import StepRunner
from schooner.train.scaling import forecast, score_forecast, sweep_results

FROM = float(os.environ.get("SCHOONER_DELPHI_AMEND_FROM", "3e11"))
"""The smallest fitted budget the amended law keeps."""
AT = int(os.environ.get("SCHOONER_DELPHI_AMEND_AT", "30"))
"""The held-out multiple forecast again (one of the suite's `HELD_OUT`)."""


def amend_tag(budget: float) -> str:
    """The amended steps' name: `scaling/delphi-amend-3e11` for budgets from 3e11 (every digit kept: 2.5e11)."""
    return f"scaling/delphi-amend-{budget:g}".replace("+", "")


def main() -> None:
    if AT not in suite.HELD_OUT:
        raise SystemExit(
            f"SCHOONER_DELPHI_AMEND_AT={AT}: not one of SCHOONER_DELPHI_HELD_OUT={suite.HELD_OUT}"
        )
    kept = [r for r in suite.runs if r.recipe.budget >= FROM * (1 - 1e-9)]
    budgets = sorted({r.recipe.budget for r in kept})
    if len(budgets) < 3:
        raise SystemExit(
            f"SCHOONER_DELPHI_AMEND_FROM={FROM:g} keeps {len(budgets)} budget(s) of {suite.BUDGETS}; the law "
            "E + A C^-alpha needs at least 3"
        )
    largest = max(suite.BUDGETS)
    runner = StepRunner()
    data = runner.main([suite.tokens, suite.cloze])
    if data.dry_run:
        return
    tag = amend_tag(FROM)
    sweep = sweep_results(tag, kept)
    fit = loss_fit(f"{tag}-fit", sweep)
    # the suite's own forecast (cached) names the target run; the amended one forecasts that same run
    original = loss_forecast(AT, loss_fit("scaling/delphi-fit", suite.sweep))
    width = runner.main([original])[original].result["target"]["width"]
    guess = forecast(
        f"{tag}-forecast-{AT}x", fit, budget=AT * largest, recipe=suite.RECIPE, method="delphi", width=width
    )
    registered = runner.main([guess])
    print(f"amended forecast {AT}x (budgets {budgets}):", json.dumps(registered[guess].result, indent=1))
    if os.environ.get("SCHOONER_DELPHI_PHASE") == "forecast":
        return
    scores = []
    for seed in suite.SEEDS:
        run = held_out_run(AT, seed, width)
        scores.append(score_forecast(f"{tag}-forecast-{AT}x-score-s{seed}", guess, run=run))
    print_scores(runner.main(scores), scores)


if __name__ == "__main__":
    main()
