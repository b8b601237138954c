"""experiments/scaling/delphi_precision_report.py's check of the compute measure: optima that follow an exact
power law in compute with attention's FLOPs counted show that law's exponent at every step once the script
counts them, and a flatter law under 6 N D alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments.scaling import delphi_precision_report as report
from experiments.scaling.delphi_recipe import RECIPE


def test_attention_flops_turn_a_true_power_law_back_into_one(capsys) -> None:
    alpha, layers, seq = 0.08, 2, RECIPE.seq_len
    rows, optima = [], []
    for budget, width in ((1e11, 16), (1e12, 48), (1e13, 128)):
        params = (
            1024 * width + layers * 12 * width**2
        )  # tied embedding and the blocks, as the family roughly has
        tokens = budget / (6 * params)
        # one grid point each side, the same width (the ratio is read at the optimum's tokens between them)
        rows += [
            {
                "budget": budget,
                "tokens": tokens * f,
                "params": params,
                "layers": layers,
                "name": f"x-w{width}",
            }
            for f in (0.5, 2.0)
        ]
        true_compute = budget * (1 + 12 * layers * seq * width / (6 * params))  # Hoffmann et al.'s count
        optima.append(SimpleNamespace(budget=budget, tokens=tokens, loss=30 * true_compute**-alpha))
    report.attention_slopes(rows, SimpleNamespace(optima=optima))
    line = capsys.readouterr().out
    parts = dict(p.split(": ") for p in line.strip().removeprefix("local slopes, ").split("; "))
    chinchilla = [float(x) for x in parts["+ Chinchilla's attention"].split(", ")]
    nominal = [float(x) for x in parts["6 N D"].split(", ")]
    assert chinchilla == pytest.approx([alpha, alpha], abs=5e-5)
    # under 6 N D a small model's larger attention share is compute left out: the optima look flatter
    assert all(s < alpha - 0.001 for s in nominal), nominal
