"""estimate_step_memory: the train step's memory from shapes alone equals the preflight check's figure for
the step `train()` really compiles, and grows with the batch."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    TrackerConfig,
    TrainerConfig,
    estimate_step_memory,
    train,
)


@pytest.mark.slow  # a real 1-step run and two compiles: 170 s on the shared 2-core machine at load 19
def test_the_estimate_equals_the_preflight_figure_of_the_real_run(nano, data_dir, tmp_path, caplog):
    cfg = TrainerConfig(
        model=nano(),
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        validation={},
        output_path=str(tmp_path / "run"),
        batch_size=8,
        num_train_steps=1,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        checkpoint=CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False),
    )
    with caplog.at_level(logging.INFO, logger="schooner.train"):
        train(cfg)
    logged = [r.getMessage() for r in caplog.records if "train step memory per device" in r.getMessage()]
    assert logged, caplog.text
    estimate = estimate_step_memory(cfg)
    assert estimate.describe() in logged[0], (estimate.describe(), logged[0])
    bigger = estimate_step_memory(dataclasses.replace(cfg, batch_size=16))
    assert bigger.temporaries > estimate.temporaries and bigger.arguments > estimate.arguments
