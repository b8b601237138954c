"""experiments/scaling/delphi_noise.py: more seeds per sweep point, the suite's own runs reused by key."""

from __future__ import annotations

import importlib
import sys

import pytest


def _modules(monkeypatch):
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11,3e11")
    monkeypatch.setenv("SCHOONER_DELPHI_SWEEP_SEEDS", "2")
    for m in ("experiments.scaling.delphi_noise", "experiments.scaling.delphi_suite"):
        sys.modules.pop(m, None)
    return importlib.import_module("experiments.scaling.delphi_noise")


@pytest.fixture
def noise(monkeypatch):
    module = _modules(monkeypatch)
    yield module
    for m in ("experiments.scaling.delphi_noise", "experiments.scaling.delphi_suite"):
        sys.modules.pop(m, None)  # later importers get the defaults


def test_the_suite_s_runs_keep_their_keys_and_only_new_seeds_are_added(noise) -> None:
    runs = noise.declared_runs(noise.noise_seeds("1e11:3,3e11:2"))
    suite_keys = {r.train.key for r in noise.suite.runs}
    mine = {r.train.key for r in runs}
    assert suite_keys <= mine  # seeds 0 and 1 of both budgets: the suite's own steps, cached where it ran
    extra = [r for r in runs if r.train.key not in suite_keys]
    assert {(r.recipe.budget, r.train.config.seed) for r in extra} == {(1e11, 2)}
    assert len(extra) == len([r for r in noise.suite.runs if r.recipe.budget == 1e11]) // 2


@pytest.mark.parametrize(
    "text",
    [
        "1e11:3",
        "1e11:3,3e11:2,1e12:2",
        "1e11:3,3e11",
        "1e11:0,3e11:2",
        "1e11:3,1e11:2,3e11:2",
        "1e11:x,3e11:2",
    ],
)
def test_a_bad_seed_list_is_refused_with_the_variable_named(noise, text: str) -> None:
    with pytest.raises(SystemExit, match="SCHOONER_DELPHI_NOISE_SEEDS"):
        noise.noise_seeds(text)
