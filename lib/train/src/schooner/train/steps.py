"""Step builders: language-model pretraining as a cached, versioned step of an experiment.

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
`export_hf(model)` is a step of its own that writes a checkpoint in the Hugging Face layout: adding it to a
finished run exports without training again.

Identity: what can change the trained model is part of the step's key (model, optimizer, data, lengths,
seed, precision, mesh, evaluation); what cannot is runtime-only (resources, checkpoint cadence and
retention, trackers, logging and progress), so changing it reuses a finished run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, runtime_field, step

from ._checkpoint import CheckpointConfig
from ._dpo import dpo as dpo
from ._dpo import reference_logprobs as reference_logprobs
from ._export import export_hf as export_hf
from ._init import pin_initialize_from
from ._malloc import malloc_env
from ._mesh import MeshConfig
from ._optim import AdamConfig, OptimizerConfig
from ._sft import sft as sft
from ._tracking import TrackerConfig

VERSION = "train-lm-v1"
_CPU = ResourceConfig.with_cpu()


@dataclass(frozen=True)
class TrainLmConfig:
    """Config of the `train_lm` step (see `train_lm` for the fields)."""

    model: Any
    optimizer: OptimizerConfig
    datasets: list
    """`[{"input": handle_or_path, "weight": w}, ...]` (dict keys cannot hold handles)."""
    batch_size: Any
    seq_len: int
    num_train_steps: int | None = None
    train_tokens: int | None = None
    z_loss_weight: float = 0.0
    validation: dict | None = None
    evals: dict | None = None
    tokenizer: Any = None
    seed: int = 0
    eval_every: int | None = None
    eval_max_tokens: int | None = 65_536
    microbatches: int = 1
    compute_dtype: str | None = None
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = runtime_field(default_factory=CheckpointConfig)
    """When checkpoints are written and which are kept: cannot change the trained model (runtime-only)."""
    trackers: TrackerConfig = runtime_field(default_factory=TrackerConfig)
    """Where metrics go and how often progress is logged (runtime-only)."""
    name: str = "train"
    initialize_from: Any = None
    """A `train_lm` handle, or a run/checkpoint/Hugging Face folder pinned to the checkpoint it resolved to when
    the step was built (`InitialCheckpoint`), to start from (None: random)."""
    initialize_from_step: int | None = None


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
            so a run that gains a checkpoint gives a new step. The optimizer state, step and schedule start
            fresh. The architecture must equal `model`'s (a ValueError names every differing field); the
            vocabulary may grow, the new rows starting at the mean of the old ones (see
            `schooner.train._init`).
        initialize_from_step: the source run's checkpoint of this step instead of its latest.

    Returns:
        The step handle; its output folder is the run folder with the checkpoints.
    """
    if not datasets:
        raise ValueError(f"train_lm({name!r}): datasets is empty; give {{tokenized_step: weight}}")
    if model is None:
        model = initial_model_config(initialize_from, initialize_from_step, who=f"train_lm({name!r})")
    # A path is pinned to the checkpoint it names now (see `InitialCheckpoint`): that is what the key holds.
    initialize_from, initialize_from_step = pin_initialize_from(initialize_from, initialize_from_step)
    config = TrainLmConfig(
        model=model,
        optimizer=optimizer if optimizer is not None else AdamConfig(),
        datasets=[{"input": k, "weight": float(w)} for k, w in datasets.items()],
        batch_size=batch_size if isinstance(batch_size, int) else [list(x) for x in batch_size],
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
    )
    # Validate now (fail while building the experiment, not an hour later on a worker).
    _to_train_config(config, output_path="<not yet known>", paths_known=False)
    if resources is not None:
        # glibc reads its tunables when the worker process starts: they travel in the job's environment.
        resources = dataclasses.replace(resources, env={**resources.env, **malloc_env(resources.env)})
    return step(
        name,
        _run_train_lm,
        config,
        version=VERSION,
        resources=resources,
        resumable=True,  # a rerun resumes from the last checkpoint in the run folder
        description=f"train {type(model).__name__} on {len(datasets)} dataset(s) for "
        f"{num_train_steps if num_train_steps is not None else f'{train_tokens} tokens'} steps",
    )


SHARED_RUN_FIELDS = (
    "model", "num_train_steps", "optimizer", "compute_dtype", "microbatches", "seed", "mesh", "eval_every",
    "checkpoint", "trackers", "tokenizer", "name", "initialize_from_step",
)  # fmt: skip
"""Fields that `train_lm`, `sft` and `dpo` configs share with `TrainConfig` under the same names."""


def shared_run_fields(config: Any) -> dict[str, Any]:
    """The `TrainConfig` arguments a step config passes through unchanged (and `fit_vocab=True`: the caches'
    tokenizer decides the vocabulary)."""
    return {f: getattr(config, f) for f in SHARED_RUN_FIELDS} | {"fit_vocab": True}


def _to_train_config(config: TrainLmConfig, *, output_path: str, paths_known: bool = True) -> Any:
    from ._config import BatchSchedule, DataConfig, TrainConfig

    def path(x: Any, i: int) -> str:
        return x if paths_known else f"<input {i}>"

    components = {path(d["input"], i): d["weight"] for i, d in enumerate(config.datasets)}
    validation = None
    if config.validation is not None or config.evals is not None:
        validation = {k: path(v, 1000 + i) for i, (k, v) in enumerate((config.validation or {}).items())}
    bsz = (
        config.batch_size
        if isinstance(config.batch_size, int)
        else BatchSchedule(tuple(tuple(x) for x in config.batch_size))
    )
    return TrainConfig(
        data=DataConfig(
            components=components,
            seq_len=config.seq_len,
            validation=validation,
            eval_max_tokens=config.eval_max_tokens,
        ),
        output_path=output_path,
        batch_size=bsz,
        train_tokens=config.train_tokens,
        z_loss_weight=config.z_loss_weight,
        **shared_run_fields(config),
        initialize_from=(
            str(path(config.initialize_from, 2000)) if config.initialize_from is not None else None
        ),
    )


def initial_model_config(source: Any, step: int | None, *, who: str) -> Any:
    """The model config of an `initialize_from` source, known while the experiment is built: a training
    step's own config, or the config stored in an existing folder."""
    from ._export import train_lm_model_config

    if source is None:
        raise ValueError(f"{who}: give model= (a model config) or initialize_from= (weights to start from)")
    if isinstance(source, StepHandle):
        config = train_lm_model_config(source)
        if config is None:
            raise TypeError(f"{who}: initialize_from={source.name!r} is not a training step; pass a path")
        return config
    from ._init import source_config

    return source_config(str(source), step)


def _run_train_lm(config: TrainLmConfig, output_path: str) -> dict:
    from ._evaluate import default_validation
    from ._loop import train
    from ._run_info import config_to_json, package_versions

    tc = _to_train_config(config, output_path=output_path)
    if config.evals:
        # `evals` add to the validation sets (the datasets' own validation splits unless `validation` is given).
        base = (
            dict(config.validation)
            if config.validation is not None
            else default_validation(tc.data.components)
        )
        tc = dataclasses.replace(tc, data=dataclasses.replace(tc.data, validation={**base, **config.evals}))
    summary = train(tc)
    return {"summary": summary, "config": config_to_json(tc), "versions": package_versions()}
