"""Step builders: training runs (pretraining, SFT, DPO, RL with `rl_train`), reference log-probs and the Hugging Face export
as cached, versioned steps of an experiment.

Example:
    >>> from schooner.cluster import ResourceConfig, StepRunner, lower
    >>> from schooner.model import presets
    >>> from schooner.tokenize.steps import tokenized
    >>> from schooner.train import AdamConfig
    >>> from schooner.train.steps import train_lm
    >>> docs = tokenized(name="tokenized/python-docs", source="python-docs", tokenizer=tok)   # doctest: +SKIP
    >>> model = train_lm(name="checkpoints/nano", model=presets.llama_nano,
    ...                  optimizer=AdamConfig(learning_rate=6e-4, weight_decay=0.1), datasets={docs: 1.0},
    ...                  batch_size=8, seq_len=256, num_train_steps=200)                     # doctest: +SKIP
    >>> StepRunner().run([lower(model)])                                                       # doctest: +SKIP

The step's output folder holds `step-000200/` checkpoints (each loadable with
`schooner.model.load_model(folder)`), `metrics.jsonl`, `loss.png`, `run.json` and `train.log`.
`hf_export(model)` is a step of its own that writes a checkpoint in the Hugging Face layout: adding it to a
finished run exports without training again.

Identity: a training step's config is its `schooner.train.TrainerConfig`. What can change the trained model
is part of the step's key (model, optimizer, data, lengths, seed, precision, mesh, objective, evaluation);
what cannot is runtime-only (resources, checkpoint cadence and retention, trackers, the run name), so
changing it reuses a finished run.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._dpo import dpo as dpo
from ._dpo import reference_logprobs as reference_logprobs
from ._export import hf_export as hf_export
from ._lm import VERSION as VERSION
from ._lm import initial_model_config as initial_model_config
from ._lm import train_lm as train_lm
from ._lm import trained_model_config as trained_model_config
from ._lm import trains_model as trains_model
from ._rl import rl_train as rl_train
from ._rl_eval import pass_at_k_eval as pass_at_k_eval
from ._sft import sft as sft

_SHARED_RUN_FIELDS = (
    "model", "num_train_steps", "optimizer", "compute_dtype", "microbatches", "seed", "mesh", "eval_every",
    "checkpoint", "trackers", "tokenizer", "name", "initialize_from_step",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """Names that went (schooner-train 0.x): each still imports for one release, with a DeprecationWarning."""
    if name == "export_hf":
        warnings.warn(
            "schooner.train.steps.export_hf is now hf_export (schooner.model.export_hf is the function that "
            "writes a folder); export_hf goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return hf_export
    if name == "TrainLmConfig":
        from schooner.train._config import TrainerConfig

        warnings.warn(
            "schooner.train.steps.TrainLmConfig is replaced by schooner.train.TrainerConfig (the one run "
            "config: datasets are (input, weight) pairs); TrainLmConfig goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return TrainerConfig
    if name == "SHARED_RUN_FIELDS":
        warnings.warn(
            "schooner.train.steps.SHARED_RUN_FIELDS is gone: every step's config is a TrainerConfig, so no "
            "field is bridged; it goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _SHARED_RUN_FIELDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
