"""schooner.train: optimizers and schedules, one trainer configured by its objective, data, evaluators and
hooks (pretraining, SFT, DPO and GRPO-family RL are configurations of it), exact-resume checkpoints, tracking, and the step
builders (in `schooner.train.steps`).

`import schooner.train` is light: jax, optax and the model load when a config is built or a run starts;
wandb, tensorboardX, matplotlib and rich only when a run asks for them.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._adamh import AdamHConfig as AdamHConfig
from ._adamh import AdamHState as AdamHState
from ._adamh import Sphere as Sphere
from ._adamh import adamh as adamh
from ._adamh import model_labels as model_labels
from ._checkpoint import CheckpointConfig as CheckpointConfig
from ._checkpoint import CheckpointManager as CheckpointManager
from ._checkpoint import complete_checkpoints as complete_checkpoints
from ._checkpoint import latest_checkpoint as latest_checkpoint
from ._config import BatchSchedule as BatchSchedule
from ._config import TrainerConfig as TrainerConfig
from ._config import check_run as check_run
from ._dpo import dpo_loss as dpo_loss
from ._dpo import score_pairs as score_pairs
from ._dpo_run import Dpo as Dpo
from ._estimate import estimate_step_memory as estimate_step_memory
from ._evaluate import ChatEvaluator as ChatEvaluator
from ._lm import LanguageModeling as LanguageModeling
from ._malloc import malloc_env as malloc_env
from ._malloc import malloc_tuned as malloc_tuned
from ._memory import CompiledStep as CompiledStep
from ._memory import StepMemoryError as StepMemoryError
from ._memory import device_memory_limit as device_memory_limit
from ._mesh import MeshConfig as MeshConfig
from ._mesh import make_mesh as make_mesh
from ._mfu import datasheet_peak as datasheet_peak
from ._mfu import matmul_ceiling as matmul_ceiling
from ._mfu import peak_flops as peak_flops
from ._objective import Batches as Batches
from ._objective import Hook as Hook
from ._objective import Objective as Objective
from ._objective import PolicyBatches as PolicyBatches
from ._objective import Setup as Setup
from ._objective import StepInfo as StepInfo
from ._optim import AdamConfig as AdamConfig
from ._optim import MuonConfig as MuonConfig
from ._optim import OptimizerConfig as OptimizerConfig
from ._optim import decay_mask as decay_mask
from ._optim import describe_param_groups as describe_param_groups
from ._optim import muon_dimension_numbers as muon_dimension_numbers
from ._progress import Progress as Progress
from ._rl import Grpo as Grpo
from ._rl import RewardFunction as RewardFunction
from ._rl_eval import HeldoutPassAtK as HeldoutPassAtK
from ._rl_eval import PassAtK as PassAtK
from ._rl_eval import PassAtKEvalConfig as PassAtKEvalConfig
from ._rl_eval import evaluate_pass_at_k as evaluate_pass_at_k
from ._rl_objective import PolicyLossConfig as PolicyLossConfig
from ._rl_workers import RolloutPool as RolloutPool
from ._rl_workers import StaleWeightsError as StaleWeightsError
from ._schedule import build_schedule as build_schedule
from ._step import TrainState as TrainState
from ._step import build_optimizer as build_optimizer
from ._step import init_state as init_state
from ._step import make_train_step as make_train_step
from ._tracking import TrackerConfig as TrackerConfig
from ._tracking import plot_losses as plot_losses
from ._tracking import read_metrics as read_metrics
from ._train import train as train
from ._trainer import NonFiniteLossError as NonFiniteLossError
from ._trainer import Trainer as Trainer

_DEPRECATED = {
    "TrainConfig": "TrainerConfig(model, datasets=[(cache, weight)], seq_len, ...) and train(config, output_path)",
    "DataConfig": "TrainerConfig's datasets, seq_len, validation, weight_schedule, block_size, eval_max_tokens",
}


def __getattr__(name: str) -> Any:
    """`TrainConfig` and `DataConfig` (schooner-train 0.x) still import for one release, with a warning."""
    if name in _DEPRECATED:
        from . import _legacy

        warnings.warn(
            f"schooner.train.{name} is deprecated: use {_DEPRECATED[name]}; {name} goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_legacy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
