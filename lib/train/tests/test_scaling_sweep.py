"""The sweep records what the recipe warned of (a grid on one side of the prior optimum, runs below
min_steps) in its runs and in its results, not only in the log of the process that declared it.

Expected warnings come from the recipe's own rules, recomputed here: which member is the smallest that fits
(the family's `min_width`), and which runs train fewer than `min_steps` steps.
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

from schooner.cluster import StepRunner
from schooner.train.scaling import (
    BatchRule,
    ModelFamily,
    ScalingRecipe,
    isoflop_runs,
    isoflop_sweep,
    sweep_results,
)

RULES = ScalingRecipe(
    family=ModelFamily(vocab_size=320, min_width=16, max_width=64, width_per_layer=64),
    batch=BatchRule(base_sequences=8, minimum=8, maximum=8),
    seq_len=32,
    min_steps=20,
)
TINY, CLEAN = (
    1e8,
    3e10,
)  # at 1e8 the prior optimum is the smallest member and every run is short; 3e10 is fine


def test_each_run_carries_its_budget_s_grid_warnings_and_the_results_step_is_given_them(
    data_dir, caplog
) -> None:
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._sweep"):
        runs = isoflop_runs(
            "scaling/w", budgets=[TINY, CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES
        )
    tiny = [r for r in runs if r.recipe.budget == TINY]
    clean = [r for r in runs if r.recipe.budget == CLEAN]
    assert len(tiny) == 3 and len(clean) == 3
    assert (
        tiny[0].recipe.width == RULES.family.min_width
    )  # the prior optimum (width 16) is the smallest member
    short = [r.recipe.width for r in tiny if r.recipe.num_train_steps < RULES.min_steps]
    assert short == [r.recipe.width for r in tiny]
    for r in tiny:
        assert len(r.warnings) == 2
        one_sided, few_steps = r.warnings
        assert "smallest family member" in one_sided and "one side" in one_sided
        assert f"width(s) {short}" in few_steps and "min_steps=20" in few_steps
    assert all(r.warnings == () for r in clean)
    assert all(w in caplog.text for w in tiny[0].warnings)  # still logged at declaration

    sweep = isoflop_sweep(
        "scaling/w", budgets=[TINY, CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES
    )
    given = {e["name"]: e["warnings"] for e in sweep.config.runs}
    assert given == {r.train.name: list(r.warnings) for r in runs}


@pytest.mark.slow
def test_the_results_record_the_warnings_per_run_and_per_budget(data_dir, tmp_path) -> None:
    """One real run (width 16, 7 steps: below min_steps=20) through the step runner (10 s under load)."""
    sweep = isoflop_sweep(
        "scaling/short",
        budgets=[TINY],
        sizes_per_budget=1,
        data={data_dir: 1.0},
        recipe=RULES,
        resources=None,
    )
    (run,) = isoflop_runs(
        "scaling/short", budgets=[TINY], sizes_per_budget=1, data={data_dir: 1.0}, recipe=RULES
    )
    assert run.recipe.num_train_steps < RULES.min_steps and len(run.warnings) == 1
    done = StepRunner(prefix=str(tmp_path)).run([sweep], max_concurrent=1)
    with open(f"{done[sweep].output_path}/runs.jsonl") as f:
        (row,) = [json.loads(line) for line in f]
    assert row["warnings"] == list(run.warnings) and row["steps"] == run.recipe.num_train_steps
    assert done[sweep].result["warnings"] == {f"{TINY:.3g}": list(run.warnings)}


def test_seeds_repeat_every_grid_point_and_keep_seed_0_s_runs_as_they_were(data_dir) -> None:
    plain = isoflop_runs("scaling/s", budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    seeded = isoflop_runs(
        "scaling/s", budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES, seeds=[0, 1, 2]
    )
    assert len(seeded) == 9
    # Seed 0's runs are the very steps of the sweep without seeds: adding seeds retrains none of them.
    assert [r.train.key for r in seeded if r.train.config.seed == 0] == [r.train.key for r in plain]
    assert [r.train.name for r in seeded if r.train.config.seed == 0] == [r.train.name for r in plain]
    for seed in (1, 2):
        runs = [r for r in seeded if r.train.config.seed == seed]
        assert [r.train.name for r in runs] == [f"{r.train.name}-s{seed}" for r in plain]
        # the same model and data as seed 0's run at the point: only the seed differs
        assert [r.recipe for r in runs] == [r.recipe for r in plain]
    assert len({r.train.key for r in seeded}) == 9
    # The results step names its runs; without seeds its config is the one it always had.
    declare = dict(budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    assert isoflop_sweep("scaling/s", **declare, seeds=[0]).key == isoflop_sweep("scaling/s", **declare).key


def test_numpy_integer_seeds_give_the_steps_of_plain_int_seeds(data_dir) -> None:
    """seeds=np.arange(2) was refused (np.int64 is no int): any integer is taken, stored as a plain int."""
    declare = dict(budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    plain = isoflop_runs("scaling/s", **declare, seeds=[0, 1])
    numpy = isoflop_runs("scaling/s", **declare, seeds=np.arange(2))
    assert [r.train.key for r in numpy] == [r.train.key for r in plain]
    assert {type(r.train.config.seed) for r in numpy} == {int}
    assert (
        isoflop_sweep("scaling/s", **declare, seeds=np.arange(2)).key
        == isoflop_sweep("scaling/s", **declare, seeds=[0, 1]).key
    )


@pytest.mark.parametrize(
    ("seeds", "extra", "match"),
    [
        ([], {}, "at least one"),
        ([0, 0], {}, "distinct"),
        ([0, "1"], {}, "integers"),
        ([0, True], {}, "integers"),
        (np.array([0.0, 1.0]), {}, "integers"),
        ([0, 1], {"seed": 3}, "not both"),
        (2, {}, r"seeds is the list of seeds, got 2; for 2 seeds per point give seeds=range\(2\)"),
        (np.arange(2), {"seed": 3}, r"as seeds=\[0, 1\] or as seed=3"),  # plain ints, not np.int64(0)
    ],
)
def test_bad_seeds_are_refused_when_the_sweep_is_declared(data_dir, seeds, extra, match) -> None:
    with pytest.raises(ValueError, match=match):
        isoflop_runs(
            "scaling/b", budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES, seeds=seeds,
            **extra,
        )  # fmt: skip


def test_sweep_results_of_declared_runs_is_the_sweeps_own_step_and_warns_once(data_dir, caplog) -> None:
    """An experiment that needs the runs (to score each) and the results step declares the grid once:
    `isoflop_runs` then `sweep_results`, the same step as `isoflop_sweep`'s, its warnings logged once (the
    Delphi suite called both declarers and printed every grid warning twice)."""
    declare = dict(
        budgets=[TINY, CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES, seeds=[0, 1]
    )
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._sweep"):
        runs = isoflop_runs("scaling/w", **declare)
        results = sweep_results("scaling/w", runs)
    one_sided = [r.message for r in caplog.records if "one side" in r.message]
    assert len(one_sided) == 1, one_sided
    sweep = isoflop_sweep("scaling/w", **declare)
    assert results.key == sweep.key and results.name == sweep.name and results.config == sweep.config
    with pytest.raises(ValueError, match="no runs"):
        sweep_results("scaling/w", [])


def test_sweep_results_refuses_a_run_given_twice_or_a_step_in_place_of_a_run(data_dir) -> None:
    """Lists of runs joined by hand (`a + b` over overlapping budgets) gave a run twice: its loss went into
    runs.jsonl, and the fit, twice. A training step handle where a `SweepRun` belongs failed on `.recipe`."""
    runs = isoflop_runs("scaling/d", budgets=[CLEAN], sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    with pytest.raises(ValueError, match=rf"{re.escape(runs[1].train.name)} is given twice;"):
        sweep_results("scaling/d", runs + runs[1:2])
    with pytest.raises(TypeError, match=r"SweepRun.*isoflop_runs"):
        sweep_results("scaling/d", [r.train for r in runs])
    # any iterable of runs (a filter of the declared ones), as a list is
    assert sweep_results("scaling/d", (r for r in runs)).config == sweep_results("scaling/d", runs).config
