"""Direct preference optimisation: the reference log-probs as a cached step, the losses, and the `dpo` step.

A preference cache (`schooner.tokenize.steps.tokenized_preferences`) holds, for pair `i`, the prompt +
chosen answer and the prompt + rejected answer, each with a loss mask over the answer. A sequence's
log-prob is the sum of the log-probs of its answer tokens. `reference_logprobs` scores every pair of the
train and validation caches with the reference model once and stores the sums (`train.npz`,
`validation.npz`): the trainer reads them by pair index and never holds a second model. Or `dpo` takes the
reference model itself and scores it inside the train step (`_dpo_run.LiveReference`).

With `pc, pr` the policy's and `rc, rr` the reference's log-probs of chosen and rejected answers and
`z = (pc - rc) - (pr - rr)`, the per-pair losses are TRL's:

    sigmoid (default)  -(1 - eps) * log sigmoid(beta * z) - eps * log sigmoid(-beta * z)
    hinge              relu(1 - beta * z)
    ipo                (z - 1 / (2 * beta))^2   with per-token mean log-probs (as in the IPO paper and TRL)

and the metrics have TRL's names: `rewards/chosen` = mean of `beta * (pc - rc)`, `rewards/rejected` = mean
of `beta * (pr - rr)`, `rewards/accuracies` = the share of pairs whose chosen reward is the larger,
`rewards/margins` = mean reward difference, `logps/chosen`, `logps/rejected` = the policy's mean summed
log-probs. With the policy equal to the reference, `z = 0` and the sigmoid loss is log 2.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schooner.cluster import ResourceConfig, StepHandle, runtime_field
from schooner.cluster import step as make_step

from ._checkpoint import CheckpointConfig
from ._mesh import MeshConfig
from ._optim import AdamConfig, OptimizerConfig
from ._tracking import TrackerConfig

logger = logging.getLogger("schooner.train")

LOSS_TYPES = ("sigmoid", "hinge", "ipo")
REFERENCE_VERSION = "reference-logprobs-v1"
DPO_VERSION = "dpo-v1"
_CPU = ResourceConfig.with_cpu()
_ROLES = ("chosen", "rejected")


# -- the losses ----------------------------------------------------------------------------------------
def dpo_loss(
    policy_chosen: Any,
    policy_rejected: Any,
    reference_chosen: Any,
    reference_rejected: Any,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[Any, Any, Any]:
    """Per-pair losses and the implicit rewards `(losses, chosen_rewards, rejected_rewards)`, all [B].

    Inputs are the sequences' log-probs (per-token means for `"ipo"`); see the module docstring.
    """
    import jax
    import jax.numpy as jnp

    z = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * jax.nn.log_sigmoid(beta * z) - label_smoothing * jax.nn.log_sigmoid(
            -beta * z
        )
    elif loss_type == "hinge":
        losses = jax.nn.relu(1 - beta * z)
    elif loss_type == "ipo":
        losses = (z - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"dpo loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    chosen = beta * jax.lax.stop_gradient(policy_chosen - reference_chosen)
    rejected = beta * jax.lax.stop_gradient(policy_rejected - reference_rejected)
    return losses, jnp.asarray(chosen), jnp.asarray(rejected)


def sequence_logps(model: Any, tokens: Any, segment_ids: Any, loss_mask: Any) -> tuple[Any, Any]:
    """`(sum, count)` [B]: the summed log-probs of each row's target tokens (`loss_mask` = 1 where a token
    is a target, as the data loader gives it) and how many there are. Differentiable in `model`."""
    import jax.numpy as jnp

    from schooner.model import target_mask_to_loss_mask, target_weights, token_losses

    w = target_weights(tokens, segment_ids, target_mask_to_loss_mask(loss_mask))
    nll = token_losses(model, tokens, segment_ids)
    return -jnp.sum(w * nll, axis=1), jnp.sum(w, axis=1)


def make_dpo_loss(*, beta: float, loss_type: str, label_smoothing: float) -> Any:
    """`loss(model, batch, key) -> (loss, (metrics, None))` for `make_train_step`: the batch holds a
    `PreferenceDataset` batch and the reference's `ref_{chosen,rejected}_logps` (and `_count`s).

    A batch may also hold `ref_is_policy` (bool [B]): True where the policy being trained is the reference
    itself (the first step of a run that starts from the reference). There the reference's log-probs are
    the policy's own, the same numbers, not a second computation of them (in another program, or a forward
    pass outside the gradient's) that differs in the last bits: the rewards are exactly 0, the strict
    accuracy `chosen > rejected` exactly 0.0 as in TRL (float noise gave values like 0.375), the loss
    exactly log 2, and the gradient is unchanged (the reference's terms carry none)."""
    import jax
    import jax.numpy as jnp

    def loss(model: Any, b: dict, key: Any) -> tuple[Any, tuple]:
        del key
        both = {
            k: jnp.concatenate([b[f"chosen_{k}"], b[f"rejected_{k}"]])
            for k in ("tokens", "segment_ids", "loss_mask")
        }
        logps, counts = sequence_logps(model, both["tokens"], both["segment_ids"], both["loss_mask"])
        n = b["chosen_tokens"].shape[0]
        pc, pr = logps[:n], logps[n:]
        rc, rr = b["ref_chosen_logps"], b["ref_rejected_logps"]
        if "ref_is_policy" in b:
            same = b["ref_is_policy"]
            rc = jnp.where(same, jax.lax.stop_gradient(pc), rc)
            rr = jnp.where(same, jax.lax.stop_gradient(pr), rr)
        if loss_type == "ipo":  # per-token means, for the policy and the reference alike
            cc, cr = jnp.maximum(counts[:n], 1), jnp.maximum(counts[n:], 1)
            pc, pr, rc, rr = pc / cc, pr / cr, rc / cc, rr / cr
        losses, chosen, rejected = dpo_loss(
            pc, pr, rc, rr, beta=beta, loss_type=loss_type, label_smoothing=label_smoothing
        )
        total = jnp.mean(losses)
        metrics = {
            "loss": total,
            "token_count": jnp.asarray(n, jnp.float32),  # the microbatch weight: pairs
            "rewards/chosen": jnp.mean(chosen),
            "rewards/rejected": jnp.mean(rejected),
            "rewards/accuracies": jnp.mean((chosen > rejected).astype(jnp.float32)),
            "rewards/margins": jnp.mean(chosen - rejected),
            "logps/chosen": jnp.mean(logps[:n]),
            "logps/rejected": jnp.mean(logps[n:]),
        }
        return total, (metrics, None)

    return loss


# -- reference log-probs ---------------------------------------------------------------------------------
def _split_folder(prefs: str, split: str) -> str | None:
    """The `split` cache of a preference folder; None where there is none, or an empty `validation/` (said)."""
    from schooner.tokenize import TokenCache

    from ._evaluate import empty_split

    path = os.path.join(prefs, split)
    if not os.path.exists(os.path.join(path, "manifest.json")):
        return None
    if split == "validation" and TokenCache.open(path).num_documents == 0:
        logger.warning(empty_split(path))
        return None
    return path


def score_pairs(model: Any, dataset: Any, batch_size: int) -> dict[str, np.ndarray]:
    """Every pair's `{chosen,rejected}_{logps,count}` (float64 [num_pairs]) under `model`, in cache order."""
    import equinox as eqx

    fn = eqx.filter_jit(sequence_logps)
    out = {f"{r}_{k}": np.zeros(dataset.num_pairs) for r in _ROLES for k in ("logps", "count")}
    for start in range(0, dataset.num_pairs, batch_size):
        idx = np.arange(start, min(start + batch_size, dataset.num_pairs))
        b = dataset.pairs(np.concatenate([idx, np.repeat(idx[:1], batch_size - idx.size)]))  # fixed shape
        for r in _ROLES:
            s, c = fn(model, b[f"{r}_tokens"], b[f"{r}_segment_ids"], b[f"{r}_loss_mask"])
            out[f"{r}_logps"][idx] = np.asarray(s, np.float64)[: idx.size]
            out[f"{r}_count"][idx] = np.asarray(c, np.float64)[: idx.size]
    return out


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


def load_model_from(path: str, step: int | None = None) -> tuple[Any, str]:
    """`(model, folder)` of a run folder (latest or `step`), a checkpoint folder or a Hugging Face folder."""
    from schooner.model import import_hf, load_model

    from ._init import resolve_source

    kind, folder = resolve_source(path, step)
    model = load_model(folder)[0] if kind == "schooner" else import_hf(folder)[0]
    return model, folder


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

    from ._init import InitialCheckpoint, pin_initialize_from

    if reference is None or isinstance(reference, StepHandle | InitialCheckpoint):
        return reference, step
    path = os.fspath(reference).rstrip("/")
    if not os.path.exists(os.path.join(path, "reference.json")):
        return pin_initialize_from(path, step)
    if step is not None:
        raise cached_reference_with_step(path, step)
    files = [f"{path}/reference.json", *sorted(glob.glob(glob.escape(path) + "/*.npz"))]
    return InitialCheckpoint(path, InputFiles(files)), None


def cached_reference_with_step(path: str, step: int) -> ValueError:
    """The error for a `reference_step` given with a `reference_logprobs` output as the reference."""
    return ValueError(
        f"dpo: reference_step={step} names a checkpoint of a live reference run, but {path!r} is a "
        "reference_logprobs output; leave reference_step out"
    )


def _run_reference(config: ReferenceConfig, output_path: str) -> dict:
    from schooner.tokenize import PreferenceDataset

    model, folder = load_model_from(str(config.model), config.step)
    summary: dict[str, Any] = {"model": folder, "seq_len": config.seq_len, "splits": {}}
    for split in ("train", "validation"):
        cache = _split_folder(config.preferences, split)
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
    with open(os.path.join(output_path, "reference.json"), "w") as f:
        json.dump(summary, f, indent=1)
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
    from ._init import pin_initialize_from

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


class WithReference:
    """A `PreferenceDataset` whose batches also carry the reference's `ref_{chosen,rejected}_{logps,count}`."""

    def __init__(self, dataset: Any, reference: Mapping[str, np.ndarray]) -> None:
        self.dataset, self.seq_len = dataset, dataset.seq_len
        self.reference = {k: np.asarray(v, np.float32) for k, v in reference.items()}
        self.starts_at_reference = False
        """The run's policy starts as the reference model: step 0's batch says so (`ref_is_policy`)."""

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        return with_ref_is_policy(self.add(self.dataset.batch(step, batch_size, rows)), self, step)

    def add(self, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idx = b.pop("pair_index")
        return b | {f"ref_{k}": v[idx] for k, v in self.reference.items()}


def with_ref_is_policy(b: dict[str, Any], data: Any, step: int) -> dict[str, Any]:
    """`b` with `ref_is_policy` (bool [B]): True at step 0 of a run whose policy starts as the reference."""
    n = b["chosen_tokens"].shape[0]
    return b | {"ref_is_policy": np.full(n, bool(data.starts_at_reference and step == 0))}


def read_reference(folder: str, split: str, dataset: Any, seq_len: int) -> dict[str, np.ndarray]:
    """A `reference_logprobs` split, checked against the preference cache and the run's `seq_len`."""
    with open(os.path.join(folder, "reference.json")) as f:
        info = json.load(f)
    meta = info["splits"].get(split)
    if meta is None:
        raise FileNotFoundError(
            f"reference {folder!r} has no {split} split; it scored {sorted(info['splits'])}"
        )
    problems = []
    if info["seq_len"] != seq_len:
        problems.append(f"seq_len {info['seq_len']} (this run: {seq_len})")
    if meta["pairs"] != dataset.num_pairs:
        problems.append(f"{meta['pairs']} pairs (the cache has {dataset.num_pairs})")
    if meta["tokenizer_fingerprint"] != dataset.tokenizer_fingerprint:
        problems.append("another tokenizer")
    if problems:
        raise ValueError(
            f"reference {folder!r} does not belong to {dataset.cache.path!r}: "
            + ", ".join(problems)
            + "; compute it with reference_logprobs on these preferences and seq_len"
        )
    with np.load(os.path.join(folder, f"{split}.npz")) as z:
        return {k: z[k] for k in z.files}


# -- the trainer ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DpoConfig:
    """Config of the `dpo` step (see `dpo` for the fields)."""

    model: Any
    initialize_from: Any
    reference: Any
    """A `reference_logprobs` step or folder, or a model (step, run, checkpoint or HF folder): live."""
    datasets: list
    """`[{"input": preferences, "weight": 1.0}]` (one preference step, in `train_lm`'s shape)."""
    beta: float
    loss_type: str
    label_smoothing: float
    optimizer: OptimizerConfig
    batch_size: int
    seq_len: int
    num_train_steps: int
    seed: int = 0
    eval_every: int | None = None
    microbatches: int = 1
    compute_dtype: str | None = None
    tokenizer: Any = None
    initialize_from_step: int | None = None
    reference_step: int | None = None
    """A live reference run's checkpoint step (None: its latest)."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = runtime_field(default_factory=CheckpointConfig)
    trackers: TrackerConfig = runtime_field(default_factory=TrackerConfig)
    name: str = "dpo"

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"dpo: loss_type must be one of {LOSS_TYPES}, got loss_type={self.loss_type!r}")
        for f, rule in (("beta", "> 0"), ("label_smoothing", "in [0, 0.5)")):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):  # a string from YAML, True, None
                raise ValueError(f"dpo: {f} must be a number {rule}, got {f}={v!r} ({type(v).__name__})")
        if not self.beta > 0:
            raise ValueError(f"dpo: beta must be > 0, got beta={self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"dpo: label_smoothing must be in [0, 0.5), got {self.label_smoothing!r}")


def _train_config(config: DpoConfig, output_path: str, preferences: str) -> Any:
    from ._config import DataConfig, TrainConfig
    from .steps import shared_run_fields

    return TrainConfig(
        data=DataConfig({os.path.join(preferences, "train"): 1.0}, seq_len=config.seq_len, validation={}),
        output_path=output_path,
        batch_size=config.batch_size,
        initialize_from=str(config.initialize_from),
        **shared_run_fields(config),
    )


def _run_dpo(config: DpoConfig, output_path: str) -> dict:
    from ._run_info import RunLog, config_to_json, package_versions

    preferences = config.datasets[0]["input"]
    tc = _train_config(config, output_path, preferences)
    os.makedirs(output_path, exist_ok=True)
    logs = RunLog(output_path)
    try:
        from ._dpo_run import DpoRun

        summary = DpoRun(tc, config, str(config.reference), preferences).run()
    finally:
        logs.close()
    return {"summary": summary, "config": config_to_json(tc), "versions": package_versions()}


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

    Logs `train/loss`, `train/rewards/{chosen,rejected,accuracies,margins}`, `train/logps/{chosen,rejected}`
    and the same under `eval/` on the validation pairs.
    """
    from ._init import pin_initialize_from
    from .steps import initial_model_config

    if model is None:
        model = initial_model_config(initialize_from, initialize_from_step, who=f"dpo({name!r})")
    initialize_from, initialize_from_step = pin_initialize_from(initialize_from, initialize_from_step)
    reference, reference_step = pin_reference(reference, reference_step)
    config = DpoConfig(
        model=model,
        initialize_from=initialize_from,
        reference=reference,
        datasets=[{"input": preferences, "weight": 1.0}],
        beta=float(beta),
        loss_type=loss_type,
        label_smoothing=float(label_smoothing),
        optimizer=optimizer
        if optimizer is not None
        else AdamConfig(
            learning_rate=5e-6, weight_decay=0.0, warmup=0.1, schedule="linear", min_lr_ratio=0.0
        ),
        batch_size=batch_size,
        seq_len=seq_len,
        num_train_steps=num_train_steps,
        seed=seed,
        eval_every=eval_every,
        microbatches=microbatches,
        compute_dtype=compute_dtype,
        tokenizer=tokenizer,
        initialize_from_step=initialize_from_step,
        reference_step=reference_step,
        mesh=mesh or MeshConfig(),
        checkpoint=CheckpointConfig(every=checkpoint_every, keep_last=keep_checkpoints),
        trackers=trackers or TrackerConfig(),
        name=name,
    )
    _train_config(config, "<not yet known>", "<preferences>")  # validate now
    if resources is not None:  # glibc's huge-page malloc tunable, as train_lm's jobs get it
        from ._malloc import malloc_env

        resources = dataclasses.replace(resources, env={**resources.env, **malloc_env(resources.env)})
    return make_step(
        name,
        _run_dpo,
        config,
        version=DPO_VERSION,
        resources=resources,
        resumable=True,
        description=f"DPO ({loss_type}, beta={beta}) for {num_train_steps} steps",
    )
