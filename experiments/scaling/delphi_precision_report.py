"""The figures of docs/scaling.md's "What limits a forecast at these budgets", from committed records:

    uv run python experiments/scaling/delphi_precision_report.py [NOISE_RUNS_JSONL]

For each suite registered in docs/scaling-registered/ (its sweep's final losses, the held-out seeds' actual
losses from its score files; each run's tokens from the recipe's isoFLOP grid, as the suite declared it):

1. the optima's standard errors and the spread their noise leaves at each held-out budget (`optima_noise`),
   against the registered forecast's error;
2. the window rule tried after the fact (fit the w largest budgets, w chosen by the backtest) and
   inverse-variance weights of the optima;
3. three estimators of each budget's optimum (the parabola through every run, through the four token counts
   nearest the best mean loss, a cubic), their local slopes and forecasts.

Then the registered 100x run's scores from its committed result, and the slopes between the held-out runs.

With NOISE_RUNS_JSONL (the noise test's sweep results, `scaling/delphi-noise-*/runs.jsonl`): per budget the
per-seed vertices' spread and the lack of fit, the local slopes with attention's FLOPs counted, and the fit
through seed subsets (0-1, 2-3, 0-3, all).
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys

import numpy as np

from experiments.scaling.delphi_recipe import RECIPE
from schooner.train.scaling import ScalingRun, fit_asymptotic_law, fit_delphi

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "scaling-registered")
SUITES = {
    "CPU, 2026-12-06": ("delphi-cpu-2026-12-06.json", ["delphi-cpu-2026-12-06-scores.json"]),
    "v5e, 2026-12-06": ("delphi-v5e-2026-12-06.json", ["delphi-v5e-2026-12-06-scores.json"]),
    "CPU two-seed, 2026-12-07": (
        "delphi-cpu-2026-12-07-two-seed.json",
        ["delphi-cpu-2026-12-07-two-seed-10x-scores.json", "delphi-cpu-2026-12-07-two-seed-30x-scores.json"],
    ),
}
SIZES, SPREAD = 6, 1.7  # the suite's grid (delphi_suite.SIZES, SPREAD)


def _read(name: str) -> dict:
    with open(os.path.join(HERE, name)) as fh:
        return json.load(fh)


def suite_runs(registration: str) -> list[ScalingRun]:
    """The sweep's runs: final losses by name from the registration, tokens and parameters from the grid."""
    losses = _read(registration)["sweep_final_validation_loss"]
    grid = {}
    for budget in sorted({float(k.split("-")[0]) for k in losses}):
        for r in RECIPE._isoflop_grid(budget, SIZES, SPREAD)[0]:
            grid[f"{budget:.2e}-w{r.width}"] = r
    runs = []
    for name, loss in losses.items():
        r = grid[name.rsplit("-s", 1)[0] if "-s" in name.split("-w")[-1] else name]
        runs.append(ScalingRun(budget=r.budget, params=r.params, tokens=r.tokens, loss=loss, name=name))
    return runs


def outcomes(score_files: list[str]) -> dict[float, list[float]]:
    """{held-out budget: the seeds' actual losses}."""
    out: dict[float, list[float]] = collections.defaultdict(list)
    for f in score_files:
        for s in _read(f)["scores"]:
            out[float(s["budget"])].append(float(s["actual"]))
    return dict(out)


def err(pred: float, actual: list[float]) -> float:
    return 100 * (pred - float(np.mean(actual))) / float(np.mean(actual))


def law_at(c: np.ndarray, y: np.ndarray, w: np.ndarray | None = None):
    """The law through (c, y), optionally weighted; a callable of compute."""
    return fit_asymptotic_law(c.tolist(), y.tolist(), weights=None if w is None else w.tolist())


def vertex(u: np.ndarray, y: np.ndarray, how: str) -> float:
    if how == "local4":
        counts = np.unique(u)
        best = int(np.argmin([y[u == t].mean() for t in counts]))
        lo = max(0, min(best - 1, counts.size - 4))
        keep = np.isin(u, counts[lo : lo + 4])
        u, y = u[keep], y[keep]
    c = np.polyfit(u, y, 3 if how == "cubic" else 2)
    grid = np.linspace(u.min(), u.max(), 4001)
    return float(np.polyval(c, grid).min())


def report_suite(name: str, runs: list[ScalingRun], held: dict[float, list[float]]) -> None:
    fit = fit_delphi(runs, samples=1000)
    c = np.array(fit.budgets)
    y = np.array([o.loss for o in fit.optima])
    se = np.array([o.loss_se for o in fit.optima])
    print(f"\n== {name}: optima se {', '.join(f'{100 * s / v:.2f}%' for s, v in zip(se, y, strict=True))}")
    for budget, actual in sorted(held.items()):
        f = fit.forecast(budget)
        e, noise = err(f["loss"], actual), f["optima_noise"]["sd_pct"]
        print(f"  {budget:.0e}: error {e:+.2f}%, the optima's noise {noise:.2f}% ({abs(e) / noise:.1f} sd)")
    n = c.size
    back = {w: err(float(law_at(c[n - 1 - w : n - 1], y[n - 1 - w : n - 1])(c[-1])), [y[-1]]) for w in (3, 4)}
    w = min(back, key=lambda k: abs(back[k]))
    window = law_at(c[n - w :], y[n - w :])
    weighted = law_at(c, y, 1 / se**2)
    print(f"  window rule: backtest w=3 {back[3]:+.2f}%, w=4 {back[4]:+.2f}%: w={w};", end="")
    print("".join(f" {b:.0e} {err(float(window(b)), a):+.2f}%" for b, a in sorted(held.items())), end=";")
    print(
        " inverse-variance:",
        "".join(f" {b:.0e} {err(float(weighted(b)), a):+.2f}%" for b, a in sorted(held.items())),
    )
    groups = collections.defaultdict(list)
    for r in runs:
        groups[r.budget].append(r)
    for how in ("all", "local4", "cubic"):
        lv = np.array(
            [
                vertex(np.log([r.tokens for r in g]), np.array([r.loss for r in g]), how)
                for _, g in sorted(groups.items())
            ]
        )
        slopes = -np.diff(np.log(lv)) / np.diff(np.log(c))
        law = law_at(c, lv)
        print(
            f"  estimator {how:6s}: L* {np.round(lv, 4).tolist()} slopes {np.round(slopes, 4).tolist()};"
            + "".join(f" {b:.0e} {err(float(law(b)), a):+.2f}%" for b, a in sorted(held.items()))
        )


def report_noise(path: str, held: dict[float, list[float]]) -> None:
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    runs = [
        ScalingRun(budget=r["budget"], params=r["params"], tokens=r["tokens"], loss=r["loss"], name=r["name"])
        for r in rows
    ]

    def seed(r: ScalingRun) -> int:
        tail = r.name.rsplit("-", 1)[-1]
        return int(tail[1:]) if tail.startswith("s") and tail[1:].isdigit() else 0

    print(f"\n== the noise test: {len(runs)} runs")
    fit = fit_delphi(runs, samples=200)
    for o in fit.optima:
        mine = [r for r in runs if r.budget == o.budget]
        per_seed = [
            vertex(
                np.log([r.tokens for r in mine if seed(r) == s]),
                np.array([r.loss for r in mine if seed(r) == s]),
                "all",
            )
            for s in sorted({seed(r) for r in mine})
        ]
        lof = o.lack_of_fit or {}
        print(
            f"  {o.budget:.0e}: {len(per_seed)} seeds, L* {o.loss:.4f}, se {100 * o.loss_se / o.loss:.2f}%, "
            f"one run's seed noise {100 * lof.get('pure_error_sd', math.nan) / o.loss:.2f}%, per-seed vertices' sd "
            f"{100 * float(np.std(per_seed, ddof=1)) / o.loss:.2f}%, lack of fit p {lof.get('p', math.nan):.1g}"
        )
    attention_slopes(rows, fit)
    for label, keep in (
        ("seeds 0-1", range(2)),
        ("seeds 2-3", range(2, 4)),
        ("seeds 0-3", range(4)),
        ("all", range(99)),
    ):
        sub = fit_delphi([r for r in runs if seed(r) in keep], samples=200)
        print(
            f"  {label}: "
            + " ".join(f"{b:.0e} {err(float(sub.predict(b)), a):+.2f}%" for b, a in sorted(held.items()))
        )


def attention_slopes(rows: list[dict], fit) -> None:
    """The local slopes with attention's FLOPs counted, which 6 N D leaves out and which are a larger share of a
    small model's compute. Per token and layer, training: 6 x seq_len x width by Kaplan et al. 2020 (their
    C_forward's 2 n_layer n_ctx d_attn, times 3), 12 x seq_len x width by Hoffmann et al. 2022 (appendix F: the
    logits and the weighted sum over the whole context, as a dense masked attention computes them). Each
    optimum's compute is scaled by (6 N D + attention) / 6 N D, interpolated in ln D between its budget's grid
    points."""
    seq_len = RECIPE.seq_len

    def slopes(points: list[tuple[float, float]]) -> str:
        pairs = zip(points, points[1:], strict=False)
        return ", ".join(f"{math.log(a[1] / b[1]) / math.log(b[0] / a[0]):.4f}" for a, b in pairs)

    line = []
    for label, per_layer in (("6 N D", 0), ("+ Kaplan's attention", 6), ("+ Chinchilla's attention", 12)):
        points = []
        for o in fit.optima:
            mine = sorted((r for r in rows if r["budget"] == o.budget), key=lambda r: r["tokens"])
            ratios = [
                1
                + per_layer
                * r["layers"]
                * seq_len
                * int(r["name"].split("-w")[-1].split("-")[0])
                / (6 * r["params"])
                for r in mine
            ]
            scale = float(np.interp(math.log(o.tokens), np.log([r["tokens"] for r in mine]), ratios))
            points.append((o.budget * scale, o.loss))
        line.append(f"{label}: {slopes(points)}")
    print("  local slopes, " + "; ".join(line))


def report_100x(result: str = "delphi-cpu-2026-12-07-100x-result.json") -> None:
    """The registered 100x run's scores (three fits of the two-seed suite) and the slopes -d ln L / d ln C between
    the suite's held-out runs (the 10x and 30x seeds' means, the 100x seed)."""
    scores = _read(result)["scores"]
    print("\n== the registered 100x run (two-seed CPU suite, seed 0)")
    for label, s in scores.items():
        print(
            f"  {label}: forecast {s['predicted']:.4f}, actual {s['actual']:.4f}, error {s['error_pct']:+.2f}%"
        )
    held = outcomes(SUITES["CPU two-seed, 2026-12-07"][1])
    points = [(b, float(np.mean(a))) for b, a in sorted(held.items())] + [(3e14, scores["suite"]["actual"])]
    slopes = [
        f"{a[0]:.0e}->{b[0]:.0e} {math.log(a[1] / b[1]) / math.log(b[0] / a[0]):.4f}"
        for a, b in zip(points, points[1:], strict=False)
    ]
    print("  held-out slopes: " + ", ".join(slopes))


def main() -> None:
    for name, (registration, scores) in SUITES.items():
        report_suite(name, suite_runs(registration), outcomes(scores))
    report_100x()
    if len(sys.argv) > 1:
        report_noise(sys.argv[1], outcomes(SUITES["CPU two-seed, 2026-12-07"][1]))


if __name__ == "__main__":
    main()
