"""The DPO steps: `reference_logprobs` (the reference's log-probs of every preference pair, cached) and
`dpo` (a `TrainerConfig` whose objective is `Dpo`; see `schooner.train._dpo_run`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from schooner.cluster import ResourceConfig, StepHandle, runtime_field, storage
from schooner.cluster import step as make_step
from schooner.train._checkpoint import CheckpointConfig
from schooner.train._config import TrainerConfig
from schooner.train._dpo import score_pairs
from schooner.train._dpo_run import Dpo, cached_reference_with_step, load_model_from, split_folder
from schooner.train._init import pin_initialize_from
from schooner.train._mesh import MeshConfig
from schooner.train._optim import AdamConfig, OptimizerConfig
from schooner.train._tracking import TrackerConfig

from ._lm import check_paths_exist, pinned_start, training_step

logger = logging.getLogger("schooner.train")

REFERENCE_VERSION = "reference-logprobs-v1"
_CPU = ResourceConfig.with_cpu()


@dataclass(frozen=True)
class ReferenceConfig:
    """Config of the `reference_logprobs` step."""

    model: Any
    """A training step handle, run/checkpoint folder or Hugging Face folder."""
    preferences: Any
    """A `tokenized_preferences` step or folder (with `train/` and maybe `validation/`)."""
    seq_len: int
    step: int | None = None
    batch_size: int = runtime_field(16)


def pin_reference(reference: Any, step: int | None) -> tuple[Any, int | None]:
    """`(reference, reference_step)` for a `dpo` config, pinned when the step is built as `initialize_from` is
    (`_init.pin_initialize_from`): a model path becomes the checkpoint it resolves to now (the step folded
    in), a `reference_logprobs` folder is keyed by the content of its files; a step handle is kept.

    Raises:
        FileNotFoundError: the path is neither a `reference_logprobs` output nor a loadable model.
        ValueError: `step` given with a `reference_logprobs` folder.
    """
    import glob

    from schooner.cluster import InputFiles
    from schooner.train._init import InitialCheckpoint

    if reference is None or isinstance(reference, StepHandle | InitialCheckpoint):
        return reference, step
    path = os.fspath(reference).rstrip("/")
    if not os.path.exists(os.path.join(path, "reference.json")):
        return pin_initialize_from(path, step)
    if step is not None:
        raise cached_reference_with_step(path, step)
    files = [f"{path}/reference.json", *sorted(glob.glob(glob.escape(path) + "/*.npz"))]
    return InitialCheckpoint(path, InputFiles(files)), None


def _run_reference(config: ReferenceConfig, output_path: str) -> dict:
    from schooner.tokenize import PreferenceDataset

    model, folder = load_model_from(str(config.model), config.step)
    summary: dict[str, Any] = {"model": folder, "seq_len": config.seq_len, "splits": {}}
    for split in ("train", "validation"):
        cache = split_folder(config.preferences, split)
        if cache is None:
            continue
        ds = PreferenceDataset(cache, config.seq_len, vocab_size=model.config.vocab_size)
        scores = score_pairs(model, ds, config.batch_size)
        np.savez(os.path.join(output_path, f"{split}.npz"), allow_pickle=False, **scores)  # float64 arrays
        summary["splits"][split] = {
            "pairs": ds.num_pairs,
            "cache": cache,
            "tokenizer_fingerprint": ds.tokenizer_fingerprint,
            "mean_chosen_logps": float(scores["chosen_logps"].mean()),
            "mean_rejected_logps": float(scores["rejected_logps"].mean()),
        }
        logger.info(f"reference log-probs of {ds.num_pairs} {split} pairs from {folder}")
    if "train" not in summary["splits"]:
        raise FileNotFoundError(f"{config.preferences!r} has no train/ preference cache")
    storage.write_json(storage.join(output_path, "reference.json"), summary, sort_keys=False)
    return summary


def reference_logprobs(
    name: str,
    model: Any,
    preferences: Any,
    *,
    seq_len: int,
    step: int | None = None,
    batch_size: int = 16,
    resources: ResourceConfig | None = _CPU,
) -> StepHandle:
    """A step storing the reference model's summed answer log-probs of every preference pair.

    Args:
        name: step name.
        model: the reference (usually the SFT model DPO starts from): a training step, a run or checkpoint
            folder, or a Hugging Face folder (a path is pinned to the checkpoint it resolves to when the step
            is built: a run that gains a checkpoint gives a new step).
        preferences: a `tokenized_preferences` step (or its folder).
        seq_len: tokens per sequence, as in the `dpo` step that reads it (it checks).
        step: the reference run's checkpoint of this step (None: its latest).
        batch_size: pairs per device call (runtime-only).
        resources: where it runs (runtime-only).

    Returns:
        The handle; its folder holds `train.npz` and `validation.npz` (`chosen_logps`, `rejected_logps`,
        `chosen_count`, `rejected_count`, float64 per pair in cache order) and `reference.json`.
    """
    check_paths_exist(f"reference_logprobs({name!r})", [("preferences", preferences)])
    model, step = pin_initialize_from(model, step)
    return make_step(
        name,
        _run_reference,
        ReferenceConfig(
            model=model, preferences=preferences, seq_len=seq_len, step=step, batch_size=batch_size
        ),
        version=REFERENCE_VERSION,
        resources=resources,
        description="reference log-probs of preference pairs",
    )


def dpo(
    name: str,
    *,
    initialize_from: Any,
    reference: Any,
    preferences: Any,
    batch_size: int,
    seq_len: int,
    num_train_steps: int,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    optimizer: OptimizerConfig | None = None,
    model: Any = None,
    initialize_from_step: int | None = None,
    reference_step: int | None = None,
    seed: int = 0,
    eval_every: int | None = None,
    microbatches: int = 1,
    compute_dtype: str | None = None,
    tokenizer: Any = None,
    checkpoint_every: int | None = 1000,
    keep_checkpoints: int = 2,
    mesh: MeshConfig | None = None,
    trackers: TrackerConfig | None = None,
    resources: ResourceConfig | None = _CPU,
    **options: Any,
) -> StepHandle:
    """A step that tunes a model on preference pairs with DPO (or IPO / hinge), from an SFT model.

    Args:
        name: step name (output folder: checkpoints, `metrics.jsonl`, `run.json`, like `train_lm`).
        initialize_from: the policy's starting weights (a training step, a run, checkpoint or HF folder).
        reference: a `reference_logprobs` step (of the same preferences and `seq_len`): the reference's
            log-probs computed once, no second model in memory. Or the reference model itself (a training
            step, a run, checkpoint or HF folder): a frozen copy scored inside the train step (a second
            model in memory, one more forward pass per step; the same losses to float rounding). A path is
            pinned when the step is built, as `initialize_from` is (`pin_reference`).
        preferences: a `tokenized_preferences` step (its `validation/` pairs are the held-out evaluation).
        batch_size: pairs per optimizer step.
        seq_len: tokens per sequence (prompt + answer, cut to it).
        num_train_steps: optimizer steps.
        beta: the KL strength (TRL's default 0.1).
        loss_type: "sigmoid" (DPO), "hinge" (SLiC) or "ipo".
        label_smoothing: conservative DPO's eps (sigmoid only changes with it).
        optimizer: default `AdamConfig(learning_rate=5e-6, weight_decay=0.0, warmup=0.1, schedule="linear",
            min_lr_ratio=0.0)`; small models need more.
        model: the model config; None: the source's.
        reference_step: with a live reference run, its checkpoint of this step (None: the latest).
        initialize_from_step, seed, eval_every, microbatches, compute_dtype, tokenizer, checkpoint_every,
            keep_checkpoints, mesh, trackers, resources: as in `train_lm`.
        **options: any other `TrainerConfig` field.

    Logs `train/loss`, `train/rewards/{chosen,rejected,accuracies,margins}`, `train/logps/{chosen,rejected}`
    and the same under `eval/` on the validation pairs.
    """
    check_paths_exist(f"dpo({name!r})", [("preferences", preferences)])
    model, initialize_from, initialize_from_step = pinned_start(
        model, initialize_from, initialize_from_step, who=f"dpo({name!r})"
    )
    reference, reference_step = pin_reference(reference, reference_step)
    objective = Dpo(
        reference=reference,
        beta=float(beta),
        loss_type=loss_type,
        label_smoothing=float(label_smoothing),
        reference_step=reference_step,
    )
    config = TrainerConfig(  # validated now
        model=model,
        datasets=((preferences, 1.0),),
        seq_len=seq_len,
        objective=objective,
        optimizer=optimizer
        if optimizer is not None
        else AdamConfig(
            learning_rate=5e-6, weight_decay=0.0, warmup=0.1, schedule="linear", min_lr_ratio=0.0
        ),
        batch_size=batch_size,
        num_train_steps=num_train_steps,
        validation={},  # the preferences' own validation/ pairs are the held-out set
        seed=seed,
        eval_every=eval_every,
        microbatches=microbatches,
        compute_dtype=compute_dtype,
        tokenizer=tokenizer,
        initialize_from=initialize_from,
        initialize_from_step=initialize_from_step,
        mesh=mesh or MeshConfig(),
        checkpoint=CheckpointConfig(every=checkpoint_every, keep_last=keep_checkpoints),
        trackers=trackers or TrackerConfig(),
        name=name,
        **options,
    )
    return training_step(
        name, config, resources, f"DPO ({loss_type}, beta={beta}) for {num_train_steps} steps"
    )
