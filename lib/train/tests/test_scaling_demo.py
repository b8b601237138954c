"""The demonstration, experiments/scaling/isoflop_python.py, end to end at a tiny scale (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("experiments")
pytest.importorskip("schooner.eval")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.slow
def test_the_demonstration_registers_forecasts_then_scores_them(tmp_path) -> None:
    env = {
        **os.environ,
        "SCHOONER_PREFIX": str(tmp_path),
        "SCHOONER_SCALING_BUDGETS": "3e10,6e10",
        "SCHOONER_SCALING_TARGET": "1.2e11",
    }
    script = os.path.join(ROOT, "experiments", "scaling", "isoflop_python.py")
    done = subprocess.run(
        [sys.executable, script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Forecasts for C = 1.2e+11" in done.stdout
    found = {name: [] for name in ("forecast.json", "score.json")}
    for root, _, files in os.walk(tmp_path / "scaling"):
        for name in found:
            if name in files:
                found[name].append(os.path.join(root, name))
    scores = found["score.json"]
    # One forecast per method whose fit succeeded (at this tiny scale one may not), each scored.
    assert 1 <= len(scores) == len(found["forecast.json"]) <= 3
    for path in scores:
        with open(path) as f:
            s = json.load(f)
        assert s["registered_before_run"] is True and s["matches_target"] is True
        assert s["error_pct"] == pytest.approx(100 * (s["predicted"] - s["actual"]) / s["actual"])
