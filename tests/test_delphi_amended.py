"""experiments/scaling/delphi_amended.py names its steps by the smallest budget it keeps."""

from __future__ import annotations

import pytest

from experiments.scaling import delphi_amended


@pytest.mark.parametrize(
    ("budget", "tag"),
    [
        (3e11, "scaling/delphi-amend-3e11"),
        (1e12, "scaling/delphi-amend-1e12"),
        (2.5e11, "scaling/delphi-amend-2.5e11"),
    ],
)
def test_the_step_names_the_budget_it_fits_from(budget: float, tag: str) -> None:
    # with one significant digit, 2.5e11 was named 2e11 (and 1.5e12 2e12): a step named for budgets it does not fit
    assert delphi_amended.amend_tag(budget) == tag
