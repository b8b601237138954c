"""Is the suite's forecast error the optima's seed noise or a bend in the law? More seeds per sweep point, the
same fit.

    SCHOONER_DELPHI_NOISE_SEEDS=3e10:8,1e11:8,3e11:8,1e12:4,3e12:4 \\
        uv run python experiments/scaling/delphi_noise.py

with the suite's own settings in the environment (`SCHOONER_PREFIX`, `SCHOONER_DELPHI_BUDGETS`, ...), so the
suite's runs are found cached and only the new seeds train. `SCHOONER_DELPHI_NOISE_SEEDS` gives, per fitted
budget, how many seeds (0 to n-1) of each grid point the fit goes through; seeds the suite already trained
are its own steps (`isoflop_runs` names seed s `{budget}-w{width}-s{s}`, seed 0 without the suffix).

`SCHOONER_DELPHI_PHASE=forecast` registers the forecasts and stops before any held-out run (for a held-out
multiple the suite has not trained yet).

Steps: `scaling/delphi-noise` (the sweep results of those runs), `scaling/delphi-noise-fit` (the suite's fit,
unchanged: `delphi_heldout.loss_fit`), `scaling/delphi-noise-forecast-{k}x` (the Delphi forecast of the
suite's k x run, at the suite's forecast width) and a `score_forecast` per held-out seed the suite trained.
The held-out runs of the two-seed CPU suite were trained before these seeds: the scores say
`registered_before_run: false`, and they are a test of the noise, never a registered forecast.

It prints, per budget, the optimum from all its seeds with the parabola's delta-method standard error
(`BudgetOptimum.loss_se`), one run's seed noise and the parabola's lack of fit (`BudgetOptimum.lack_of_fit`),
and the local slope -d ln L* / d ln C between neighbouring budgets with its standard error: the two readings of
the 10x miss (docs/scaling.md, "What limits a forecast at these budgets") predict different slopes there.
"""

from __future__ import annotations

import json
import math
import os

from experiments.scaling import delphi_suite as suite
from experiments.scaling.delphi_heldout import held_out_run, loss_fit, loss_forecast, print_scores
from schooner.cluster import StepRunner
from schooner.train.scaling import forecast, isoflop_runs, score_forecast, sweep_results

TAG = "scaling/delphi-noise"


def noise_seeds(text: str) -> dict[float, int]:
    """`{budget: seeds}` from `3e10:8,1e11:8,...`; every budget one of the suite's fitted budgets."""
    out: dict[float, int] = {}
    for item in text.split(","):
        budget, _, count = item.strip().partition(":")
        try:
            b, n = float(budget), int(count)
        except ValueError:
            raise SystemExit(
                f"SCHOONER_DELPHI_NOISE_SEEDS: {item!r} is not budget:seeds (e.g. 3e10:8,1e11:8,3e11:8,1e12:4,3e12:4)"
            ) from None
        match = [s for s in suite.BUDGETS if math.isclose(s, b, rel_tol=1e-6)]
        if not match or n < 1 or match[0] in out:
            raise SystemExit(
                f"SCHOONER_DELPHI_NOISE_SEEDS: {item!r}: the budget must be one of SCHOONER_DELPHI_BUDGETS="
                f"{','.join(f'{x:g}' for x in suite.BUDGETS)}, given once, with 1 or more seeds"
            )
        out[match[0]] = n
    missing = [b for b in suite.BUDGETS if b not in out]
    if missing:
        raise SystemExit(
            f"SCHOONER_DELPHI_NOISE_SEEDS: no seed count for budget(s) {', '.join(f'{b:g}' for b in missing)}: "
            "the fit goes through every fitted budget of the suite"
        )
    return out


def declared_runs(seeds: dict[float, int]) -> list:
    """The suite's sweep runs with `seeds[budget]` seeds per grid point (the suite's own steps where it has them)."""
    kwargs = {k: v for k, v in suite.sweep_kwargs.items() if k not in ("budgets", "seeds")}
    runs = []
    for budget, n in sorted(seeds.items()):
        runs += isoflop_runs("scaling/delphi", budgets=[budget], seeds=tuple(range(n)), **kwargs)
    return runs


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def report(fit: dict) -> None:
    """Per budget L*, its standard error, one run's seed noise and the lack of fit's p (n/a where a budget has
    none: 3 runs, or no repeated token count), and the local slopes with their standard errors."""
    optima = fit["delphi"]["optima"]
    print("budget  runs  L*      se(L*)  one run's seed noise  parabola's lack of fit (F test p)")
    for o in optima:
        lof = o.get("lack_of_fit") or {}
        p = lof.get("p")
        print(
            f"{o['budget']:.0e}  {o['runs']:4d}  {o['loss']:.4f}  {_figure(o.get('loss_se'))}  "
            f"{_figure(lof.get('pure_error_sd'))}  {'n/a' if p is None else f'{p:.1e}'}"
        )
    print("local slope -dlnL*/dlnC (se):")
    for a, b in zip(optima, optima[1:], strict=False):
        span = math.log(b["budget"] / a["budget"])
        slope = math.log(a["loss"] / b["loss"]) / span
        ses = (a.get("loss_se"), b.get("loss_se"))
        se = None if None in ses else math.hypot(ses[0] / a["loss"], ses[1] / b["loss"]) / span
        print(f"  {a['budget']:.0e} -> {b['budget']:.0e}: {slope:.4f} ({_figure(se)})")
    print("law:", json.dumps(fit["delphi"]["law"]))


def main() -> None:
    seeds = noise_seeds(os.environ.get("SCHOONER_DELPHI_NOISE_SEEDS", "3e10:8,1e11:8,3e11:8,1e12:4,3e12:4"))
    runs = declared_runs(seeds)
    largest = max(suite.BUDGETS)
    runner = StepRunner()
    sweep = sweep_results(TAG, runs)
    fit = loss_fit(f"{TAG}-fit", sweep)
    done = runner.main([fit])  # `schooner run --dry-run` stops here, with the plan: which seeds are new
    from schooner.cluster import storage

    report(storage.read_json(f"{done[fit].output_path}/fit.json"))
    for k in suite.HELD_OUT:
        original = loss_forecast(k, loss_fit("scaling/delphi-fit", suite.sweep))
        width = runner.main([original])[original].result["target"]["width"]
        guess = forecast(
            f"{TAG}-forecast-{k}x", fit, budget=k * largest, recipe=suite.RECIPE, method="delphi", width=width
        )
        if os.environ.get("SCHOONER_DELPHI_PHASE") == "forecast":  # the held-out runs train later
            print(f"{k}x forecast:", json.dumps(runner.main([guess])[guess].result, indent=1))
            continue
        scores = [
            score_forecast(f"{TAG}-forecast-{k}x-score-s{seed}", guess, run=held_out_run(k, seed, width))
            for seed in suite.SEEDS
        ]
        scored = runner.main([guess, *scores])
        print(
            f"{k}x forecast:", json.dumps(scored[guess].result.get("prediction", scored[guess].result))[:400]
        )
        print_scores(scored, scores)


if __name__ == "__main__":
    main()
