"""experiments/scaling/delphi_noise.py: more seeds per sweep point, the suite's own runs reused by key."""

from __future__ import annotations

import importlib
import math
import sys

import pytest

# Imported with the default budgets on purpose, as any earlier test module in the same process does
# (tests/test_delphi_amended.py at collection): the fixture must not hand the noise module this suite.
from experiments.scaling import delphi_suite as _default_suite  # noqa: F401

SUITE = (
    "experiments.scaling.delphi_suite",
    "experiments.scaling.delphi_heldout",
    "experiments.scaling.delphi_noise",
)


@pytest.fixture
def noise(monkeypatch):
    """delphi_noise imported afresh under a small suite's environment. The suite's modules read the environment
    at import, so each is taken out of sys.modules and off the `experiments.scaling` package (`from
    experiments.scaling import delphi_suite` reads the package's attribute first), then put back as they were."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11,3e11")
    monkeypatch.setenv("SCHOONER_DELPHI_SWEEP_SEEDS", "2")
    package = importlib.import_module("experiments.scaling")
    saved = {m: sys.modules.pop(m, None) for m in SUITE}
    attrs = {m: package.__dict__.pop(m.rpartition(".")[2], None) for m in SUITE}
    try:
        yield importlib.import_module("experiments.scaling.delphi_noise")
    finally:
        for m in SUITE:
            sys.modules.pop(m, None)
            package.__dict__.pop(m.rpartition(".")[2], None)
            if saved[m] is not None:
                sys.modules[m] = saved[m]
            if attrs[m] is not None:
                setattr(package, m.rpartition(".")[2], attrs[m])


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


def test_the_report_prints_a_budget_without_a_standard_error(noise, capsys) -> None:
    """A budget of three runs has loss_se None (and no lack of fit): the report says n/a for its figures and its
    slopes' standard errors instead of failing after the fit has run."""
    optimum = {"runs": 6, "loss_se": 0.01, "lack_of_fit": {"pure_error_sd": 0.02, "F": 3.0, "p": 0.01}}
    fit = {
        "delphi": {
            "law": {"E": 0.0, "A": 30.0, "alpha": 0.08},
            "optima": [
                optimum | {"budget": 1e11, "loss": 4.4},
                {"budget": 3e11, "loss": 4.0, "runs": 3, "loss_se": None, "lack_of_fit": None},
                optimum | {"budget": 1e12, "loss": 3.7, "loss_se": 0.0},
            ],
        }
    }
    noise.report(fit)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "3e+11     3  4.0000  n/a" in out
    assert "1e+12     6  3.7000  0.0000" in out  # an exact 0 is a figure, not a missing one
    slope = math.log(4.4 / 4.0) / math.log(3)
    assert any(
        line.strip().startswith("1e+11 -> 3e+11") and f"{slope:.4f} (n/a)" in line for line in lines
    ), out
