"""Language modeling as a configuration of the trainer: pretraining, and SFT on chat caches.

`LanguageModeling` is the default `objective` of a `TrainerConfig`. Its `setup` opens the training caches
as a `schooner.tokenize.MixtureDataset`, fits the model's vocabulary to their tokenizer, and builds one
evaluator per kind of validation cache. The loss is next-token cross-entropy (with the run's z-loss),
weighted by each batch's `loss_mask` where the batch has one: a chat cache
(`schooner.tokenize.steps.tokenized_chat`) declares in its manifest that it carries per-token masks
(1 on assistant tokens), its rows are packed whole with that mask, and its validation cache is scored
on those tokens (`ChatEvaluator`); a text cache is a stream whose every token is a target.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ._config import TrainerConfig, check_run
from ._objective import Objective, Setup

logger = logging.getLogger("schooner.train")


def resolve_model_config(config: Any, cache_vocab: int) -> Any:
    """The model config the run trains: vocab fitted to the caches when asked, compute dtype applied."""
    model = config.model
    if config.fit_vocab and model.vocab_size < cache_vocab:
        logger.info(f"model vocab_size {model.vocab_size} -> {cache_vocab} (the caches' tokenizer)")
        model = dataclasses.replace(model, vocab_size=cache_vocab)
    if config.compute_dtype is not None:
        model = dataclasses.replace(model, compute_dtype=config.compute_dtype)
    return model


def lm_loss(z_loss_weight: float) -> Any:
    """`loss(model, batch, key)`: next-token cross-entropy (and z-loss) over the targets a batch's
    `loss_mask` marks (1 where the token is a target, the data loader's convention; none: every token)."""
    from schooner.model import loss_and_balance, target_mask_to_loss_mask

    def loss(model: Any, mb: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, tuple]:
        mask = mb.get("loss_mask")
        return loss_and_balance(
            model,
            mb["tokens"],
            segment_ids=mb.get("segment_ids"),
            loss_mask=None if mask is None else target_mask_to_loss_mask(mask),
            z_loss_weight=z_loss_weight,
            key=key,
        )

    return loss


@dataclass(frozen=True)
class LanguageModeling:
    """Next-token prediction on a mixture of token caches (the `objective` None stands for)."""

    def setup(self, config: TrainerConfig, output_path: str) -> Setup:
        """The run's data, model config, loss and evaluators (see the module docstring)."""
        from schooner.tokenize import MixtureDataset, load_tokenizer

        from ._evaluate import default_validation

        components = {os.fspath(x): w for x, w in config.datasets}
        caches = {p: _open(p, f"datasets[{i}]") for i, p in enumerate(components)}
        validation = {k: os.fspath(v) for k, v in (config.validation or {}).items()}
        fields = {k: f"validation[{k!r}]" for k in validation}
        if config.validation is None:
            validation = default_validation(components)
        evals = {k: os.fspath(v) for k, v in (config.evals or {}).items()}
        validation |= evals
        fields |= {k: f"evals[{k!r}]" for k in evals}
        val_caches = {p: _open(p, fields.get(k, f"validation[{k!r}]")) for k, p in validation.items()}
        vocab_sizes = {c.path: c.vocab_size for c in [*caches.values(), *val_caches.values()]}
        model_config = resolve_model_config(config, max(vocab_sizes.values()))
        check_run(
            dataclasses.replace(config, model=model_config),
            num_devices=len(jax.devices()),
            cache_vocab_sizes=vocab_sizes,
        )
        # Every cache (training and validation) must come from one tokenizer: the run's `tokenizer` when
        # given, else the one the first training cache was built with. Checkpoints record its fingerprint.
        tokenizer = load_tokenizer(os.fspath(config.tokenizer)) if config.tokenizer else None
        first = next(iter(caches.values()))
        schedule = config.weight_schedule
        data = MixtureDataset(
            components,
            seq_len=config.seq_len,
            seed=config.seed,
            weight_schedule=None
            if schedule is None
            else [(s, {os.fspath(k): w for k, w in ws.items()}) for s, ws in schedule],
            block_size=config.block_size,
            # None: the components are compared with the first, fingerprint and special ids (a fingerprint
            # string says nothing of the special tokens)
            tokenizer=tokenizer,
            vocab_size=model_config.vocab_size,
            # only when asked: the same batches, held in memory (a tokenize without the option still works)
            **({"in_memory_bytes": int(config.data_in_memory_bytes)} if config.data_in_memory_bytes else {}),
        )
        if config.data_in_memory_bytes:
            missed = "; ".join(f"{path} needs {size / 2**20:.1f} MiB" for path, size in data.not_held)
            logger.info(
                f"training tokens held in memory: {data.held_bytes / 2**20:.1f} MiB of data_in_memory_bytes="
                f"{config.data_in_memory_bytes}" + (f"; not held, read per batch: {missed}" if missed else "")
            )
        for cache in val_caches.values():
            cache.check_tokenizer(tokenizer or first.tokenizer_fingerprint)
            if tokenizer is None:  # as above: the special ids too
                _check_special_ids(cache, first)
        # the BOS/EOS ids the training documents carry (evaluation refuses a tokenizer with others)
        special_ids = {k: first.manifest[k] for k in ("bos_id", "eos_id") if k in first.manifest}
        fingerprint = first.tokenizer_fingerprint
        evaluators = []
        if validation:
            evaluators.append(_evaluators(config, validation, model_config, fingerprint, components))
        return Setup(
            model_config=model_config,
            objective=Objective(loss=lm_loss(float(config.z_loss_weight))),
            data=data,
            evaluators=evaluators,
            metadata={"tokenizer_fingerprint": fingerprint, "tokenizer_special_ids": special_ids},
        )


def _open(path: str, field: str) -> Any:
    """The token cache at `path`; an error names the config field that gave it."""
    from schooner.tokenize import CacheError, TokenCache

    try:
        return TokenCache.open(path)
    except CacheError as e:
        raise CacheError(f"TrainerConfig.{field}: {e}") from e


def _tokenizer_path(config: TrainerConfig, fingerprint: str, components: dict[str, float]) -> str | None:
    """The run's tokenizer (file or folder): the given one, else a `tokenizer.json` next to a training
    cache that matches the caches' fingerprint."""
    from schooner.tokenize import load_tokenizer

    from ._evaluate import find_tokenizer_file

    if config.tokenizer:
        return os.fspath(config.tokenizer)
    for p in components:
        found = find_tokenizer_file(p)
        if found and load_tokenizer(found).fingerprint == fingerprint:
            return found
    return None


def _evaluators(
    config: TrainerConfig, validation: dict[str, str], model_config: Any, fingerprint: str, components: dict
) -> Any:
    """Loss and bits-per-byte on every validation cache: chat caches on their assistant tokens, packed as in
    training (`ChatEvaluator`); text caches as streams (`Evaluator`); and their averages."""
    from schooner.tokenize import TokenCache, load_tokenizer

    from ._evaluate import ChatEvaluator, Evaluator, Evaluators
    from ._trainer import batch_sharding

    tok_path = _tokenizer_path(config, fingerprint, components)
    byte_lengths = text_tokenizer = None
    if tok_path is not None:
        # its decode counts the bytes of each document's unscored first token (as schooner.eval does)
        text_tokenizer = load_tokenizer(tok_path)
        byte_lengths = text_tokenizer.token_byte_lengths()
        if len(byte_lengths) < model_config.vocab_size:
            byte_lengths = np.pad(byte_lengths, (0, model_config.vocab_size - len(byte_lengths)))
    else:
        logger.warning("no tokenizer found for the caches: bits-per-byte is not reported (pass tokenizer=)")
    dp = config.mesh.data_parallel_size(len(jax.devices()))
    eval_bs = max(dp, math.ceil(min(config.batch_sizes) / dp) * dp)
    chat = {k: v for k, v in validation.items() if TokenCache.open(v).has_loss_mask}
    plain = {k: v for k, v in validation.items() if k not in chat}
    kinds: list[tuple[type[Evaluator] | type[ChatEvaluator], dict[str, str]]] = [
        (Evaluator, plain),
        (ChatEvaluator, chat),
    ]
    sharding = batch_sharding(config)
    parts = [
        cls(
            caches,
            seq_len=config.seq_len,
            batch_size=eval_bs,
            max_tokens=config.eval_max_tokens,
            byte_lengths=byte_lengths,
            sharding=sharding,
            tokenizer=fingerprint,
            **({"text_tokenizer": text_tokenizer} if cls is Evaluator else {}),
        )
        for cls, caches in kinds
        if caches
    ]
    return Evaluators(parts)


def _check_special_ids(cache: Any, first: Any) -> None:
    """Refuse a validation cache whose BOS or EOS id differs from the first training cache's (the same
    tokenizer.json with other special tokens: its documents end with another EOS). Manifests without the ids
    are accepted."""
    from schooner.tokenize import TokenizerMismatchError

    for key in ("bos_id", "eos_id"):
        if key in cache.manifest and key in first.manifest and cache.manifest[key] != first.manifest[key]:
            raise TokenizerMismatchError(
                f"validation cache {cache.path!r} was built with {key}={cache.manifest[key]} but training cache "
                f"{first.path!r} with {key}={first.manifest[key]} (the same tokenizer.json, other special tokens); "
                "rebuild the validation cache with the training caches' tokenizer"
            )
