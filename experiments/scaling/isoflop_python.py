"""Scaling laws on the embedded corpus: an isoFLOP sweep, three fits, forecasts registered before their run.

    uv run python experiments/scaling/isoflop_python.py
    SCHOONER_SCALING_BUDGETS=1e11,2.15e11,4.64e11,1e12 uv run python experiments/scaling/isoflop_python.py

What happens (every step cached under the prefix, so a rerun only does what is missing):

1. `tokenizers/python-bpe-512`, `tokenized/python-*-bpe512`: a 512-token BPE on Python's docs and source (a
   small vocabulary keeps tiny models from being mostly embedding table), and the token caches.
2. `scaling/python`: per budget (`SCHOONER_SCALING_BUDGETS`, default 1e12, 3e12, 1e13 FLOPs), five models of
   the recipe's family around its prior optimum (100 tokens per parameter), each a `train_lm` step spending
   the budget exactly (`flops_per_token`), and a results step with every run's N, D, FLOPs and final
   validation loss.
3. `scaling/python-fit`: approach 2, approach 3 and variable projection with 200-sample bootstrap intervals;
   isoFLOP, frontier, fitted-vs-observed and residual plots.
4. `scaling/python-forecast-*`: the final loss of the compute-optimal run at `SCHOONER_SCALING_TARGET`
   (default 10x the largest budget), predicted by each method and written down, with its interval.
   Only then is the target run declared: phase 2 below reads the forecast's target from its result.
5. `scaling/python-target` (+ its evaluation) trains that run; `scaling/python-forecast-*-score` score each
   forecast: error in percent, inside its interval or not, written before the run started or not.

The default scale needs about 1.7e14 FLOPs (hours on 2 busy CPU cores); docs/scaling.md reports the run
this file made and at what scale.
"""

import os

from experiments.tokenizer_defs import python_code_records, python_docs_records
from schooner.cluster import RunResult, StepRunner, write_report
from schooner.eval.steps import evaluate
from schooner.tokenize.steps import tokenized, train_tokenizer
from schooner.train.scaling import (
    ModelFamily,
    ScalingRecipe,
    fit_scaling_law,
    forecast,
    isoflop_sweep,
    score_forecast,
)
from schooner.train.steps import train_lm

BUDGETS = tuple(float(b) for b in os.environ.get("SCHOONER_SCALING_BUDGETS", "1e12,3e12,1e13").split(","))
TARGET = float(os.environ.get("SCHOONER_SCALING_TARGET", 10 * max(BUDGETS)))
VOCAB = 512

tokenizer = train_tokenizer(
    "tokenizers/python-bpe-512",
    paths=[python_docs_records, python_code_records],
    vocab_size=VOCAB,
    max_chars=6_000_000,
)
docs = tokenized("tokenized/python-docs-bpe512", source="python-docs", tokenizer=tokenizer)
code = tokenized("tokenized/python-code-bpe512", source="python-code", tokenizer=tokenizer)
DATA = {docs: 0.17, code: 0.83}  # about the corpus' own proportions: every document is repeated equally often

# Widths every 8 (heads of 8) so that the smallest models, 1-layer at these budgets, are finely spaced; a
# prior of 100 tokens per parameter centres the grids: a first sweep centred on Chinchilla's 20 found every
# budget's best run at the small end of its grid (docs/scaling.md shows it).
RECIPE = ScalingRecipe(
    family=ModelFamily(vocab_size=VOCAB, min_width=16, head_dim=8, width_step=8), tokens_per_param=100
)
# Score the whole validation split of each cache (no sampling noise); checkpoint every 500 steps (runtime-only:
# not part of a run's identity), so that an hours-long run killed midway resumes where it was.
TRAIN = dict(eval_max_tokens=None, checkpoint_every=500, keep_checkpoints=1)

sweep = isoflop_sweep(
    "scaling/python", budgets=BUDGETS, sizes_per_budget=5, data=DATA, recipe=RECIPE, **TRAIN
)
fit = fit_scaling_law("scaling/python-fit", sweep, samples=200, level=0.9)
forecasts = {
    method: forecast(f"scaling/python-forecast-{method}", fit, budget=TARGET, recipe=RECIPE, method=method)
    for method in ("varpro", "approach3", "frontier")
}


def target_steps(width: int, methods: list[str]) -> tuple:
    """The target run (declared only once the forecasts exist), its evaluation and the scores."""
    run = train_lm("scaling/python-target", **RECIPE.run(TARGET, width), datasets=DATA, **TRAIN)
    evaluation = evaluate(
        "scaling/python-target-eval",
        checkpoint=run,
        datasets={"python-docs": docs, "python-code": code},
        tokenizer=tokenizer,
        seq_len=RECIPE.seq_len,
    )
    scores = {
        m: score_forecast(f"{forecasts[m].name}-score", forecasts[m], run=run, evaluation=evaluation)
        for m in methods
    }
    return run, evaluation, scores


def print_summary(fitted: dict, registered: RunResult, scored: RunResult, scores: dict) -> None:
    print("\nFitted exponents (90% bootstrap intervals):")
    for key, value in fitted.items():
        if not key.endswith("_interval") and key != "runs":
            print(f"  {key:<16} {value!s:<9} {fitted.get(key + '_interval', '')}")
    print(f"\nForecasts for C = {TARGET:.3g} ({TARGET / max(BUDGETS):.0f}x the largest fitted budget):")
    for method, s in scores.items():
        r = scored[s].result
        iv = r["interval"]  # None when too few bootstrap refits succeeded (the forecast says why)
        interval = f"[{iv[0]:.4f}, {iv[1]:.4f}]" if iv else "[no interval]"
        print(
            f"  {method:<10} predicted {r['predicted']:.4f} {interval}  actual {r['actual']:.4f}  "
            f"error {r['error_pct']:+.2f}%  inside {r['inside_interval']}  "
            f"registered before the run {r['registered_before_run']}  the target run {r['matches_target']}"
        )
        if r.get("backtest_error_pct") is not None:  # the largest budget predicted from the smaller ones
            print(
                f"  {'':<10} backtest error {r['backtest_error_pct']:+.2f}%, "
                f"scaled to this forecast's reach {r['backtest_scaled_error_pct']:+.2f}%"
            )
    print(f"\nreport: {write_report(scored.prefix)}")


def main() -> None:
    runner = StepRunner()
    fitted = runner.main([fit])
    if fitted.dry_run:
        print("(the forecasts, the target run and the scores are declared once the fit exists)")
        return
    summary = fitted[fit].result
    # A method whose fit failed forecasts nothing (approach 2, behind the frontier, fails when a budget's runs
    # do not bracket a minimum; approach 3 when it converges to a negative exponent).
    fitted_by = {"varpro": "varpro", "approach3": "approach3", "frontier": "approach2"}
    methods = [m for m in forecasts if f"{fitted_by[m]}.error" not in summary]
    if not methods:
        raise SystemExit(f"every fit failed; see {fitted[fit].output_path}/fit.json")
    registered = runner.main([forecasts[m] for m in methods])
    target = registered[forecasts[methods[0]]].result["target"]  # every forecast names the same target run
    _, _, scores = target_steps(target["width"], methods)
    scored = runner.main(list(scores.values()))
    print_summary(summary, registered, scored, scores)


if __name__ == "__main__":
    main()
