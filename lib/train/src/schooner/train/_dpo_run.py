"""DPO as a configuration of the trainer: the `Dpo` objective config (the `objective` of a `dpo` step's
`TrainerConfig`) and what its `setup` builds: preference batches carrying the reference's log-probs, the
pairwise loss (`_dpo.make_dpo_loss`) and a held-out evaluation over every validation pair.

The reference's log-probs come from a `reference_logprobs` step (read by pair index), or, when `reference`
is a model, from a frozen copy of it scored inside the jitted train step (`Objective.frozen` and
`prepare`; and on each evaluation batch): no cached step, a second model in memory, one more forward pass
per step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checkpoint import latest_checkpoint
from ._config import TrainerConfig, check_run
from ._dpo import LOSS_TYPES, ROLES, make_dpo_loss, sequence_logps
from ._lm import resolve_model_config
from ._objective import Objective, Setup

logger = logging.getLogger("schooner.train")


@dataclass(frozen=True)
class Dpo:
    """Direct preference optimisation (or IPO / hinge) against a reference: the `objective` of a
    `TrainerConfig` whose `datasets` is one `tokenized_preferences` step or folder (see `dpo`).

    Example:
        >>> Dpo(reference="runs/sft", beta=0.1).loss_type
        'sigmoid'
    """

    reference: Any
    """A `reference_logprobs` step or folder (cached log-probs), or a model (a training step, a run,
    checkpoint or Hugging Face folder): a live reference scored in the train step."""
    beta: float = 0.1
    """The KL strength (TRL's default 0.1)."""
    loss_type: str = "sigmoid"
    """"sigmoid" (DPO), "hinge" (SLiC) or "ipo"."""
    label_smoothing: float = 0.0
    """Conservative DPO's eps (only the sigmoid loss changes with it)."""
    reference_step: int | None = None
    """A live reference run's checkpoint step (None: its latest)."""

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

    def setup(self, config: TrainerConfig, output_path: str) -> Setup:
        """Preference batches with the reference's log-probs, the DPO loss, the held-out evaluator."""
        import jax

        from schooner.tokenize import CacheError, PreferenceDataset, TokenCache, load_tokenizer

        from ._trainer import place_params

        if len(config.datasets) != 1:
            raise ValueError(
                f"dpo: datasets must be one preference step or folder, got {len(config.datasets)}"
            )
        preferences = os.fspath(config.datasets[0][0])
        reference = os.fspath(self.reference)
        try:
            train_cache = TokenCache.open(os.path.join(preferences, "train"))
        except CacheError as e:  # named by its field: the dpo step's `preferences`
            raise CacheError(f"TrainerConfig.datasets[0] (dpo's preferences): {e}") from e
        model_config = resolve_model_config(config, train_cache.vocab_size)
        check_run(dataclasses.replace(config, model=model_config), num_devices=len(jax.devices()))
        tokenizer = load_tokenizer(os.fspath(config.tokenizer)) if config.tokenizer else None
        fp = tokenizer or train_cache.tokenizer_fingerprint
        cached = is_cached_reference(reference)
        if cached and self.reference_step is not None:
            raise cached_reference_with_step(reference, self.reference_step)
        ref_model = ref_folder = None
        if not cached:
            ref_model, ref_folder = load_model_from(reference, self.reference_step)
            vocab = ref_model.config.vocab_size
            if vocab != model_config.vocab_size:
                raise ValueError(
                    f"dpo: the reference model {ref_folder!r} has vocab_size {vocab}, the policy "
                    f"{model_config.vocab_size}; use a reference with the policy's vocabulary"
                )
            logger.info(f"live reference model {ref_folder}: scored in the train step")
            ref_model, _ = place_params(ref_model, config)  # placed like the policy's weights
        datasets: dict[str, WithReference | LiveReference] = {}
        for split in ("train", "validation"):
            folder = split_folder(preferences, split)
            if folder is None:
                continue
            ds = PreferenceDataset(
                folder, config.seq_len, config.seed, tokenizer=fp, vocab_size=model_config.vocab_size
            )
            if ref_model is not None:
                datasets[split] = LiveReference(ds, ref_model)
            else:
                datasets[split] = WithReference(ds, read_reference(reference, split, ds, config.seq_len))
        # A fresh run whose policy starts from the reference's own checkpoint: at step 0 they are one model.
        if config.initialize_from is not None and latest_checkpoint(output_path) is None:
            from ._init import resolve_source

            start = resolve_source(os.fspath(config.initialize_from), config.initialize_from_step)[1]
            if ref_folder is None:
                with open(os.path.join(reference, "reference.json")) as f:
                    ref_folder = json.load(f)["model"]
            same = _same_folder(ref_folder, start)
            datasets["train"].starts_at_reference = same
            if same:
                logger.info(
                    "the policy starts as the reference: step 1 takes the reference's log-probs as its own"
                )
        loss = make_dpo_loss(beta=self.beta, loss_type=self.loss_type, label_smoothing=self.label_smoothing)
        evaluators = []
        if "validation" in datasets:
            evaluators.append(DpoEvaluator(datasets["validation"], loss, min(config.batch_sizes)))
        else:
            logger.warning(f"{preferences!r} has no validation/ preference cache: no held-out evaluation")
        special_ids = {k: train_cache.manifest[k] for k in ("bos_id", "eos_id") if k in train_cache.manifest}
        return Setup(
            model_config=model_config,
            objective=Objective(
                loss=loss,
                frozen=ref_model,
                prepare=reference_logps if ref_model is not None else None,
                sequences_per_row=2,  # a pair is two sequences
                constrain_batch=False,  # the batch's [B] arrays are placed by the data loader
            ),
            data=datasets["train"],
            evaluators=evaluators,
            metadata={
                "tokenizer_fingerprint": train_cache.tokenizer_fingerprint,
                "tokenizer_special_ids": special_ids,
            },
        )


def split_folder(prefs: str, split: str) -> str | None:
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


def load_model_from(path: str, step: int | None = None) -> tuple[Any, str]:
    """`(model, folder)` of a run folder (latest or `step`), a checkpoint folder or a Hugging Face folder."""
    from schooner.model import import_hf, load_model

    from ._init import resolve_source

    kind, folder = resolve_source(path, step)
    model = load_model(folder)[0] if kind == "schooner" else import_hf(folder)[0]
    return model, folder


def cached_reference_with_step(path: str, step: int) -> ValueError:
    """The error for a `reference_step` given with a `reference_logprobs` output as the reference."""
    return ValueError(
        f"dpo: reference_step={step} names a checkpoint of a live reference run, but {path!r} is a "
        "reference_logprobs output; leave reference_step out"
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


def is_cached_reference(folder: str) -> bool:
    """Whether `folder` is a `reference_logprobs` output (else it is a model: a live reference)."""
    return os.path.exists(os.path.join(folder, "reference.json"))


def reference_logps(reference: Any, b: dict) -> dict[str, Any]:
    """`ref_{chosen,rejected}_{logps,count}` [B] of a preference batch under the frozen `reference` model
    (what `WithReference` reads from a `reference_logprobs` step); no gradient flows into it."""
    import jax
    import jax.numpy as jnp

    both = {
        k: jnp.concatenate([b[f"chosen_{k}"], b[f"rejected_{k}"]])
        for k in ("tokens", "segment_ids", "loss_mask")
    }
    logps, counts = jax.lax.stop_gradient(
        sequence_logps(reference, both["tokens"], both["segment_ids"], both["loss_mask"])
    )
    n = b["chosen_tokens"].shape[0]
    out = {}
    for i, role in enumerate(ROLES):
        out[f"ref_{role}_logps"] = logps[i * n : (i + 1) * n]
        out[f"ref_{role}_count"] = counts[i * n : (i + 1) * n]
    return out


class LiveReference:
    """A `PreferenceDataset` for DPO with a live reference model. Training batches go out without reference
    log-probs (the train step computes them); `add` scores an evaluation batch with the reference."""

    def __init__(self, dataset: Any, model: Any) -> None:
        import equinox as eqx

        self.dataset, self.seq_len, self.model = dataset, dataset.seq_len, model
        self._score = eqx.filter_jit(reference_logps)
        self.starts_at_reference = False
        """The run's policy starts as the reference model: step 0's batch says so (`ref_is_policy`)."""

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        b = self.dataset.batch(step, batch_size, rows)
        del b["pair_index"]
        return with_ref_is_policy(b, self, step)

    def add(self, b: dict[str, np.ndarray]) -> dict[str, Any]:
        del b["pair_index"]
        return b | self._score(self.model, b)


class DpoEvaluator:
    """DPO loss, rewards and accuracy of a model on every pair of a validation preference cache."""

    def __init__(self, data: WithReference | LiveReference, objective: Any, batch_size: int) -> None:
        import equinox as eqx

        self.data, self.batch_size = data, batch_size
        self.fn = eqx.filter_jit(lambda m, b: objective(m, b, None)[1][0])

    def __call__(self, model: Any) -> dict[str, float]:
        n = self.data.dataset.num_pairs
        sums: dict[str, float] = {}
        for start in range(0, n, self.batch_size):
            idx = np.arange(start, min(start + self.batch_size, n))
            b = self.data.add(self.data.dataset.pairs(idx))
            m = {k: float(v) for k, v in self.fn(model, b).items()}
            for k, v in m.items():
                if k != "token_count":
                    sums[k] = sums.get(k, 0.0) + v * idx.size
        return {f"eval/{k}": v / n for k, v in sums.items()}


def _same_folder(a: str, b: str) -> bool:
    """Whether two checkpoint folders are one (local paths compared resolved, others as written)."""
    norm = lambda p: os.path.realpath(p) if "://" not in p else p.rstrip("/")  # noqa: E731
    return norm(os.fspath(a)) == norm(os.fspath(b))
