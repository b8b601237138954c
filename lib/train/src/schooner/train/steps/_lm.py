"""The `train_lm` step: language-model pretraining (and, through `sft`, fine-tuning) as a cached step.

Every training step (`train_lm`, `sft`, `dpo`) has a `TrainerConfig` as its config and `run_training` as
its function: a handle trains a model exactly when its config is a `TrainerConfig` (`trains_model`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, step, storage
from schooner.train._checkpoint import CheckpointConfig
from schooner.train._config import TrainerConfig
from schooner.train._init import pin_initialize_from
from schooner.train._malloc import malloc_env
from schooner.train._mesh import MeshConfig
from schooner.train._optim import AdamConfig, OptimizerConfig
from schooner.train._tracking import TrackerConfig

VERSION = "train-v2"
_CPU = ResourceConfig.with_cpu()


def trains_model(handle: Any) -> bool:
    """Whether a step handle trains a model (`train_lm`, `sft`, `dpo`): its config is a `TrainerConfig`."""
    return isinstance(handle, StepHandle) and isinstance(handle.config, TrainerConfig)


def trained_model_config(handle: StepHandle) -> Any:
    """The model config a training step's handle trains (None for other handles)."""
    return handle.config.model if trains_model(handle) else None


def with_malloc_env(resources: ResourceConfig | None) -> ResourceConfig | None:
    """`resources` whose job environment carries glibc's huge-page malloc tunable (`schooner.train._malloc`):
    glibc reads its tunables when the worker process starts, so they travel in the job's environment."""
    if resources is None:
        return None
    return dataclasses.replace(resources, env={**resources.env, **malloc_env(resources.env)})


def check_paths_exist(who: str, named: Iterable[tuple[str, Any]]) -> None:
    """Refuse, while the experiment is built, an input given as a path (not a step) that does not exist:
    at run time it would surface as "no manifest.json" from a worker, naming no field."""
    for field, value in named:
        if isinstance(value, StepHandle) or not isinstance(value, str | os.PathLike):
            continue
        path = os.fspath(value)
        if not storage.exists(path):
            raise FileNotFoundError(
                f"{who}: {field} = {path!r} does not exist; give a step (e.g. tokenized(...)) or the folder "
                "of a finished token cache"
            )


def config_inputs(config: TrainerConfig) -> list[tuple[str, Any]]:
    """`(field, input)` of every data input of a run: its datasets, validation and evals."""
    named = [(f"datasets[{i}]", x) for i, (x, _) in enumerate(config.datasets)]
    named += [(f"validation[{k!r}]", v) for k, v in (config.validation or {}).items()]
    return named + [(f"evals[{k!r}]", v) for k, v in (config.evals or {}).items()]


def training_step(
    name: str, config: TrainerConfig, resources: ResourceConfig | None, description: str
) -> StepHandle:
    """The step handle of a training run (resumable: a rerun resumes from the run folder's last checkpoint)."""
    return step(
        name,
        run_training,
        config,
        version=VERSION,
        resources=with_malloc_env(resources),
        resumable=True,
        description=description,
    )


def run_training(config: TrainerConfig, output_path: str) -> dict:
    """The function of every training step: `train(config, output_path)` and what the step records."""
    from schooner.train._run_info import config_to_json, package_versions
    from schooner.train._train import train

    summary = train(config, output_path)
    return {"summary": summary, "config": config_to_json(config), "versions": package_versions()}


def initial_model_config(source: Any, step: int | None, *, who: str) -> Any:
    """The model config of an `initialize_from` source, known while the experiment is built: a training
    step's own config, or the config stored in an existing folder."""
    if source is None:
        raise ValueError(f"{who}: give model= (a model config) or initialize_from= (weights to start from)")
    if isinstance(source, StepHandle):
        config = trained_model_config(source)
        if config is None:
            raise TypeError(f"{who}: initialize_from={source.name!r} is not a training step; pass a path")
        return config
    from schooner.train._init import source_config

    return source_config(str(source), step)


def pinned_start(model: Any, source: Any, step: int | None, *, who: str) -> tuple[Any, Any, int | None]:
    """`(model, initialize_from, initialize_from_step)` of a training step: `source` pinned once
    (`_init.pin_initialize_from`: a path becomes the checkpoint it resolves to now, the step folded into it)
    and, with `model` None, the model config of that pinned checkpoint (`initial_model_config`).

    Reading the config from the path and pinning the path apart resolved a run folder twice: a run that wrote
    a checkpoint in between gave the step the config of one checkpoint and the weights of the next.
    """
    source, step = pin_initialize_from(source, step)
    if model is None:
        model = initial_model_config(source, step, who=who)
    return model, source, step


def train_lm(
    name: str,
    *,
    model: Any = None,
    optimizer: OptimizerConfig | None = None,
    datasets: Mapping[Any, float],
    batch_size: int | list[tuple[int, int]],
    seq_len: int,
    num_train_steps: int | None = None,
    train_tokens: int | None = None,
    z_loss_weight: float | None = None,
    evals: Mapping[str, Any] | None = None,
    validation: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    seed: int = 0,
    eval_every: int | None = None,
    eval_max_tokens: int | None = 65_536,
    checkpoint_every: int | None = 1000,
    keep_checkpoints: int = 2,
    keep_every: int | None = None,
    microbatches: int = 1,
    compute_dtype: str | None = None,
    mesh: MeshConfig | None = None,
    trackers: TrackerConfig | None = None,
    resources: ResourceConfig | None = _CPU,
    initialize_from: Any = None,
    initialize_from_step: int | None = None,
    **options: Any,
) -> StepHandle:
    """A lazy step that trains a language model on a mixture of token caches.

    Args:
        name: step name (output folder `{prefix}/{name}-{hash}`).
        model: a model config (e.g. `schooner.model.presets.llama_nano`). Its `vocab_size` is raised to the
            caches' tokenizer vocabulary when smaller (presets rarely match your tokenizer); a larger vocab
            is kept (the extra rows are never targets). None with `initialize_from`: the source's config.
        optimizer: `AdamConfig` (default) or `MuonConfig`, with the learning-rate schedule.
        datasets: `{tokenized_step_handle_or_cache_path: weight}`.
        batch_size: sequences per step, or `[(start_step, batch_size), ...]`.
        seq_len: tokens per sequence.
        num_train_steps: optimizer steps (or give `train_tokens`).
        train_tokens: token budget instead of `num_train_steps`.
        z_loss_weight: output z-loss weight (None = 0).
        evals: extra validation caches `{name: handle_or_path}` for loss/bits-per-byte during training.
        validation: the validation caches `{name: handle_or_path}`; None = each dataset's `validation/`.
        tokenizer: tokenizer folder/handle for bits-per-byte and HF export; None = the datasets' own.
        seed: initialization, data order and per-step RNG seed.
        eval_every: evaluate every N steps (and at the end).
        eval_max_tokens: score the first N tokens of each validation cache (None: all), with the scorer of
            `schooner.eval.steps.evaluate`: the same `max_tokens` and `seq_len` there give the same numbers.
        checkpoint_every: checkpoint every N steps (and at the end). Runtime-only, like `keep_checkpoints`,
            `keep_every` and `trackers`: changing them does not retrain a finished run.
        keep_checkpoints: how many recent checkpoints to keep.
        keep_every: also write and keep, for good, a checkpoint at every multiple of this step.
        microbatches: gradient accumulation factor.
        compute_dtype: "bfloat16" for mixed precision (params stay float32); None = the model's setting.
        mesh: device mesh (default: pure data parallel over all devices).
        trackers: W&B / TensorBoard / progress settings (JSONL metrics are always written).
        resources: where it runs (runtime-only, not part of the identity); None runs it in the runner's
            own process. On Linux the job's environment gets glibc's huge-page malloc tunable (see
            `schooner.train._malloc`; `SCHOONER_MALLOC_TUNING=0` or an explicit `glibc.malloc.*` setting in
            `GLIBC_TUNABLES` opts out).
        initialize_from: start from trained weights instead of a random initialization: a `train_lm`
            (or `sft`/`dpo`) handle (its latest checkpoint), a run or checkpoint folder, or a Hugging Face
            folder. A path is resolved when the step is built (a run folder: its latest complete checkpoint
            now) and the step key holds that checkpoint's folder and metadata (`_init.InitialCheckpoint`),
            so a run that gains a checkpoint gives a new step; `model=None` takes that checkpoint's config
            (the path is resolved once: `pinned_start`). The optimizer state, step and schedule start
            fresh. The architecture must equal `model`'s (a ValueError names every differing field); the
            vocabulary may grow, the new rows starting at the mean of the old ones (see
            `schooner.train._init`).
        initialize_from_step: the source run's checkpoint of this step instead of its latest.
        **options: any other `TrainerConfig` field (`weight_schedule`, `block_size`, `objective`,
            `data_in_memory_bytes`: the training tokens held in memory for tiny models, runtime-only, ...).

    Returns:
        The step handle; its output folder is the run folder with the checkpoints. Its config is the
        run's `TrainerConfig`: what can change the trained model is part of the step's key, what cannot
        (resources, checkpoint cadence and retention, trackers, the run name) is runtime-only.
    """
    if not datasets:
        raise ValueError(f"train_lm({name!r}): datasets is empty; give {{tokenized_step: weight}}")
    # A path is pinned to the checkpoint it names now (see `InitialCheckpoint`): that is what the key holds.
    model, initialize_from, initialize_from_step = pinned_start(
        model, initialize_from, initialize_from_step, who=f"train_lm({name!r})"
    )
    config = (
        TrainerConfig(  # validated now: an error names the experiment's line, not a worker's an hour later
            model=model,
            optimizer=optimizer if optimizer is not None else AdamConfig(),
            datasets=tuple((k, float(w)) for k, w in datasets.items()),
            batch_size=batch_size,
            seq_len=seq_len,
            num_train_steps=num_train_steps,
            train_tokens=train_tokens,
            z_loss_weight=float(z_loss_weight or 0.0),
            validation=dict(validation) if validation is not None else None,
            evals=dict(evals) if evals is not None else None,
            tokenizer=tokenizer,
            seed=seed,
            eval_every=eval_every,
            eval_max_tokens=eval_max_tokens,
            microbatches=microbatches,
            compute_dtype=compute_dtype,
            mesh=mesh or MeshConfig(),
            checkpoint=CheckpointConfig(
                every=checkpoint_every, keep_last=keep_checkpoints, keep_every=keep_every
            ),
            trackers=trackers or TrackerConfig(),
            name=name,
            initialize_from=initialize_from,
            initialize_from_step=initialize_from_step,
            **options,
        )
    )
    check_paths_exist(f"train_lm({name!r})", config_inputs(config))
    length = f"{num_train_steps} steps" if num_train_steps is not None else f"{train_tokens} tokens"
    return training_step(
        name, config, resources, f"train {type(model).__name__} on {len(datasets)} dataset(s) for {length}"
    )
