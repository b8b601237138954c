"""What the trainer is configured with: an objective (the loss and the frozen arrays it reads), a batch
source, evaluators and hooks, and the `Setup` an objective's config builds of them for one run.

The trainer (`schooner.train.Trainer`) knows nothing of caches, chats or preferences: pretraining and SFT
(`LanguageModeling`, `_lm.py`) and DPO (`Dpo`, `_dpo_run.py`) are objective configs whose `setup` hands it
these parts. A new post-training method is one such file plus its loss:

    @dataclass(frozen=True)
    class MyMethod:                        # the `objective` field of `TrainerConfig`: part of the step key
        beta: float = 0.1
        def setup(self, config: TrainerConfig, output_path: str) -> Setup:
            return Setup(model_config=..., objective=Objective(loss=my_loss), data=MyBatches(...),
                         evaluators=[...], hooks=[...])

A batch source whose batches depend on the policy (RL rollouts) sets `on_policy = True`: the trainer then
asks it for each batch in the loop, after the previous step, with the current model (`PolicyBatches`);
it may return the same rollouts for several consecutive steps (several policy updates per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

Loss = Callable[[Any, dict[str, Any], Any], tuple[Any, tuple[dict[str, Any], Any]]]
"""`loss(model, batch, key) -> (loss, (metrics, balance))`, traced inside the jitted step. `metrics` hold
`"loss"` and `"token_count"` (the microbatch's weight when accumulating gradients); `balance` is the MoE
balancing statistics of `schooner.model.loss_and_balance`, or None."""


@dataclass(frozen=True)
class Objective:
    """The function the trainer minimises, and what it reads besides the policy and the batch.

    Example:
        >>> from schooner.model import loss_and_balance
        >>> lm = Objective(loss=lambda m, b, k: loss_and_balance(m, b["tokens"], key=k))
        >>> lm.sequences_per_row
        1
    """

    loss: Loss
    """`loss(model, batch, key) -> (loss, (metrics, balance))`; None-free, traced in the train step."""
    frozen: Any = None
    """A pytree that does not train (a reference model): placed on the mesh like the policy's weights, passed
    to `prepare` in the step, never donated or checkpointed. None: nothing."""
    prepare: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """`prepare(frozen, batch) -> batch` inside the jitted step, before the loss, on the whole batch (no
    gradient flows into it): e.g. the live reference's log-probs. Needs `frozen`."""
    sequences_per_row: int = 1
    """Sequences of `seq_len` tokens in one batch row (a preference pair: 2); for the token counts."""
    constrain_batch: bool = True
    """Constrain every batch array to the `[batch, ...]` sharding inside the step (arrays `[B, T]`); False for
    batches that also hold `[B]` arrays (the data loader places those itself)."""

    def __post_init__(self) -> None:
        if self.prepare is not None and self.frozen is None:
            raise ValueError("Objective.prepare reads `frozen`; give frozen= (e.g. the reference model)")
        if isinstance(self.sequences_per_row, bool) or self.sequences_per_row < 1:
            raise ValueError(
                f"Objective.sequences_per_row must be an int >= 1, got {self.sequences_per_row!r}"
            )


@runtime_checkable
class Batches(Protocol):
    """A batch source pure in `step` (prefetched on threads): `schooner.tokenize.MixtureDataset`, the DPO
    preference pairs. `rows`: this host's rows of the global batch (None: all)."""

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]: ...


class PolicyBatches(Protocol):
    """A batch source that reads the policy (rollouts): called in the loop, synchronously, with the model
    after steps `[0, step)`, and placed by the trainer. Checkpoint resume replays it from `step`."""

    on_policy: bool
    """True (the trainer checks this attribute)."""

    def batch_for(self, step: int, batch_size: int, model: Any) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class StepInfo:
    """What a hook sees after a step: its number (1-based: steps done), the host metrics of that step
    (`train/...`) and the trainer (its `state`, `mesh`, `config`)."""

    step: int
    metrics: Mapping[str, float]
    trainer: Any


class Hook(Protocol):
    """Called on the host after each step whose number divides by `every`, once that step's metrics are
    read back; returns extra metrics to log at that step (or None)."""

    every: int

    def __call__(self, info: StepInfo) -> Mapping[str, float] | None: ...


Evaluator = Callable[[Any], Mapping[str, float]]
"""`evaluator(model) -> {"eval/...": value}`: run every `eval_every` steps and at the end."""


@dataclass
class Setup:
    """What an objective config builds for one run: the trainer's arguments besides its config."""

    model_config: Any
    """The architecture trained (vocabulary fitted to the data, compute dtype applied)."""
    objective: Objective
    data: Batches | PolicyBatches
    evaluators: Sequence[Evaluator] = ()
    hooks: Sequence[Hook] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Recorded in `run.json` and in every checkpoint's metadata (e.g. the tokenizer's fingerprint and
    special ids, which `schooner.eval` checks)."""


class ObjectiveConfig(Protocol):
    """The `objective` field of a `TrainerConfig`: a frozen dataclass (part of the step's key) that builds
    the run's `Setup`."""

    def setup(self, config: Any, output_path: str) -> Setup: ...
