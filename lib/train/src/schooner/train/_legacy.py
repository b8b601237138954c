"""Deprecated: `TrainConfig` and `DataConfig`, the run config before `TrainerConfig` (schooner-train 0.x).

`schooner.train.TrainConfig` / `DataConfig` still import (with a DeprecationWarning) and `train()` still takes
a `TrainConfig`: `to_trainer_config()` gives the `TrainerConfig` and the run folder it stands for. Use
`TrainerConfig(model, datasets=[(cache, weight)], seq_len, ...)` and `train(config, output_path)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._checkpoint import CheckpointConfig
from ._config import BatchSchedule, TrainerConfig
from ._mesh import MeshConfig
from ._optim import AdamConfig, OptimizerConfig
from ._tracking import TrackerConfig


@dataclass(frozen=True)
class DataConfig:
    """Deprecated: `TrainerConfig.datasets`, `seq_len`, `validation`... The training mixture and the validation sets.

    Example:
        >>> DataConfig(components={"out/docs/train": 1.0}, seq_len=256).seq_len
        256
    """

    components: Mapping[str, float]
    """Token cache folder (or tokenized step folder) -> mixture weight."""
    seq_len: int
    """Tokens per training sequence."""
    validation: Mapping[str, str] | None = None
    """Validation caches, name -> folder. None: the `validation/` cache next to each component's
    `train/` cache when it exists (named after the component's folder); {} disables eval."""
    weight_schedule: Sequence[tuple[int, Mapping[str, float]]] | None = None
    """Mixture weights by step: `[(start_step, {component: weight}), ...]` (see MixtureDataset)."""
    block_size: int = 1024
    """Sequences per mixture sampling block."""
    eval_max_tokens: int | None = 65_536
    """Score the first this many tokens of each validation cache at each evaluation (fixed, so numbers
    compare across steps and runs; `schooner.eval.evaluate_lm` with the same `max_tokens` and `seq_len` gives
    the same numbers). None: every token."""

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("DataConfig.components is empty; give at least one {cache_path: weight}")
        for k, w in self.components.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
                raise ValueError(
                    f"DataConfig.components[{k!r}] weight must be a finite number >= 0, got {w!r}"
                )
        if sum(self.components.values()) <= 0:
            raise ValueError(
                f"DataConfig.components weights sum to 0: {dict(self.components)}; give one a weight > 0"
            )
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"DataConfig.seq_len must be an int >= 2, got seq_len={self.seq_len!r}")
        if self.eval_max_tokens is not None and (
            isinstance(self.eval_max_tokens, bool)
            or not isinstance(self.eval_max_tokens, int)
            or self.eval_max_tokens < 2
        ):
            raise ValueError(
                f"DataConfig.eval_max_tokens must be an int >= 2 or None (all), got {self.eval_max_tokens!r}"
            )


@dataclass(frozen=True)
class TrainConfig:
    """Deprecated: use `TrainerConfig` (and `train(config, output_path)`). Everything a training run needs.

    Example:
        >>> from schooner.model import presets                                        # doctest: +SKIP
        >>> cfg = TrainConfig(model=presets.llama_nano, data=DataConfig({"c/train": 1.0}, seq_len=64),
        ...                   batch_size=8, num_train_steps=100, output_path="out/run")  # doctest: +SKIP
    """

    model: Any
    """The model config (a schooner.model LlamaConfig / MoEConfig)."""
    data: DataConfig
    """Training mixture and validation caches."""
    output_path: str
    """Run folder: checkpoints `step-NNNNNN/`, `metrics.jsonl`, `loss.png`, `run.json`."""
    batch_size: int | BatchSchedule = 8
    """Sequences per optimizer step (global, over all devices), or a schedule by step."""
    num_train_steps: int | None = None
    """Optimizer steps; give this or `train_tokens`."""
    train_tokens: int | None = None
    """Token budget: steps = ceil(train_tokens / (batch_size * seq_len)) (constant batch size only)."""
    optimizer: OptimizerConfig = field(default_factory=AdamConfig)
    """AdamConfig or MuonConfig (with the learning-rate schedule)."""
    z_loss_weight: float = 0.0
    """Weight of the output z-loss (mean squared log-partition); 1e-4 is common."""
    compute_dtype: str | None = None
    """Mixed precision: activation/matmul dtype ("bfloat16", "float32"); parameters and optimizer state stay
    float32. None keeps the model config's `compute_dtype`."""
    microbatches: int = 1
    """Gradient accumulation: split each batch into this many microbatches (same result, less memory)."""
    seed: int = 0
    """Seed of the initialization, the data order and the per-step RNG (`fold_in(key, step)`)."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh and axis mappings."""
    eval_every: int | None = None
    """Evaluate on the validation caches every this many steps (and at the end); None: only at the end."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint policy."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Metric sinks and progress frequency."""
    tokenizer: str | None = None
    """Tokenizer folder/file: byte lengths for bits-per-byte. None: the one the caches record, when it can
    be found."""
    fit_vocab: bool = False
    """Raise the model's `vocab_size` to the caches' tokenizer vocabulary when it is smaller (a preset's
    vocab rarely matches your tokenizer). False: a smaller model vocab is an error."""
    name: str = "train"
    """Run name (trackers, logs)."""
    initialize_from: str | None = None
    """Start from these weights (a run folder, a checkpoint folder or a Hugging Face folder) with a fresh
    optimizer state and schedule; None: a random initialization. See `schooner.train._init`."""
    initialize_from_step: int | None = None
    """With a run folder in `initialize_from`: its checkpoint of this step (None: the latest)."""

    def __post_init__(self) -> None:
        if not isinstance(self.data, DataConfig):
            raise TypeError(f"TrainConfig.data must be a DataConfig, got {type(self.data).__name__}")
        if isinstance(self.batch_size, Sequence) and not isinstance(self.batch_size, str):
            object.__setattr__(self, "batch_size", BatchSchedule(tuple(self.batch_size)))
        if not self.output_path:
            raise ValueError("TrainConfig.output_path is empty; give the run folder")
        # Everything else is validated once, by the config this one stands for (its errors name the
        # TrainerConfig fields a user moves to).
        self.to_trainer_config()

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size the run uses."""
        return self.batch_size.sizes if isinstance(self.batch_size, BatchSchedule) else (self.batch_size,)

    def batch_size_at(self, step: int) -> int:
        """The batch size of (0-based) step `step`."""
        return self.batch_size(step) if isinstance(self.batch_size, BatchSchedule) else self.batch_size

    @property
    def steps(self) -> int:
        """The number of optimizer steps (from `num_train_steps` or the token budget)."""
        if self.num_train_steps is not None:
            return self.num_train_steps
        assert self.train_tokens is not None and isinstance(self.batch_size, int)
        return math.ceil(self.train_tokens / (self.batch_size * self.data.seq_len))

    def to_trainer_config(self) -> tuple[TrainerConfig, str]:
        """`(TrainerConfig, output_path)`: the same run in the one run config."""
        d = self.data
        return (
            TrainerConfig(
                model=self.model,
                datasets=tuple(d.components.items()),
                seq_len=d.seq_len,
                optimizer=self.optimizer,
                batch_size=self.batch_size,
                num_train_steps=self.num_train_steps,
                train_tokens=self.train_tokens,
                z_loss_weight=self.z_loss_weight,
                validation=d.validation,
                eval_every=self.eval_every,
                eval_max_tokens=d.eval_max_tokens,
                weight_schedule=d.weight_schedule,
                block_size=d.block_size,
                tokenizer=self.tokenizer,
                seed=self.seed,
                microbatches=self.microbatches,
                compute_dtype=self.compute_dtype,
                mesh=self.mesh,
                fit_vocab=self.fit_vocab,
                initialize_from=self.initialize_from,
                initialize_from_step=self.initialize_from_step,
                checkpoint=self.checkpoint,
                trackers=self.trackers,
                name=self.name,
                output_path=self.output_path,
            ),
            self.output_path,
        )
