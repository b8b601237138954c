"""`train()` again on a run folder: a different run is refused naming what differs (the folder's `run.json`
keeps the first config), and extending a run whose schedule spans its length says the learning rate jumps."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig, train


def _config(nano, data_dir, out: str, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets=[(f"{data_dir}/train", 1.0)],
        seq_len=32,
        validation={},
        batch_size=8,
        num_train_steps=2,
        seed=2,
        optimizer=AdamConfig(learning_rate=1e-3, warmup=0),
        checkpoint=CheckpointConfig(every=None),
        trackers=TrackerConfig(loss_plot=False, log_every=1),
        output_path=out,
    )
    return TrainerConfig(**{**args, **kw})


def test_another_run_in_the_same_folder_is_refused_and_extending_a_cosine_run_says_the_lr_jumps(
    nano, data_dir, tmp_path, caplog
) -> None:
    out = str(tmp_path / "run")
    first = _config(nano, data_dir, out)
    train(first)
    recorded = (tmp_path / "run" / "run.json").read_text()

    other = dataclasses.replace(
        first, batch_size=16, seed=5, optimizer=AdamConfig(learning_rate=2e-3, warmup=0), num_train_steps=3
    )
    with pytest.raises(ValueError, match="holds a different run") as e:
        train(other)
    message = str(e.value)
    for part in ("batch_size: 8 -> 16", "optimizer.learning_rate: 0.001 -> 0.002", "seed: 2 -> 5"):
        assert part in message
    assert "num_train_steps:" not in message  # a longer run is an extension, not another run
    assert (tmp_path / "run" / "run.json").read_text() == recorded  # the first config is kept

    # The same run made longer: it resumes, and since a cosine schedule spans the run, says that the
    # learning rate of the next step is not the one the run was heading for (the old schedule's).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        summary = train(dataclasses.replace(first, num_train_steps=4))
    assert summary["start_step"] == 2
    old = first.optimizer.lr_schedule(2)(2)
    new = first.optimizer.lr_schedule(4)(2)
    assert abs(float(new) - float(old)) > 1e-5  # the jump the warning must name
    assert f"jumps from {float(old):.3g} (where the 2-step run was) to {float(new):.3g}" in caplog.text
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config"]["num_train_steps"] == 4
    assert [r["config"]["num_train_steps"] for r in info["earlier"]] == [2]  # the first config is kept


@pytest.mark.slow  # two more runs
def test_a_constant_schedule_extends_without_a_word(nano, data_dir, tmp_path, caplog) -> None:
    out2 = str(tmp_path / "constant")
    flat = _config(
        nano, data_dir, out2, optimizer=AdamConfig(learning_rate=1e-3, warmup=0, schedule="constant")
    )
    train(flat)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        train(dataclasses.replace(flat, num_train_steps=3))
    assert "learning rate" not in caplog.text


def test_a_field_one_record_lacks_is_not_a_difference() -> None:
    from schooner.train._resume_checks import _differences

    old = {"seed": 1, "optimizer": {"class": "AdamConfig", "learning_rate": 1e-3, "beta1": 0.9}}
    new = {"seed": 1, "optimizer": {"class": "AdamConfig", "learning_rate": 2e-3}, "new_knob": 0}
    assert _differences(old, new, "config") == ["config.optimizer.learning_rate: 0.001 -> 0.002"]
