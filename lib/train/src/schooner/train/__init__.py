"""schooner.train: optimizers and schedules, the sharded train step and loop, exact-resume checkpoints,
tracking, and the `train_lm` step builder (in `schooner.train.steps`).

`import schooner.train` is light: jax, optax and the model load when a config is built or a run starts;
wandb, tensorboardX, matplotlib and rich only when a run asks for them.
"""

from ._checkpoint import CheckpointConfig as CheckpointConfig
from ._checkpoint import CheckpointManager as CheckpointManager
from ._checkpoint import complete_checkpoints as complete_checkpoints
from ._checkpoint import latest_checkpoint as latest_checkpoint
from ._config import BatchSchedule as BatchSchedule
from ._config import DataConfig as DataConfig
from ._config import TrainConfig as TrainConfig
from ._config import check_run as check_run
from ._dpo import dpo_loss as dpo_loss
from ._dpo import score_pairs as score_pairs
from ._loop import NonFiniteLossError as NonFiniteLossError
from ._loop import train as train
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
from ._optim import AdamConfig as AdamConfig
from ._optim import MuonConfig as MuonConfig
from ._optim import OptimizerConfig as OptimizerConfig
from ._optim import decay_mask as decay_mask
from ._optim import describe_param_groups as describe_param_groups
from ._optim import muon_dimension_numbers as muon_dimension_numbers
from ._progress import Progress as Progress
from ._schedule import build_schedule as build_schedule
from ._sft import ChatEvaluator as ChatEvaluator
from ._step import TrainState as TrainState
from ._step import build_optimizer as build_optimizer
from ._step import init_state as init_state
from ._step import make_train_step as make_train_step
from ._tracking import TrackerConfig as TrackerConfig
from ._tracking import plot_losses as plot_losses
from ._tracking import read_metrics as read_metrics
