"""The recipe comparison (experiments/scaling/recipe_compare.py): both sweeps declared on the same data,
vocabulary, sequence length and validation at the budgets of SCHOONER_COMPARE_BUDGETS, and its table's
per-budget optima (a budget that does not bracket a minimum gets none, not a number)."""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import pytest

from schooner.train import AdamConfig
from schooner.train.scaling import ScalingRun

MODULE = "experiments.scaling.recipe_compare"


@pytest.fixture
def compare(monkeypatch):
    """The module imported afresh with budgets from the env list (given out of order)."""
    monkeypatch.setenv("SCHOONER_COMPARE_BUDGETS", "3e11,1e11")
    monkeypatch.setenv("SCHOONER_COMPARE_SIZES", "5")
    sys.modules.pop(MODULE, None)
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)  # later importers get the defaults


def test_both_sweeps_share_data_vocabulary_and_budgets(compare) -> None:
    from experiments.scaling.delphi_data import DATA, VOCAB

    assert compare.BUDGETS == (1e11, 3e11)  # the env list, smallest first
    assert set(compare.runs) == {"horizon", "adamw"}
    configs = {}
    for key, runs in compare.runs.items():
        assert sorted(r.recipe.budget for r in runs) == [1e11] * 5 + [3e11] * 5
        for r in runs:
            c = r.train.config
            assert r.train.name.startswith(f"scaling/compare/{key}/")
            assert c.datasets == tuple((k, 1.0) for k in DATA)
            assert c.model.vocab_size == VOCAB == 1024
            assert c.validation is None and c.eval_max_tokens is None  # each cache's whole validation split
            configs.setdefault("seq_len", set()).add(c.seq_len)
            configs.setdefault(key, set()).add(type(c.optimizer).__name__)
    assert configs["seq_len"] == {compare.SEQ_LEN}
    # each recipe its own optimizer: AdamW with weight decay against AdamH
    assert configs["adamw"] == {"AdamConfig"} and configs["horizon"] != {"AdamConfig"}
    assert all(isinstance(r.recipe.optimizer, AdamConfig) and r.recipe.optimizer.weight_decay > 0
               for r in compare.runs["adamw"])  # fmt: skip
    # the sweeps collect exactly those runs, and the comparison reads both
    for key, sweep in compare.sweeps.items():
        assert [e["train"] for e in sweep.config.runs] == [r.train for r in compare.runs[key]]
    assert compare.compare.config.new is compare.sweeps["horizon"]
    assert compare.compare.config.old is compare.sweeps["adamw"]
    assert compare.compare.config.budgets == (1e11, 3e11)


def _runs(budget: float, tokens: list[float], minimum: float, floor: float) -> list[ScalingRun]:
    """Runs on a parabola in ln D with its vertex at `minimum` tokens and loss `floor`."""
    return [
        ScalingRun(
            budget=budget, params=budget / (6 * d), tokens=d, loss=floor + 0.1 * math.log(d / minimum) ** 2
        )
        for d in tokens
    ]


def test_the_table_compares_parabola_minima_and_names_an_unbracketed_budget(compare) -> None:
    grid = list(np.geomspace(1e5, 1e7, 5))
    new = compare._optima(_runs(1e11, grid, 1e6, 4.0) + _runs(3e11, grid, 2e6, 3.5), (1e11, 3e11))
    # today's recipe: 1e11 bracketed above the new recipe; 3e11 with its minimum beyond the runs
    old = compare._optima(_runs(1e11, grid, 1e6, 4.2) + _runs(3e11, grid, 1e9, 3.0), (1e11, 3e11))
    assert new[1e11]["loss"] == pytest.approx(4.0) and new[1e11]["tokens"] == pytest.approx(1e6)
    assert "loss" not in old[3e11] and "do not bracket a minimum" in old[3e11]["error"]
    rows = compare.compare_rows(new, old)
    assert rows[0]["lower"] == "new" and rows[0]["diff_pct"] == pytest.approx(100 * (4.0 - 4.2) / 4.2)
    assert rows[1]["old_loss"] is None and rows[1]["diff_pct"] is None and rows[1]["lower"] is None
    table = compare.markdown(rows, new, old)
    assert "| 1e+11 | 4.0000 | 4.2000 | -4.76% | new | 4.0000 | 4.2000 | -4.76% |" in table  # vertex on a run
    assert rows[1]["old_best"] == pytest.approx(3.0 + 0.1 * math.log(1e7 / 1e9) ** 2)  # its most-tokens run
    assert "| 3e+11 | 3.5000 | no minimum |  |  |" in table and "old at 3e+11: the isoFLOP runs" in table


def test_the_goal_is_checked_where_both_recipes_have_an_optimum(compare) -> None:
    rows = [
        {"budget": 3e10, "lower": None},  # one recipe has no minimum: listed, not counted either way
        {"budget": 1e11, "lower": "new"},
        {"budget": 3e11, "lower": "new"},
    ]
    assert compare.goal(rows) == {
        "goal_met": True, "goal_checked_at": [1e11, 3e11], "goal_not_checkable_at": [3e10]
    }  # fmt: skip
    assert compare.goal([*rows, {"budget": 1e12, "lower": "old"}])["goal_met"] is False
    assert compare.goal(rows[:1])["goal_met"] is False  # nothing checkable is no evidence
