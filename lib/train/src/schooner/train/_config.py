"""`TrainerConfig`: the one config of a training run, and the step config of `train_lm`, `sft` and `dpo`.

Every knob of a run is one field here, with its docstring: the step builders pass their arguments through
and the trainer reads the field. Inputs are `(input, weight)` pairs whose input is a tokenized step's handle
or a cache folder, so a step keeps its handles in the config and the runner replaces them with their
folders before the run (`schooner.cluster.resolve_config`, which runs `__post_init__` again on the paths).

Checks that need only the config run in `__post_init__`; checks that need the devices or the caches
(batch divisible by the data-parallel size, vocab vs the caches' tokenizer) run in `check_run` before
anything is compiled.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster import runtime_field

from ._checkpoint import CheckpointConfig
from ._mesh import MeshConfig
from ._optim import AdamConfig, OptimizerConfig
from ._tracking import TrackerConfig

_DTYPES = ("float32", "bfloat16", "float16")
logger = logging.getLogger("schooner.train")


@dataclass(frozen=True)
class BatchSchedule:
    """Batch size by step: `[(start_step, batch_size), ...]`, the first entry starting at step 0.

    Example:
        >>> BatchSchedule(((0, 8), (100, 16)))(150)
        16
    """

    stages: tuple[tuple[int, int], ...]
    """Ascending (start_step, batch_size) pairs; the first start_step must be 0."""

    def __post_init__(self) -> None:
        stages = tuple((int(s), int(b)) for s, b in self.stages)
        object.__setattr__(self, "stages", stages)
        if not stages or stages[0][0] != 0:
            raise ValueError(f"BatchSchedule must start at step 0, got stages={stages!r}")
        for (s0, _), (s1, _) in zip(stages, stages[1:]):
            if s1 <= s0:
                raise ValueError(f"BatchSchedule start steps must increase, got {s0} then {s1} in {stages!r}")
        for s, b in stages:
            if b < 1:
                raise ValueError(f"BatchSchedule batch size at step {s} must be >= 1, got {b}")

    def __call__(self, step: int) -> int:
        return next(b for s, b in reversed(self.stages) if s <= step)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every batch size the schedule uses."""
        return tuple(b for _, b in self.stages)


@dataclass(frozen=True)
class TrainerConfig:
    """Everything a training run needs besides its output folder; the step config of `train_lm`, `sft`
    and `dpo`. Validated here and (with the devices and caches) in `check_run`.

    Example:
        >>> from schooner.model import presets
        >>> cfg = TrainerConfig(model=presets.llama_nano, datasets=[("tok/docs/train", 1.0)], seq_len=64,
        ...                     batch_size=8, num_train_steps=100)
        >>> cfg.steps, cfg.datasets
        (100, (('tok/docs/train', 1.0),))
    """

    model: Any
    """The model config (a schooner.model LlamaConfig / MoEConfig)."""
    datasets: Sequence[tuple[Any, float]]
    """`(input, weight)` pairs: a tokenized step's handle or a token cache folder (a tokenized folder's
    `train/` cache is used), and its mixture weight. A mapping `{input: weight}` is accepted."""
    seq_len: int
    """Tokens per training sequence."""
    optimizer: OptimizerConfig = field(default_factory=AdamConfig)
    """AdamConfig, MuonConfig or AdamHConfig (with the learning-rate schedule)."""
    batch_size: Any = 8
    """Sequences (rows) per optimizer step, global over all devices, or a `BatchSchedule` (or its
    `[(start_step, batch_size), ...]`)."""
    num_train_steps: int | None = None
    """Optimizer steps; give this or `train_tokens`."""
    train_tokens: int | None = None
    """Token budget: steps = ceil(train_tokens / (batch_size * seq_len)) (constant batch size only)."""
    objective: Any = None
    """What is minimised, as a config whose `setup` builds the run's parts (`schooner.train._objective`):
    None is language modeling (`LanguageModeling`: pretraining, and SFT on chat caches); `Dpo(...)`."""
    z_loss_weight: float = 0.0
    """Weight of the output z-loss (mean squared log-partition) of language modeling; 1e-4 is common."""
    validation: Mapping[str, Any] | None = None
    """Validation caches `{name: handle_or_folder}`. None: the `validation/` cache next to each dataset
    when it has one (named after the dataset's folder); {} disables evaluation."""
    evals: Mapping[str, Any] | None = None
    """More validation caches `{name: handle_or_folder}`, added to `validation` (or to the defaults)."""
    eval_every: int | None = None
    """Evaluate every this many steps (and at the end); None: only at the end."""
    eval_max_tokens: int | None = 65_536
    """Score the first this many tokens of each validation cache at each evaluation (fixed, so numbers
    compare across steps and runs; `schooner.eval.evaluate_lm` with the same `max_tokens` and `seq_len` gives
    the same numbers). None: every token."""
    weight_schedule: Sequence[tuple[int, Mapping[Any, float]]] | None = None
    """Mixture weights by step: `[(start_step, {input: weight}), ...]` (see `MixtureDataset`)."""
    block_size: int = 1024
    """Sequences per mixture sampling block."""
    tokenizer: Any = None
    """Tokenizer folder/file (or step): byte lengths for bits-per-byte and the export. None: the one the
    caches record, when it can be found."""
    seed: int = 0
    """Seed of the initialization, the data order and the per-step RNG (`fold_in(key, step)`)."""
    microbatches: int = 1
    """Gradient accumulation: split each batch into this many microbatches (same result, less memory)."""
    compute_dtype: str | None = None
    """Mixed precision: activation/matmul dtype ("bfloat16", "float32"); parameters and optimizer state stay
    float32. None keeps the model config's `compute_dtype`."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh and axis mappings."""
    fit_vocab: bool = True
    """Raise the model's `vocab_size` to the caches' tokenizer vocabulary when it is smaller (a preset's vocab
    rarely matches your tokenizer; the extra rows of a larger one are never targets). False: an error."""
    initialize_from: Any = None
    """Start from these weights (a training step's handle, a run, checkpoint or Hugging Face folder, or an
    `InitialCheckpoint` pinned when the step was built) with a fresh optimizer state and schedule; None: a
    random initialization. See `schooner.train._init`."""
    initialize_from_step: int | None = None
    """With a run in `initialize_from`: its checkpoint of this step (None: the latest)."""
    checkpoint: CheckpointConfig = runtime_field(default_factory=CheckpointConfig)
    """When checkpoints are written and which are kept (runtime-only: cannot change the trained model)."""
    trackers: TrackerConfig = runtime_field(default_factory=TrackerConfig)
    """Metric sinks and progress frequency (runtime-only; JSONL metrics are always written)."""
    name: str = runtime_field("train")
    """Run name (trackers, logs; runtime-only)."""
    output_path: str | None = runtime_field(None)
    """The run folder for `train(config)` (checkpoints `step-NNNNNN/`, `metrics.jsonl`, `run.json`); a step's
    is the one the step runner gives it (runtime-only)."""
    data_in_memory_bytes: int = runtime_field(0)
    """Hold the plain-text training caches' tokens in memory, up to this many bytes in all, and build their
    batches without reads (`schooner.tokenize.MixtureDataset(in_memory_bytes=)`): for tiny models whose steps
    the data reads dominate. The batches are the same, so it is runtime-only. 0: read each batch from disk."""

    def __post_init__(self) -> None:
        pairs = self.datasets.items() if isinstance(self.datasets, Mapping) else self.datasets
        try:
            datasets = tuple((x, w) for x, w in pairs)
        except (TypeError, ValueError):
            raise ValueError(
                f"TrainerConfig.datasets must be (input, weight) pairs or {{input: weight}}, got {self.datasets!r}"
            ) from None
        object.__setattr__(self, "datasets", datasets)
        if not datasets:
            raise ValueError(
                "TrainerConfig.datasets is empty; give at least one (tokenized step or cache, weight)"
            )
        for x, w in datasets:
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
                raise ValueError(
                    f"TrainerConfig.datasets: {x!r} weight must be a finite number >= 0, got {w!r}"
                )
        if sum(w for _, w in datasets) <= 0:
            raise ValueError(f"TrainerConfig.datasets weights sum to 0: {datasets!r}; give one a weight > 0")
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, numbers.Integral)
            or not 0 <= self.seed < 2**32
        ):
            # JAX's keys hold 32 bits of a seed: 2**32 would repeat seed 0's initialisation and rollouts
            raise ValueError(
                f"TrainerConfig.seed must be an int in [0, 2**32), got {self.seed!r}: JAX's random keys hold 32 "
                "bits, so a larger seed would repeat a smaller one's initialisation and sampling"
            )
        n = self.data_in_memory_bytes
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(
                f"TrainerConfig.data_in_memory_bytes must be an int >= 0 (bytes, e.g. 512 * 2**20; 0 reads from "
                f"disk), got {n!r}"
            )
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"TrainerConfig.seq_len must be an int >= 2, got seq_len={self.seq_len!r}")
        if not isinstance(self.fit_vocab, bool):  # the string "false" is truthy: refuse, do not coerce
            raise ValueError(
                f"TrainerConfig.fit_vocab must be True or False, got {self.fit_vocab!r} ({type(self.fit_vocab).__name__})"
            )
        if not isinstance(self.optimizer, OptimizerConfig):
            raise TypeError(
                f"TrainerConfig.optimizer must be an AdamConfig, MuonConfig or AdamHConfig, got {type(self.optimizer).__name__}"
            )
        if self.objective is not None and not callable(getattr(self.objective, "setup", None)):
            raise TypeError(
                f"TrainerConfig.objective must be None (language modeling) or an objective config with a "
                f"setup(config, output_path) method (e.g. Dpo(...)), got {self.objective!r}"
            )
        if isinstance(self.batch_size, Sequence) and not isinstance(self.batch_size, str):
            object.__setattr__(self, "batch_size", BatchSchedule(tuple(tuple(x) for x in self.batch_size)))
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int | BatchSchedule):
            raise ValueError(
                f"TrainerConfig.batch_size must be an int or a BatchSchedule, got {self.batch_size!r}"
            )
        if isinstance(self.batch_size, int) and self.batch_size < 1:
            raise ValueError(f"TrainerConfig.batch_size must be >= 1, got batch_size={self.batch_size}")
        if (self.num_train_steps is None) == (self.train_tokens is None):
            raise ValueError(
                "give exactly one of num_train_steps and train_tokens, got "
                f"num_train_steps={self.num_train_steps!r}, train_tokens={self.train_tokens!r}"
            )
        for f in ("num_train_steps", "train_tokens"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"TrainerConfig.{f} must be a positive int, got {f}={v!r}")
        if self.train_tokens is not None and isinstance(self.batch_size, BatchSchedule):
            raise ValueError(
                "TrainerConfig.train_tokens needs a constant batch_size; give num_train_steps instead"
            )
        if not (isinstance(self.z_loss_weight, int | float) and self.z_loss_weight >= 0):
            raise ValueError(
                f"TrainerConfig.z_loss_weight must be >= 0, got z_loss_weight={self.z_loss_weight!r}"
            )
        if self.compute_dtype is not None and self.compute_dtype not in _DTYPES:
            raise ValueError(
                f"TrainerConfig.compute_dtype must be one of {_DTYPES} or None, got {self.compute_dtype!r}"
            )
        if (
            isinstance(self.microbatches, bool)
            or not isinstance(self.microbatches, int)
            or self.microbatches < 1
        ):
            raise ValueError(
                f"TrainerConfig.microbatches must be a positive int, got microbatches={self.microbatches!r}"
            )
        for size in self.batch_sizes:
            if size % self.microbatches:
                raise ValueError(
                    f"batch size {size} is not divisible by microbatches={self.microbatches}; "
                    f"choose microbatches among the divisors of {size}"
                )
        if self.eval_every is not None and (
            isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 1
        ):
            raise ValueError(
                f"TrainerConfig.eval_every must be a positive int or None, got {self.eval_every!r}"
            )
        if self.eval_max_tokens is not None and (
            isinstance(self.eval_max_tokens, bool)
            or not isinstance(self.eval_max_tokens, int)
            or self.eval_max_tokens < 2
        ):
            raise ValueError(
                f"TrainerConfig.eval_max_tokens must be an int >= 2 or None (all), got {self.eval_max_tokens!r}"
            )
        max_seq = getattr(self.model, "max_seq_len", None)
        if max_seq is not None and self.seq_len > max_seq:
            raise ValueError(
                f"seq_len={self.seq_len} is beyond the model's max_seq_len={max_seq}; shorten seq_len or "
                f"use a model config with max_seq_len >= {self.seq_len}"
            )
        # Schedule phases longer than the run raise here, before anything is built.
        self.optimizer.lr_schedule(self.steps)

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
        return math.ceil(self.train_tokens / (self.batch_size * self.seq_len))

    @property
    def inputs(self) -> list[Any]:
        """The datasets' inputs, in order."""
        return [x for x, _ in self.datasets]


def check_run(config: Any, *, num_devices: int, cache_vocab_sizes: Mapping[str, int] | None = None) -> None:
    """Checks that need the devices and the caches; raises ValueError before anything compiles.

    Args:
        config: the run (a `TrainerConfig`).
        num_devices: devices the mesh spans.
        cache_vocab_sizes: vocab size of each training/validation cache's tokenizer (path -> size).
    """
    dp = config.mesh.data_parallel_size(num_devices)
    for size in config.batch_sizes:
        if size % (dp * config.microbatches):
            raise ValueError(
                f"batch size {size} is not divisible by the data-parallel size {dp} x microbatches "
                f"{config.microbatches} (mesh {config.mesh.shape(num_devices)} on {num_devices} devices); use a "
                f"batch size that is a multiple of {dp * config.microbatches}"
            )
    _check_tensor_axis(config, num_devices)
    vocab = getattr(config.model, "vocab_size", None)
    for path, v in (cache_vocab_sizes or {}).items():
        if vocab is not None and vocab < v:
            raise ValueError(
                f"the model's vocab_size={vocab} is smaller than the tokenizer of cache {path!r} ({v} ids); use "
                f"dataclasses.replace(model, vocab_size={v}) (train_lm does this when vocab_size is left to it)"
            )


def _check_tensor_axis(config: Any, num_devices: int) -> None:
    """Refuse a tensor axis that does not divide the attention heads or the MLP width: those arrays would
    stay replicated on every tensor device (`schooner.model.pspec_for_named` replicates an indivisible axis),
    so the run would pay for tensor parallelism and get it for part of the model, silently. A vocabulary it
    does not divide only replicates the embedding and head: said in the log."""
    tensor = config.mesh.shape(num_devices)["tensor"]
    if tensor == 1:
        return
    model = config.model
    for name in ("num_heads", "intermediate_dim"):
        size = getattr(model, name, None)
        if isinstance(size, int) and size % tensor:
            fits = tuple(
                t
                for t in range(1, num_devices + 1)
                if num_devices % t == 0
                and all(getattr(model, f, t) % t == 0 for f in ("num_heads", "intermediate_dim"))
            )
            raise ValueError(
                f"MeshConfig.tensor={tensor} does not divide the model's {name}={size}: every array with that "
                f"axis (attention for num_heads, the MLP for intermediate_dim) would be replicated on all "
                f"{tensor} tensor devices instead of split; use tensor in {fits} (they divide num_heads, "
                f"intermediate_dim and the {num_devices} devices), or a model whose {name} divides by {tensor}"
            )
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, int) and vocab % tensor:
        logger.warning(
            f"vocab_size={vocab} is not divisible by MeshConfig.tensor={tensor}: the embedding and output head "
            f"stay replicated on every tensor device; a vocab_size padded to a multiple of {tensor} splits them"
        )
