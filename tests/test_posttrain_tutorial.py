"""The post-training tutorial end to end through `schooner run`, with its own post-training budget after a
40-step pretraining (a new prefix: it pretrains first): every stage runs, the stage tables are printed (the
held-out chat scores and the bundled tasks beside chance), SFT lowers the held-out answer loss and DPO raises
its held-out reward accuracy. No cheaper test exists: every stage needs the pretrained model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "experiments" / "tutorials" / "posttrain_tiny_model.py"


@pytest.mark.slow
def test_posttrain_tutorial_runs_every_stage(tmp_path: Path) -> None:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = flags
    env.pop("SCHOONER_CLUSTER", None)
    env.pop("SCHOONER_POSTTRAIN_STEPS", None)
    env.pop("SCHOONER_POSTTRAIN_TASK_DOCUMENTS", None)
    env.update(SCHOONER_TUTORIAL_STEPS="40", SCHOONER_PREFIX=str(tmp_path), COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", "run", str(TUTORIAL)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "Held-out functions" in proc.stdout and "Bundled tasks" in proc.stdout
    (stages_file,) = tmp_path.glob("eval/tutorial-nano-posttrain-*/stages.json")
    stages = json.loads(stages_file.read_text())
    assert stages["sft"]["chat_loss"] < stages["pretrained"]["chat_loss"]
    # 20 DPO steps (after 40 of pretraining): above chance on unseen functions.
    assert stages["dpo"]["reward_accuracy"] > 0.6 > stages["pretrained"]["reward_accuracy"]
    names = {"docs_cloze", "docs_function_name", "docs_next_sentence"}
    for stage in ("pretrained", "sft", "dpo"):
        tasks = stages[stage]["tasks"]
        assert set(tasks) == names
        for t in tasks.values():  # 4-way questions: chance 1/4; the standard error a binomial one
            assert t["chance"] == pytest.approx(0.25) and t["documents"] == 200 and 0 <= t["acc"] <= 1
            assert t["acc_stderr"] == pytest.approx((t["acc"] * (1 - t["acc"]) / 199) ** 0.5, rel=1e-6)
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("chance"))
    assert row.split()[1:] == ["0.250"] * 3
    (hf,) = tmp_path.glob("hf/checkpoints/tutorial-nano-dpo-*")
    assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists()
