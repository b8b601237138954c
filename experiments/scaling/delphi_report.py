"""The Delphi suite's report: a summary JSON and the plots docs/scaling.md shows, from a finished suite's folders.

    uv run python experiments/scaling/delphi_report.py [PREFIX] [OUT_DIR]

PREFIX defaults to $SCHOONER_PREFIX or ./schooner-output; OUT_DIR to docs/images/scaling. Writes
`delphi-fit.png` (isoFLOP parabolas with their minima, the law with its bootstrap band and the held-out
seeds, the over-training penalty), `delphi-downstream.png` (each soft metric against compute with its
forecasts and the held-out seeds; accuracy against the soft metric with the sigmoid) and `delphi-summary.json`.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any

import numpy as np


def _newest(pattern: str) -> str:
    found = sorted(glob.glob(pattern), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"nothing matches {pattern}: has the suite finished?")
    return found[-1]


def _read(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _maybe(pattern: str) -> Any:
    found = sorted(glob.glob(pattern), key=os.path.getmtime)
    return _read(found[-1]) if found else None


def collect(prefix: str) -> dict[str, Any]:
    fit = _read(_newest(f"{prefix}/scaling/delphi-fit-*/fit.json"))
    down = _maybe(f"{prefix}/scaling/delphi-downstream-[0-9a-f]*/downstream.json")
    scores = []
    for path in sorted(glob.glob(f"{prefix}/scaling/delphi-forecast-*x-score-s*/score.json")):
        s = _read(path)
        s["seed"] = int(path.split("-score-s")[1].split("-")[0])
        scores.append(s)
    down_scores = _maybe(f"{prefix}/scaling/delphi-downstream-score-*/score.json") or []
    forecasts = [
        _read(p) for p in sorted(glob.glob(f"{prefix}/scaling/delphi-forecast-*x-[0-9a-f]*/forecast.json"))
    ]
    by_budget: dict[float, list[float]] = {}
    for s in scores:
        by_budget.setdefault(s["budget"], []).append(s["actual"])
    spread = {
        f"{b:.3g}": {
            "mean": float(np.mean(v)),
            "std_pct": float(100 * np.std(v, ddof=1) / np.mean(v)) if len(v) > 1 else None,
            "range": [min(v), max(v)],
        }
        for b, v in by_budget.items()
    }
    return {
        "fit": fit,
        "downstream": down,
        "forecasts": [{k: v for k, v in f.items() if k not in ("fit", "replicates")} for f in forecasts],
        "scores": scores,
        "downstream_scores": down_scores,
        "spread": spread,
    }


def markdown(summary: dict[str, Any]) -> str:
    """The tables docs/scaling.md shows (and the raw numbers behind its prose)."""
    fit = summary["fit"]
    # a fitted run's record holds its name, budget, N, D and loss (the model and optimizer are in its run.json)
    lines = ["| budget | run | N | D | D/N | loss |", "|---|---|---|---|---|---|"]
    for r in sorted(fit["runs"], key=lambda r: (r["budget"], r["params"])):
        lines.append(
            f"| {r['budget']:.3g} | {r['name'].split('/')[-1]} | {r['params']:,.0f} | {r['tokens']:,.0f} | "
            f"{r['tokens'] / r['params']:.1f} | {r['loss']:.4f} |"
        )
    d = fit["delphi"]
    lines.append("")
    if "error" in d:
        lines.append(f"Delphi fit: **failed**: {d['error']}")
    else:
        lines += ["| budget | D* | N* | L* | runs |", "|---|---|---|---|---|"]
        for o in d["optima"]:
            lines.append(
                f"| {o['budget']:.3g} | {o['tokens']:,.0f} | {o['params']:,.0f} | {o['loss']:.4f} | {o['runs']} |"
            )
        law = d["law"]
        lines.append(
            f"\nL(C) = {law['E']:.4g} + {law['A']:.4g} C^-{law['alpha']:.4g}; intervals {d.get('intervals')}; "
            f"interval_problem {d.get('interval_problem')}; failed {d['failed']} of {d['samples']}"
        )
        for x in d.get("dropped", []):
            lines.append(f"- dropped {x['budget']:.3g}: {x['reason']}")
        for p in d["penalties"]:
            lines.append(
                f"- penalty {p['multiplier']}x: {[round(v, 4) for v in p['per_budget']]}, law {p['law']}"
            )
    for m in ("approach2", "approach3", "varpro"):
        e = fit.get(m, {})
        keys = ("a", "b", "alpha", "beta", "E")
        lines.append(f"- {m}: {e.get('error') or {k: e.get('law', {}).get(k, e.get(k)) for k in keys}}")
    lines.append(f"- backtest: {fit.get('backtest')}")
    for f in summary["forecasts"]:
        lines.append(
            f"- forecast {f['budget']:.3g}: {f['loss']:.4f} interval {f['interval']} {f.get('interval_error', '')} "
            f"target width {f['target']['width']} written {f['created_at']}"
        )
    if summary["scores"]:
        lines += [
            "",
            "| budget | seed | forecast | interval | actual | error | inside | registered before the run |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in summary["scores"]:
            iv = s["interval"]
            ivs = f"[{iv[0]:.4f}, {iv[1]:.4f}]" if iv else "none"
            lines.append(
                f"| {s['budget']:.3g} | {s['seed']} | {s['predicted']:.4f} | {ivs} | {s['actual']:.4f} | "
                f"{s['error_pct']:+.2f}% | {s['inside_interval']} | {s['registered_before_run']} |"
            )
    down = summary["downstream"]
    if down:
        for m, rec in down["metrics"].items():
            lines.append(f"- downstream {m}: {rec.get('error') or (rec['fit']['law'], rec['forecasts'])}")
        lines.append(f"- soft to hard: {down['soft_to_hard']}; acc forecasts {down.get('acc_forecasts')}")
        for r in down["runs"]:
            lines.append(f"- run {r['name']}: {r['choice_loss']:.4f} {r['bpb']:.4f} {r['acc']:.3f}")
    for r in summary["downstream_scores"]:
        lines.append(f"- held out {r}")
    return "\n".join(lines)


def plot(summary: dict[str, Any], out_dir: str) -> None:
    from matplotlib.figure import Figure

    from schooner.train.scaling import ScalingRun, delphi_from_dict, plot_delphi

    fit = summary["fit"]
    runs = [ScalingRun.from_dict(r) for r in fit["runs"]]
    delphi = delphi_from_dict(fit["delphi"])
    held = [(s["run_flops"], s["actual"]) for s in summary["scores"]]
    plot_delphi(delphi, f"{out_dir}/delphi-fit.png", runs=runs, held_out=held, up_to=max(c for c, _ in held))

    down = summary["downstream"]
    if down is None:  # the downstream fit has not run yet
        return
    metrics = [m for m in ("choice_loss", "bpb") if "error" not in down["metrics"][m]]
    fig = Figure(figsize=(5 * (len(metrics) + 1), 4.3))
    axes = fig.subplots(1, len(metrics) + 1)
    rows = summary["downstream_scores"]
    # the task's metrics, not the validation loss's: "bpb" here is the right line's bits per byte on the task
    label = {"choice_loss": "choice_loss", "bpb": "bpb of the right line"}
    for ax, m in zip(axes, metrics, strict=False):
        rec = down["metrics"][m]
        f = rec["fit"]
        law = f["law"]
        budgets = [o["budget"] for o in f["optima"]]
        top = max(x["compute"] for x in rec["forecasts"].values())
        cs = np.geomspace(min(budgets) / 2, top * 2, 200)
        ax.plot(cs, law["E"] + law["A"] * cs ** -law["alpha"], "-", color="C0", label="E + A C^-alpha")
        ax.plot(
            [r["budget"] for r in down["runs"]],
            [r[m] for r in down["runs"]],
            "o",
            color="0.7",
            ms=3,
            label="sweep runs",
        )
        ax.plot(budgets, [o["loss"] for o in f["optima"]], "o", color="k", label="optima")
        for x in rec["forecasts"].values():
            iv = x["interval"]
            if iv:
                ax.errorbar(
                    [x["compute"]],
                    [x["value"]],
                    yerr=[[x["value"] - iv["low"]], [iv["high"] - x["value"]]],
                    fmt="s",
                    color="C0",
                    capsize=4,
                )
        ax.plot(
            [r["budget"] for r in rows], [r[m] for r in rows], "*", color="C3", ms=10, label="held-out seeds"
        )
        ax.set(
            xscale="log",
            xlabel="compute C (FLOPs)",
            ylabel=f"task {label[m]}",
            title=f"task {label[m]}: forecast (90% band) vs held out",
        )
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    ax = axes[-1]
    sh = down["soft_to_hard"]

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return sh["chance"] + (1 - sh["chance"]) / (1 + np.exp(-sh["k"] * (sh["s0"] - x)))

    s = np.array([r["choice_loss"] for r in down["runs"]])
    soft = down["metrics"]["choice_loss"].get("forecasts", {})
    # the sigmoid is fitted on the sweep's runs (solid) and read at the forecast soft values, past them (dashed)
    reach = [r["choice_loss"] for r in rows] + [x["value"] for x in soft.values()]
    fitted = np.linspace(s.min(), s.max(), 200)
    ax.plot(s, [r["acc"] for r in down["runs"]], "o", color="0.6", ms=3, label="sweep runs")
    ax.plot(fitted, sigmoid(fitted), "-", color="C0", label=f"sigmoid (k={sh['k']:.3g}, s0={sh['s0']:.3g})")
    if reach and min(reach) < s.min():
        beyond = np.linspace(min(reach) - 0.3, s.min(), 100)
        ax.plot(beyond, sigmoid(beyond), "--", color="C0", alpha=0.7, label="sigmoid, extrapolated")
    ax.plot(
        [r["choice_loss"] for r in rows],
        [r["acc"] for r in rows],
        "*",
        color="C3",
        ms=10,
        label="held-out seeds",
    )
    for key, x in down.get("acc_forecasts", {}).items():
        at = soft.get(key, {}).get("value")
        iv = x.get("interval")
        if at is None:  # no soft forecast to place it at: a line across
            ax.axhline(x["value"], color="C1", alpha=0.5, ls="--")
            continue
        yerr = [[x["value"] - iv["low"]], [iv["high"] - x["value"]]] if iv else None
        ax.errorbar([at], [x["value"]], yerr=yerr, fmt="s", color="C1", capsize=4)
        ax.text(at, x["value"], f"  forecast at {float(key):.2g}", fontsize=7, va="bottom")
    ax.set(xlabel="choice_loss (-ln p(right | choices))", ylabel="accuracy", title="hard from soft")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/delphi-downstream.png", dpi=100)


def main() -> None:
    prefix = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SCHOONER_PREFIX", "schooner-output")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "docs/images/scaling"
    os.makedirs(out_dir, exist_ok=True)
    summary = collect(prefix)
    print(markdown(summary))
    if summary["scores"] and "error" not in summary["fit"]["delphi"]:
        plot(summary, out_dir)
    small = {k: v for k, v in summary.items() if k != "fit"}
    small["fit"] = {
        k: summary["fit"][k] for k in ("delphi", "backtest", "samples", "level") if k in summary["fit"]
    }
    small["fit"]["delphi"] = {k: v for k, v in summary["fit"]["delphi"].items() if k != "replicate_laws"}
    small["fit"]["runs"] = summary["fit"]["runs"]
    with open(f"{out_dir}/delphi-summary.json", "w") as f:
        json.dump(small, f, indent=1, sort_keys=True)
    print(json.dumps(summary["spread"], indent=1))
    for r in summary["downstream_scores"]:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    main()
