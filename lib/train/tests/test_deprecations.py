"""Names that moved or went in schooner-train 0.x -> the trainer: each still imports, with a warning."""

from __future__ import annotations

import pytest


def test_train_config_and_data_config_warn_and_convert(nano) -> None:
    import schooner.train as st

    with pytest.warns(DeprecationWarning, match="schooner.train.TrainConfig is deprecated"):
        TrainConfig = st.TrainConfig
    with pytest.warns(DeprecationWarning, match="schooner.train.DataConfig is deprecated"):
        DataConfig = st.DataConfig
    old = TrainConfig(
        model=nano(),
        data=DataConfig({"c/train": 2.0}, seq_len=32, validation={}, block_size=64),
        output_path="runs/x",
        batch_size=8,
        num_train_steps=3,
        z_loss_weight=1e-4,
    )
    new, out = old.to_trainer_config()
    assert out == "runs/x" and new.output_path == "runs/x"
    assert new == st.TrainerConfig(
        model=nano(),
        datasets=[("c/train", 2.0)],
        seq_len=32,
        validation={},
        block_size=64,
        batch_size=8,
        num_train_steps=3,
        z_loss_weight=1e-4,
        fit_vocab=False,  # TrainConfig's default
        output_path="runs/x",
    )


def test_step_names_that_went_warn() -> None:
    import schooner.train.steps as steps
    from schooner.train import TrainerConfig

    with pytest.warns(DeprecationWarning, match="export_hf is now hf_export"):
        assert steps.export_hf is steps.hf_export
    with pytest.warns(DeprecationWarning, match="replaced by schooner.train.TrainerConfig"):
        assert steps.TrainLmConfig is TrainerConfig
    with pytest.warns(DeprecationWarning, match="SHARED_RUN_FIELDS is gone"):
        assert "model" in steps.SHARED_RUN_FIELDS
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        steps.nothing  # noqa: B018
