"""`train(config, output_path)`: a `TrainerConfig`'s objective builds the run's parts, the `Trainer` runs them."""

from __future__ import annotations

import traceback
from typing import Any

from ._config import TrainerConfig
from ._legacy import TrainConfig
from ._lm import LanguageModeling
from ._memory import StepMemoryError
from ._run_info import RunLog, enable_compilation_cache, maybe_init_distributed
from ._trainer import Trainer


def train(config: TrainerConfig | TrainConfig, output_path: str | None = None) -> dict[str, Any]:
    """Run (or resume) training as configured; returns a summary.

    Resumes automatically from the latest complete checkpoint in `output_path`. The config's `objective`
    (None: `LanguageModeling()`) builds the data, loss, evaluators and hooks (`Setup`); `Trainer` runs them.

    Args:
        config: the run (a deprecated `TrainConfig` is converted).
        output_path: the run folder (local or an fsspec URL); None: `config.output_path`.

    Returns:
        `{"steps", "final_loss", "checkpoint", "eval", "tokens_per_second", "mfu", ...}`.

    Raises:
        ValueError: an inconsistent configuration (before anything is compiled).
        StepMemoryError: the compiled step does not fit in device memory (before the first step; the message
            names the options). The run's device buffers are released first, so the caller can retry with a
            smaller batch in the same process.
        NonFiniteLossError: the loss or gradient became NaN/Inf (the message names the step; the last good
            checkpoint is kept).
    """
    from schooner.cluster import storage

    if isinstance(config, TrainConfig):
        if output_path is not None and output_path != config.output_path:
            raise ValueError(
                f"train: a TrainConfig names its run folder ({config.output_path!r}); got output_path="
                f"{output_path!r} too. Pass a TrainerConfig and output_path, or leave output_path out"
            )
        config, output_path = config.to_trainer_config()
    if not isinstance(config, TrainerConfig):
        raise TypeError(f"train: config must be a TrainerConfig, got {type(config).__name__}")
    output_path = output_path or config.output_path
    if not output_path:
        raise ValueError("train: no run folder; give output_path (or TrainerConfig.output_path)")
    storage.makedirs(output_path)
    maybe_init_distributed()  # before the log: on several hosts only process 0 writes train.log
    logs = RunLog(output_path)
    trainer: Trainer | None = None
    try:
        enable_compilation_cache()
        setup = (config.objective or LanguageModeling()).setup(config, output_path)
        trainer = Trainer(
            config,
            output_path=output_path,
            model_config=setup.model_config,
            objective=setup.objective,
            data=setup.data,
            evaluators=setup.evaluators,
            hooks=setup.hooks,
            metadata=setup.metadata,
        )
        return trainer.run()
    except StepMemoryError as e:
        # The traceback's frames (and the cycle through the XLA error it chains) hold the model and optimizer
        # state: drop them now, not at some later garbage collection, so a retry finds the device empty.
        if trainer is not None:
            trainer.state = None
        for err in (e, e.__cause__):
            if err is not None:
                traceback.clear_frames(err.__traceback__)
        raise
    finally:
        logs.close()
