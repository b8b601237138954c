"""Slow fault tests with real processes: drivers killed at random moments, many drivers on one prefix."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "experiments_data"
CHAIN = str(HERE / "chain.py")
SLEEPS = "numbers=0.3,squares=0.4,cubes=0.2,report/total=0.3"


def _driver(prefix: Path, log: Path, **env: str) -> subprocess.Popen:
    full = {**os.environ, "EXP_LOG": str(log), "EXP_SLEEP": SLEEPS, "COLUMNS": "200", **env}
    full.pop("SCHOONER_PREFIX", None)
    return subprocess.Popen(
        [sys.executable, "-m", "schooner.cluster.cli", "run", CHAIN, "--prefix", str(prefix)],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _check_no_partial_success(prefix: Path) -> int:
    """Every folder marked SUCCESS holds its complete output and a SUCCESS record. Returns how many."""
    done = 0
    for status_file in prefix.rglob(".schooner/status.json"):
        folder = status_file.parent.parent
        status = json.loads(status_file.read_text())
        if status["status"] == "SUCCESS":
            assert (folder / "part-0.json").exists() and (folder / "part-1.json").exists(), folder
            assert json.loads((folder / ".schooner" / "step.json").read_text())["state"] == "SUCCESS"
            done += 1
    return done


def _outputs(prefix: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(prefix)): p.read_bytes()
        for p in sorted(prefix.rglob("*"))
        if p.is_file() and ".schooner" not in p.parts and "experiments" not in p.parts
    }


@pytest.mark.slow
def test_random_kill_9_never_leaves_partial_success_and_converges(tmp_path) -> None:
    rng = random.Random(1234)
    prefix, log = tmp_path / "out", tmp_path / "log"
    for _ in range(6):
        proc = _driver(prefix, log)
        time.sleep(rng.uniform(0.3, 2.0))  # the interpreter start is ~0.5 s of it
        proc.kill()
        proc.communicate(timeout=60)
        _check_no_partial_success(prefix)
    final = _driver(prefix, log)
    out, _ = final.communicate(timeout=120)
    assert final.returncode == 0, out
    assert _check_no_partial_success(prefix) == 4
    clean = tmp_path / "clean"
    clean_run = _driver(clean, tmp_path / "clean-log", EXP_SLEEP="")
    assert clean_run.communicate(timeout=120)[0] and clean_run.returncode == 0
    assert _outputs(prefix) == _outputs(clean)
    ends = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("end")]
    assert sorted(set(ends)) == ["cubes", "numbers", "report/total", "squares"]


@pytest.mark.slow
def test_four_drivers_on_one_prefix_run_every_step_exactly_once(tmp_path) -> None:
    prefix, log = tmp_path / "out", tmp_path / "log"
    drivers = [_driver(prefix, log) for _ in range(4)]
    outs = [d.communicate(timeout=180)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0, 0, 0], outs
    starts = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("start")]
    assert sorted(starts) == ["cubes", "numbers", "report/total", "squares"]
    assert _check_no_partial_success(prefix) == 4
